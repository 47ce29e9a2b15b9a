"""``LocalEngine``: the ``local`` backend's single-device RL engine (actor, reference, sampler, optimizer).

It is the reference engine behind the ``local`` backend: training, log-probs, sampling and
checkpoints on one CPU or GPU with PyTorch and transformers, so verl's remote path can run and
be tested end to end without an external server. Synchronous and Ray-free; the backend runs it
inside a Ray actor (:mod:`.actor`).
"""

from __future__ import annotations

import copy
import os
import platform
import threading
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch
from tensordict import TensorDict

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.forwarder.mfu import measure_matmul_flops
from verl.remote_backend.results import BackendDevice, GenerateResult, LogProbResult, UpdateResult

from .checkpoint import CheckpointError, get_rng_state, set_rng_state, verify_checkpoint_dir, write_checkpoint_dir
from .config import EngineSettings
from .forward import DTYPE_BY_NAME, get_input_tensors, jagged_rows, packed_forward, row_slices, use_packed_rows
from .objective import to_actor_config, train_batch
from .optim import build_optimizer_and_scheduler
from .sampler import DecodeBatch, SampleRequest, SampleResult, SamplingParams, sample_batch

__all__ = ["LocalEngine"]

_MODEL_FILE = "model.safetensors"
_OPTIM_FILE = "optimizer.pt"
_STATE_FILE = "trainer_state.pt"
_HF_DIR = "huggingface"  # the Hugging Face export inside each checkpoint (verl's actor/huggingface/)


class LocalEngine:
    """Owns the trained model, its optimizer and LR schedule, an optional frozen
    reference model and the sampler's weight copy, all on one device.

    Thread-safe: training-side calls serialise on one lock, sampling on another. With
    ``share_sampler_weights`` and equal dtypes (:attr:`shares_sampler_weights`) the sampler
    module reads the trained parameters in place (no second copy; the caller must not sample
    while training: the actor drains its decode batch first); otherwise it decodes from its
    own weight copy, refreshed only by :meth:`sync_sampler_weights`, and may run while the
    actor trains. The device's matmul rate is measured once at start (:meth:`device_report`).
    """

    def __init__(self, settings: EngineSettings) -> None:
        from transformers import AutoTokenizer

        self.settings = settings
        cfg = settings.backend
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("remote_backend.local.device=cuda but no CUDA device is visible; use device=cpu")
        self.device = torch.device("cuda", torch.cuda.current_device()) if cfg.device == "cuda" else torch.device("cpu")
        self.dtype = DTYPE_BY_NAME[cfg.dtype]
        self.autocast_dtype = DTYPE_BY_NAME[cfg.autocast_dtype] if cfg.autocast_dtype else None

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(
                settings.tokenizer_path or settings.model_path, trust_remote_code=settings.trust_remote_code
            )
        except Exception as exc:
            raise ConfigError(
                f"actor_rollout_ref.model.path={settings.model_path!r}: cannot load its tokenizer ({exc})"
            ) from exc
        self.model = self._load_model(self.dtype)
        self.model.train()
        self.ref_model = self._frozen(self._load_model(self.dtype)) if settings.need_ref else None
        sampler_dtype = DTYPE_BY_NAME[cfg.sampler_dtype] if cfg.sampler_dtype else self.dtype
        self.shares_sampler_weights = bool(cfg.share_sampler_weights) and sampler_dtype == self.dtype
        if self.shares_sampler_weights:
            # A second module object over the same Parameter objects: its own eval() flag, no copy.
            # requires_grad stays on (they are the trainer's); the sampler runs under no_grad.
            shared = {id(t): t for t in list(self.model.parameters()) + list(self.model.buffers())}
            self.sampler_model = copy.deepcopy(self.model, memo=shared).eval()
        else:
            self.sampler_model = self._frozen(copy.deepcopy(self.model).to(sampler_dtype))
        self.peak_flops = measure_matmul_flops(self.device, self.dtype)
        self._peak_remeasured = False

        self.optimizer, self.lr_scheduler = build_optimizer_and_scheduler(self.model, settings)

        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        eos = [self.tokenizer.eos_token_id] + (list(gen_eos) if isinstance(gen_eos, (list, tuple)) else [gen_eos])
        self.eos_token_ids = sorted({int(e) for e in eos if e is not None})
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (self.eos_token_ids or [0])[0])
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.max_model_len = int(cfg.max_model_len or getattr(self.model.config, "max_position_embeddings", 0) or 2048)
        self.generator = torch.Generator(device=self.device).manual_seed(int(cfg.seed))

        self.policy_version = 0
        self.optimizer_steps = 0
        self.global_step = 0
        self._train_lock = threading.RLock()
        self._sample_lock = threading.RLock()

    # ------------------------------------------------------------------ setup
    def _load_model(self, dtype: torch.dtype) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        path = self.settings.model_path
        try:
            model = AutoModelForCausalLM.from_pretrained(
                path,
                dtype=dtype,
                attn_implementation=self.settings.backend.attn_implementation,
                trust_remote_code=self.settings.trust_remote_code,
            )
        except Exception as exc:
            raise ConfigError(
                f"actor_rollout_ref.model.path={path!r} is not a loadable Hugging Face causal LM: {exc}"
            ) from exc
        use_packed_rows(model)
        return model.to(self.device)

    @staticmethod
    def _frozen(model: torch.nn.Module) -> torch.nn.Module:
        model.eval()
        model.requires_grad_(False)
        return model

    # ------------------------------------------------------------------ info
    def device_report(self) -> BackendDevice:
        """The ``BackendDevice`` of the device this engine computes on (for MFU); ``peak_flops`` is
        the dense matmul rate in the model's dtype (:func:`measure_matmul_flops`), the larger of
        the measurements at start and before the first training call (:meth:`_remeasure_peak`)."""
        if self.device.type == "cuda":
            name = torch.cuda.get_device_name(self.device)
        else:
            name = platform.processor() or platform.machine() or None
        peak = float(self.peak_flops) if np.isfinite(self.peak_flops) and self.peak_flops > 0 else None
        return BackendDevice(self.device.type, 1, peak, name)

    def _remeasure_peak(self) -> None:
        """Measure the matmul rate again before the first ``log_probs``/``update_actor`` and keep
        the larger of the two. At start the job's other processes (Ray workers, the rollout server,
        agent-loop workers) import torch and verl on the same CPU cores, so the start-up figure can
        read low and every MFU after it high; the first training call comes when they wait on it.
        Caller holds the train lock."""
        if self._peak_remeasured:
            return
        self._peak_remeasured = True
        self.peak_flops = max(self.peak_flops, measure_matmul_flops(self.device, self.dtype))

    def info(self) -> dict[str, Any]:
        """Small status dict: model, device, counters, limits (used by the client and tests)."""
        return {
            "model_path": self.settings.model_path,
            "device": self.device_report().to_dict(),
            "policy_version": self.policy_version,
            "optimizer_steps": self.optimizer_steps,
            "global_step": self.global_step,
            "has_ref": self.ref_model is not None,
            "max_model_len": self.max_model_len,
            "vocab_size": self.vocab_size,
            "eos_token_ids": list(self.eos_token_ids),
            "pad_token_id": self.pad_token_id,
            "pid": os.getpid(),
        }

    # ------------------------------------------------------------------ log-probs
    def log_probs(
        self,
        data: Union[TensorDict, dict],
        *,
        ref: bool = False,
        temperature: Union[float, torch.Tensor] = 1.0,
        calculate_entropy: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Forward-only per-token log-probs of every token of the batch.

        Args:
            data: ``input_ids`` (NJT ``[B, j]``) and optionally ``position_ids`` (same offsets).
            ref: use the frozen reference model (needs ``need_ref``).
            temperature: scalar or per-row ``[B]`` logits divisor.
            calculate_entropy: also return per-token entropy.

        Returns:
            ``{"log_probs": float32 [T], "entropy": float32 [T] (when asked)}`` on
            CPU, packed in ``input_ids.values()`` order; slot t = log p(token t+1),
            last slot of each row 0. Micro-batched by
            ``rollout.log_prob_micro_batch_size_per_gpu`` / ``log_prob_max_token_len_per_gpu``.
        """
        input_ids, position_ids = get_input_tensors(data)
        if ref and self.ref_model is None:
            raise RuntimeError(
                "compute_log_prob(ref=True) but the local backend has no reference model: it is built only when "
                "actor_rollout_ref.actor.use_kl_loss=true or algorithm.use_kl_in_reward=true"
            )
        self._check_token_ids(input_ids.values())
        temp = torch.as_tensor(temperature, dtype=torch.float32)
        s = self.settings
        slices = row_slices(
            input_ids.offsets().diff(),
            micro_batch_size=s.log_prob_micro_batch_size,
            max_token_len=s.log_prob_max_token_len if s.log_prob_use_dynamic_bsz else None,
        )
        with self._train_lock, torch.no_grad():
            self._remeasure_peak()
            model = self.ref_model if ref else self.model
            was_training = model.training
            model.eval()
            try:
                parts = [
                    packed_forward(
                        model,
                        jagged_rows(input_ids, rows),
                        None if position_ids is None else jagged_rows(position_ids, rows),
                        temperature=temp if temp.dim() == 0 else temp[rows],
                        calculate_entropy=calculate_entropy,
                        pad_token_id=self.pad_token_id,
                        autocast_dtype=self.autocast_dtype,
                        share_prefixes=s.share_prefixes,
                    )
                    for rows in slices
                ]
            finally:
                model.train(was_training)
        return {key: torch.cat([p[key] for p in parts]).float().cpu() for key in parts[0]}

    def compute_log_prob(
        self, data: TensorDict, *, ref: bool, calculate_entropy: bool, temperature: float
    ) -> LogProbResult:
        """The contract's ``compute_log_prob`` result (packed ``[T]`` log-probs, entropy when asked)."""
        out = self.log_probs(data, ref=ref, temperature=temperature, calculate_entropy=calculate_entropy)
        return LogProbResult(log_probs=out["log_probs"], entropy=out.get("entropy"), device=self.device_report())

    # ------------------------------------------------------------------ training
    def update_actor(self, data: TensorDict, actor_config: Any, *, temperature: float = 1.0) -> UpdateResult:
        """The contract's ``update_actor``: all mini-batches/epochs of the batch, then one LR-schedule step.

        Returns the loss, per-optimizer-step metric lists and tokens per sample of
        :func:`.objective.train_batch`, with the device it ran on.
        """
        cfg = to_actor_config(actor_config)
        with self._train_lock:
            self._remeasure_peak()
            out = train_batch(
                self.model,
                self.optimizer,
                self.lr_scheduler,
                self._to_device(data),
                cfg,
                grad_clip=self.settings.grad_clip,
                temperature=temperature,
                pad_token_id=self.pad_token_id,
                autocast_dtype=self.autocast_dtype,
                on_step=self._count_step,
            )
        return UpdateResult(
            metrics=out["metrics"],
            loss=out["loss"],
            global_token_num=out["global_token_num"],
            device=self.device_report(),
        )

    def _count_step(self) -> None:
        self.optimizer_steps += 1

    def _to_device(self, data: TensorDict) -> TensorDict:
        return data if self.device.type == "cpu" else data.to(self.device)

    # ------------------------------------------------------------------ sampling
    def make_request(self, prompt_ids: Sequence[int], sampling_params: dict[str, Any]) -> SampleRequest:
        """Validate one ``generate`` call before any work starts.

        ``max_tokens`` is capped at the context left after the prompt
        (``max_model_len - len(prompt)``); a missing ``max_tokens`` means "up to the context".

        Raises:
            ValueError: empty prompt, prompt longer than ``max_model_len``, token ids
                outside the vocabulary, or invalid sampling parameters (named).
        """
        prompt = tuple(int(t) for t in prompt_ids)
        if not prompt:
            raise ValueError("prompt_ids is empty; generate needs at least one prompt token")
        if len(prompt) > self.max_model_len:
            raise ValueError(
                f"prompt of {len(prompt)} tokens is longer than the model context ({self.max_model_len} tokens, "
                "remote_backend.local.max_model_len or the model's max_position_embeddings)"
            )
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_ids contains ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        room = self.max_model_len - len(prompt)
        params = SamplingParams.from_dict(sampling_params, default_max_tokens=room)
        if params.max_tokens > room:
            params = SamplingParams(**{**params.__dict__, "max_tokens": room})
        return SampleRequest(prompt, params)

    def sample(self, requests: Sequence[SampleRequest]) -> list[SampleResult]:
        """Decode validated requests (from :meth:`make_request`) together, with the sampler's weights."""
        with self._sample_lock:
            return sample_batch(
                self.sampler_model,
                requests,
                eos_token_ids=self.eos_token_ids,
                pad_token_id=self.pad_token_id,
                generator=self.generator,
            )

    def decode_batch(self) -> DecodeBatch:
        """An empty continuous batch on the sampler's weights; drive it with :meth:`decode_step`."""
        return DecodeBatch(
            self.sampler_model,
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            generator=self.generator,
        )

    def decode_step(
        self, batch: DecodeBatch, admit: Sequence[tuple[Any, SampleRequest]] = ()
    ) -> list[tuple[Any, SampleResult]]:
        """Add ``(key, request)`` rows to ``batch`` (prefill), decode one token for all live
        rows, and return the ``(key, result)`` pairs that finished."""
        with self._sample_lock:
            done = batch.admit(admit) if admit else []
            return done + batch.step()

    def generate(self, prompt_ids: Sequence[int], sampling_params: dict[str, Any]) -> GenerateResult:
        """One request, unbatched (the Ray actor batches concurrent calls instead)."""
        return self.sample([self.make_request(prompt_ids, sampling_params)])[0].to_result()

    def sync_sampler_weights(self) -> dict[str, Any]:
        """Copy the trained weights into the sampler (nothing to copy when shared); bump and
        return ``policy_version``."""
        with self._train_lock, self._sample_lock, torch.no_grad():
            src = dict(self.model.named_parameters())
            src.update(dict(self.model.named_buffers()))
            for name, dst in list(self.sampler_model.named_parameters()) + list(self.sampler_model.named_buffers()):
                if dst is not src[name]:
                    dst.copy_(src[name])
            self.policy_version += 1
            return {"policy_version": self.policy_version}

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str, step: Optional[int] = None) -> str:
        """Write model (safetensors), optimizer + LR schedule, RNG and counters atomically to ``path``.

        Files: ``model.safetensors``, ``config.json``, ``optimizer.pt``,
        ``trainer_state.pt``, ``huggingface/`` (config, weights, tokenizer: loads with
        ``from_pretrained``), ``manifest.json`` (step, sha256 of each file).
        Returns the absolute directory written.
        """
        from safetensors.torch import save_model

        with self._train_lock, self._sample_lock:
            step = self.global_step if step is None else int(step)
            optim_state = {"optimizer": self.optimizer.state_dict(), "lr_scheduler": self.lr_scheduler.state_dict()}
            state = {
                "global_step": step,
                "optimizer_steps": self.optimizer_steps,
                "policy_version": self.policy_version,
                "rng": get_rng_state(self.generator),
            }
            writers = {
                _MODEL_FILE: lambda f: save_model(self.model, f),
                "config.json": lambda f: self.model.config.to_json_file(f),
                _OPTIM_FILE: lambda f: torch.save(optim_state, f),
                _STATE_FILE: lambda f: torch.save(state, f),
                **self._huggingface_export_writers(),
            }
            needed = _tensor_bytes(self.model.state_dict()) + _tensor_bytes(optim_state)
            written = write_checkpoint_dir(path, step, writers, extra={"backend": "local"}, needed_bytes=needed)
            self.global_step = step
            return written

    def _huggingface_export_writers(self) -> dict[str, Any]:
        """``huggingface/``: config, generation config, tokenizer and the weights (a hard link to
        ``model.safetensors``, written first) - a folder ``AutoModelForCausalLM`` and ``AutoTokenizer``
        load as is, in the place verl's own checkpoints keep theirs (``actor/huggingface/``)."""
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            self.tokenizer.save_pretrained(tmp)
            tokenizer_files = {}
            for name in sorted(os.listdir(tmp)):
                with open(os.path.join(tmp, name), "rb") as fh:
                    tokenizer_files[name] = fh.read()

        def link_weights(target: str) -> None:
            source = os.path.join(os.path.dirname(os.path.dirname(target)), _MODEL_FILE)
            try:
                os.link(source, target)
            except OSError:  # a filesystem without hard links
                import shutil

                shutil.copyfile(source, target)

        def write_bytes(data: bytes):
            def write(target: str) -> None:
                with open(target, "wb") as fh:
                    fh.write(data)

            return write

        writers: dict[str, Any] = {
            f"{_HF_DIR}/{_MODEL_FILE}": link_weights,
            f"{_HF_DIR}/config.json": lambda f: self.model.config.to_json_file(f),
        }
        generation_config = getattr(self.model, "generation_config", None)
        if generation_config is not None:
            writers[f"{_HF_DIR}/generation_config.json"] = lambda f: generation_config.to_json_file(f)
        for name, data in tokenizer_files.items():
            writers[f"{_HF_DIR}/{name}"] = write_bytes(data)
        return writers

    def load_checkpoint(self, path: str, step: Optional[int] = None) -> dict[str, Any]:
        """Restore exactly what :meth:`save_checkpoint` wrote; the sampler gets the loaded weights.

        Raises:
            CheckpointError: missing directory/manifest/file, checksum mismatch, or another step.
        """
        from safetensors.torch import load_model

        manifest = verify_checkpoint_dir(path, step)
        with self._train_lock, self._sample_lock:
            try:
                load_model(self.model, os.path.join(path, _MODEL_FILE), strict=True, device=str(self.device))
                optim_state = torch.load(os.path.join(path, _OPTIM_FILE), weights_only=True, map_location=self.device)
                state = torch.load(os.path.join(path, _STATE_FILE), weights_only=True)
            except CheckpointError:
                raise
            except Exception as exc:
                raise CheckpointError(f"checkpoint {path} could not be loaded into this model: {exc}") from exc
            self.optimizer.load_state_dict(optim_state["optimizer"])
            self.lr_scheduler.load_state_dict(optim_state["lr_scheduler"])
            set_rng_state(state["rng"], self.generator)
            self.global_step = int(state["global_step"])
            self.optimizer_steps = int(state["optimizer_steps"])
            self.policy_version = int(state["policy_version"]) - 1
            self.sync_sampler_weights()
        return {"step": int(manifest["step"]), "policy_version": self.policy_version}

    # ------------------------------------------------------------------ helpers
    def _check_token_ids(self, ids: torch.Tensor) -> None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(f"input_ids contains ids outside the vocabulary [0, {self.vocab_size})")


def _tensor_bytes(state: Any) -> int:
    """Bytes of the tensors in a (nested) state dict: what saving it writes, give or take headers."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_tensor_bytes(v) for v in state)
    return 0
