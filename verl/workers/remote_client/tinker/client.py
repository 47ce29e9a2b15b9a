"""The ``tinker`` remote backend: verl's RemoteBackend on the Tinker API (``tinker`` SDK 0.25.0).

Tested against skyrl 0.4.0's open-source Tinker-API server on CPU (``--backend jax``); the
same SDK calls serve hosted Tinker (see the README's Tinker section for what is unverified there).

=====================  ==========================================================================
RemoteBackend          Tinker SDK calls
=====================  ==========================================================================
from_config            ``ServiceClient(base_url, api_key)``; owner: ``create_lora_training_client``
                       (rank = ``model.lora_rank``); re-attached: a ``TrainingClient`` on the same
                       ``model_id`` (and sampling clients), nothing created
compute_log_prob       actor: ``TrainingClient.forward`` (``cross_entropy`` inputs, log-probs only);
                       reference (``ref`` / ``no_lora_adapter``): the base model's sampling client
                       ``compute_logprobs``
update_actor           per PPO mini-batch: ``forward_backward(datums, "ppo" | "importance_sampling",
                       clip thresholds)`` + ``optim_step(AdamParams from actor.optim)``
generate               ``SamplingClient.sample`` of the latest sampler weights, stop at EOS
update_weights         ``save_weights_for_sampler("verl-sampler-<time>")``; other processes find the
                       newest sampler checkpoint with ``RestClient.list_checkpoints`` (``wake_up``)
save_checkpoint        ``save_state("verl-step-<N>")`` (weights + optimizer), recorded in
                       ``<actor dir>/tinker_checkpoint.json``
load_checkpoint        ``load_state_with_optimizer`` on the still unused model (the server refuses a
                       load after any other request), then ``update_weights``
destroy                owner: unload the model (``/api/v1/unload_model``), stop a launched server
=====================  ==========================================================================

The SDK is synchronous-with-futures; every call runs on this backend's own thread pool, so the
caller's event loop never blocks. Nothing is retried here: the forwarder's guard decides
(idempotent reads only) and probes :meth:`TinkerBackend.health` while calls run.

This module is imported only by ``RemoteBackendRegistry.get("tinker")``; it is the only one
that imports ``tinker``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import secrets
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Optional

import tinker  # noqa: F401  (fails early with the registry's install hint)
from tinker import types as ttypes

from verl.remote_backend.base import RemoteBackend
from verl.remote_backend.errors import (
    BackendClosedError,
    BackendError,
    BackendTransportError,
    ConfigError,
    ResumeCheckpointError,
)
from verl.remote_backend.registry import RemoteBackendRegistry
from verl.remote_backend.reliability.server_process import ServerProcess
from verl.remote_backend.results import BackendDevice, GenerateResult, LogProbResult, UpdateResult
from verl.remote_backend.settings.loader import select
from verl.remote_backend.update_schedule import optimizer_step_rows, read_update_schedule
from verl.workers.remote_client.tinker import batch as tb
from verl.workers.remote_client.tinker.config import (
    SECRET_SETTINGS,
    TinkerConfig,
    adam_params,
    check_config,
    clip_thresholds,
    load_tinker_config,
    lora_settings,
    resolved_loss_fn,
)

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from tensordict import TensorDict

logger = logging.getLogger(__name__)

__all__ = ["TinkerBackend", "TinkerBackendError"]

CHECKPOINT_RECORD = "tinker_checkpoint.json"
SAMPLER_PREFIX = "verl-sampler-"
_POOL_THREADS = 64
# Request numbering of a re-attached training client: the server de-duplicates training requests by
# (model_id, seq_id) and every SDK TrainingClient numbers its own from 1, so a second client on the
# owner's model would be answered with the owner's old results (or refused with a 409). Each
# re-attached client numbers inside its own random block of 2**16 ids, above the owner's first block
# and inside the wire type (int32).
_ATTACHED_SEQ_BLOCK = 1 << 16
_ATTACHED_SEQ_BLOCKS = (1 << 31) // _ATTACHED_SEQ_BLOCK - 1


class TinkerBackendError(BackendError):
    """A Tinker call failed or answered something unusable; the message names the op and the server."""


class ConnectionLost(TinkerBackendError, BackendTransportError):
    """The server did not answer (transport failure): safe to re-send for idempotent reads."""


def _tensor(values: list, dtype: str) -> Any:
    return ttypes.TensorData(data=list(values), dtype=dtype, shape=[len(values)])


def _datum(row: tb.Row, *, advantages: Optional[list[float]] = None) -> Any:
    """``model_input = tokens[:-1]``; per-slot targets, weights, sampling log-probs, advantages."""
    toks = row.tokens
    inputs = {
        "target_tokens": _tensor(toks[1:], "int64"),
        "weights": _tensor(row.weights if advantages is not None else [1.0] * (len(toks) - 1), "float32"),
    }
    if advantages is not None:
        inputs["advantages"] = _tensor(advantages, "float32")
        inputs["logprobs"] = _tensor(row.old_log_probs, "float32")
    return ttypes.Datum(model_input=ttypes.ModelInput.from_ints(toks[:-1]), loss_fn_inputs=inputs)


@RemoteBackendRegistry.register("tinker")
class TinkerBackend(RemoteBackend):
    """verl <-> a Tinker-API server. Build with :meth:`from_config` only."""

    def __init__(
        self,
        main_config: "DictConfig",
        cfg: TinkerConfig,
        *,
        owner: bool,
        model_id: str,
        base_model: str,
        service: Any,
        training: Any = None,
        server: Optional[ServerProcess] = None,
    ) -> None:
        self._main = main_config
        self.cfg = cfg
        self._owner = owner
        self.model_id = model_id
        self.base_model = base_model
        self._service = service
        self._training = training
        self._server = server
        self._closed = False
        self._pool = ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix="tinker")
        self._sampler: Any = None
        self._sampler_path: Optional[str] = None
        self._ref_sampler: Any = None
        self._policy_version = 0
        self._eos_ids = self._stop_ids(main_config)

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def from_config(cls, main_config: "DictConfig", *, handle: Optional[dict[str, Any]] = None) -> "TinkerBackend":
        """Create the LoRA model on the server (``handle=None``) or re-attach to it.

        Creating: runs :meth:`check_config`, launches the server when ``launch_server``, and
        retries ``create_lora_training_client`` until the engine accepts it (readiness: the
        server's health endpoint answers before its engine has loaded the model) or
        ``startup_timeout_s`` passes. Re-attaching opens a new SDK session on the same
        ``model_id``; it creates nothing on the server.
        """
        cfg = load_tinker_config(main_config)
        if handle is not None:
            if not isinstance(handle, dict) or handle.get("backend") != "tinker" or "model_id" not in handle:
                raise ValueError(
                    "handle is not a tinker-backend handle (expected the dict from TinkerBackend.reconnect_handle())"
                )
            cfg = dataclasses.replace(cfg, base_url=handle["base_url"])
            service = tinker.ServiceClient(base_url=cfg.base_url, api_key=cfg.resolved_api_key())
            return cls(
                main_config,
                cfg,
                owner=False,
                model_id=handle["model_id"],
                base_model=handle["base_model"],
                service=service,
            )
        cls.check_config(main_config)
        rank = lora_settings(main_config, cfg)
        base_model = cfg.base_model or str(select(main_config, "actor_rollout_ref.model.path"))
        seed = (
            cfg.seed
            if cfg.seed is not None
            else int(select(main_config, "actor_rollout_ref.actor.data_loader_seed", 0) or 0)
        )
        server = None
        if cfg.launch_server:
            log_dir = str(select(main_config, "trainer.default_local_dir", "."))
            os.makedirs(log_dir, exist_ok=True)
            server = ServerProcess.start(
                cfg.launch_command, log_path=os.path.join(log_dir, "tinker_server.log"), address=cfg.base_url
            )
        deadline = time.monotonic() + float(cfg.startup_timeout_s)
        last: Optional[BaseException] = None
        while True:
            if server is not None and not server.alive():
                raise TinkerBackendError(
                    f"the Tinker server launched by remote_backend.tinker.launch_command exited with "
                    f"{server.proc.returncode}; its log: {server.log_path}"
                )
            service = tinker.ServiceClient(base_url=cfg.base_url, api_key=cfg.resolved_api_key())
            try:
                training = service.create_lora_training_client(base_model=base_model, rank=rank, seed=seed)
                break
            except Exception as exc:  # not up yet, engine still loading, or a real refusal
                close_sdk_sessions(service)
                last = exc
                if _is_refusal(exc) or time.monotonic() >= deadline:
                    if server is not None:
                        server.stop()
                    raise TinkerBackendError(
                        f"Tinker server at {cfg.base_url} did not create a LoRA model "
                        f"(base_model={base_model!r}, rank={rank}) "
                        f"within remote_backend.tinker.startup_timeout_s={cfg.startup_timeout_s:g}: {_describe(last)}"
                    ) from exc
                time.sleep(2.0)
        logger.info("tinker: created LoRA model %s (rank %d) on %s", training.model_id, rank, cfg.base_url)
        return cls(
            main_config,
            cfg,
            owner=True,
            model_id=training.model_id,
            base_model=base_model,
            service=service,
            training=training,
            server=server,
        )

    @classmethod
    def check_config(cls, main_config: "DictConfig") -> None:
        """Refuse, before Ray starts, what the server cannot reproduce (optional capability); see
        :mod:`.tinker.config`. Raises :class:`ConfigError` naming key, value, supported values, why."""
        check_config(main_config)

    @classmethod
    def secret_settings(cls) -> dict[str, str]:
        """The API key, read from ``TINKER_API_KEY`` when ``remote_backend.tinker.api_key`` is null."""
        return dict(SECRET_SETTINGS)

    @classmethod
    def checkpoint_problem(cls, actor_dir: str, step: Optional[int]) -> Optional[str]:
        """Resume validation: does verl's ``actor`` folder record a Tinker state? (optional capability)"""
        path = os.path.join(actor_dir, CHECKPOINT_RECORD)
        try:
            with open(path) as fh:
                record = json.load(fh)
        except (OSError, ValueError) as exc:
            return f"{path} is missing or unreadable ({exc}); it names the Tinker state saved at that step"
        if not str(record.get("tinker_path", "")).startswith("tinker://"):
            return f"{path} has no tinker:// state path"
        return None

    def reconnect_handle(self) -> dict[str, Any]:
        """Server URL, model id and base model (JSON): enough for another process to re-attach."""
        self._live()
        return {
            "backend": "tinker",
            "base_url": self.cfg.base_url,
            "model_id": self.model_id,
            "base_model": self.base_model,
        }

    async def destroy(self) -> None:
        """Owner: unload the LoRA model from the server, stop a launched server. Both: close the
        SDK's sessions (their heartbeats), so a re-attached client only drops its session."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._release)

    def _release(self) -> None:
        if self._owner:
            try:
                if self._reachable():  # a dead server: nothing to unload, do not wait on it
                    self._unload()
            except Exception as exc:  # destroy runs in `finally` blocks: report, do not mask the first error
                logger.warning("tinker: unloading model %s failed: %s", self.model_id, _describe(exc))
        if self._server is not None:
            self._server.stop()
            self._server = None
        close_sdk_sessions(self._service)
        self._pool.shutdown(wait=False, cancel_futures=True)

    @classmethod
    def requires_single_forwarder(cls) -> bool:
        return True  # the Tinker server owns all parallelism; verl runs one CPU forwarder

    # ------------------------------------------------------------ data path
    async def compute_log_prob(
        self,
        data: "TensorDict",
        *,
        ref: bool,
        calculate_entropy: bool,
        rollout_n: int,
        temperature: float,
        pad_token_id: int,
    ) -> LogProbResult:
        """Per-token log-probs of the actor (training client ``forward``) or of the base model
        (reference: sampling client ``compute_logprobs``), packed ``[T]``.

        ``entropy`` (when asked): the server returns no distribution, so the adapter returns the
        sampled token's surprisal ``-log p(token)``, an unbiased per-token estimate of the entropy
        for on-policy samples at temperature 1 (the only temperature accepted).
        """
        op = "compute_ref_log_prob" if ref else "compute_log_prob"
        self._check_temperature(temperature, op)
        rows = tb.rows_of(data, with_update_fields=False)
        start = time.monotonic()
        if ref:
            sampler = await self._call(op, self._base_sampler)
            futures = await self._call(
                op, lambda: [sampler.compute_logprobs(ttypes.ModelInput.from_ints(r.tokens)) for r in rows]
            )
            answers = await self._call(op, lambda: [f.result() for f in futures])
            slots = [
                self._checked(op, lambda a=a, r=r: tb.align_right(a, len(r.tokens) - 1)) for a, r in zip(answers, rows)
            ]
        else:
            out = await self._call(
                op, lambda: self._train_client().forward([_datum(r) for r in rows], "cross_entropy").result()
            )
            slots = self._slots(op, out, rows)
        log_probs = tb.packed_from_slots(rows, slots)
        entropy = -log_probs if calculate_entropy else None
        return LogProbResult(log_probs, entropy, device=self._device(), compute_s=time.monotonic() - start)

    async def update_actor(
        self, data: "TensorDict", *, actor_config: Any, pad_token_id: int, rollout_n: int, temperature: float
    ) -> UpdateResult:
        """verl's PPO loop on the server: for each optimizer step of the shared update schedule
        (:mod:`verl.remote_backend.update_schedule`: verl's order), one ``forward_backward``
        with per-token advantages (scaled to verl's ``loss_agg_mode``, see :mod:`.tinker.batch`),
        old log-probs and response-mask weights, then one ``optim_step``."""
        op = "update_actor"
        self._check_temperature(temperature, op)
        get = lambda key, default=None: select(actor_config, key, default)  # noqa: E731
        rows = tb.rows_of(data, with_update_fields=True)
        steps = optimizer_step_rows(
            read_update_schedule(data, actor_config=actor_config, rollout_n=rollout_n), len(rows)
        )
        loss_fn = resolved_loss_fn(self._main, self.cfg)
        low, high = clip_thresholds(actor_config)
        loss_cfg = {"clip_low_threshold": low, "clip_high_threshold": high} if loss_fn == "ppo" else None
        agg = str(get("loss_agg_mode", "token-mean"))
        width = data["responses"].shape[1]
        adam = ttypes.AdamParams(**adam_params(actor_config))
        start = time.monotonic()
        losses, metrics = [], {"pg_loss": [], "pg_clipfrac": [], "ppo_kl": [], "grad_norm": [], "lr": []}
        for step_rows in steps:
            part = [rows[i] for i in step_rows.tolist()]
            scales = tb.advantage_scales(part, agg, response_width=width, loss_scale_factor=get("loss_scale_factor"))
            datums = [_datum(r, advantages=[a * c for a in r.advantages]) for r, c in zip(part, scales)]
            fb = await self._call(
                op, lambda d=datums: self._train_client().forward_backward(d, loss_fn, loss_cfg).result()
            )
            st = await self._call(op, lambda: self._train_client().optim_step(adam).result())
            new_lp = self._slots(op, fb, part)
            elementwise = self._slots(op, fb, part, key="elementwise_loss")
            live = [(r, e) for r, e in zip(part, elementwise) if r.mask_sum > 0]
            loss = sum(sum(e) / r.mask_sum for r, e in live) / max(len(live), 1)
            losses.append(loss)
            metrics["pg_loss"].append(loss)
            for k, v in tb.policy_metrics(part, new_lp, low, high).items():
                metrics[k].append(v)
            step_metrics = dict(getattr(st, "metrics", None) or {})
            metrics["grad_norm"].append(_metric(step_metrics, "grad_norm"))
            lr = _metric(step_metrics, "learning_rate")
            metrics["lr"].append(adam.learning_rate if lr != lr else lr)
        return self._update_result(sum(losses), metrics, data, time.monotonic() - start)

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> GenerateResult:
        """One sample from the latest sampler weights (the base model before the first update,
        which equals the zero-initialised LoRA actor); stops at the model's EOS ids."""
        if sampling_params.get("max_tokens") is None:
            raise ValueError(
                "generate: sampling_params['max_tokens'] is required "
                "(the rollout server caps it at rollout.response_length)"
            )
        sampler = self._sampler or await self._call("generate", self._refresh_sampler)
        top_k = int(sampling_params.get("top_k", -1) or -1)
        params = ttypes.SamplingParams(
            max_tokens=int(sampling_params["max_tokens"]),
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=top_k if top_k > 0 else -1,
            stop=list(self._eos_ids) or None,
            # verl's per-sample seeds are 64-bit; skyrl's sampler takes an int32
            seed=None if sampling_params.get("seed") is None else int(sampling_params["seed"]) % (2**31),
        )
        prompt = ttypes.ModelInput.from_ints([int(t) for t in prompt_ids])
        resp = await self._call("generate", lambda: sampler.sample(prompt, 1, params).result())
        seqs = getattr(resp, "sequences", None) or []
        if len(seqs) != 1:
            raise TinkerBackendError(f"Tinker generate at {self.cfg.base_url}: expected 1 sequence, got {len(seqs)}")
        tokens = [int(t) for t in seqs[0].tokens]
        want = bool(sampling_params.get("logprobs", False))
        log_probs = None
        if want:
            log_probs = [float(x) for x in (seqs[0].logprobs or [])]
            if len(log_probs) != len(tokens):
                raise TinkerBackendError(f"Tinker generate: {len(log_probs)} log-probs for {len(tokens)} tokens")
        return GenerateResult(tokens, log_probs)

    async def update_weights(self) -> dict[str, Any]:
        """``save_weights_for_sampler`` under a new, time-ordered name; this process samples from
        it at once, others find it in :meth:`wake_up`."""
        name = f"{SAMPLER_PREFIX}{time.time_ns():020d}"
        resp = await self._call("update_weights", lambda: self._train_client().save_weights_for_sampler(name).result())
        path = getattr(resp, "path", None)
        if not path:
            raise TinkerBackendError(
                f"Tinker save_weights_for_sampler at {self.cfg.base_url} returned no path: {resp!r:.200}"
            )
        self._sampler = await self._call(
            "update_weights", lambda: self._service.create_sampling_client(model_path=path)
        )
        self._sampler_path = path
        self._policy_version += 1
        return {"policy_version": self._policy_version}

    async def save_checkpoint(self, path: Optional[str] = None, step: Optional[int] = None) -> Optional[str]:
        """``save_state`` (LoRA weights + AdamW state) on the server, recorded in ``<path>/tinker_checkpoint.json``.

        The state lives in the server's own checkpoint store; a resume needs the same server (or
        one sharing its checkpoint folder and database)."""
        name = f"verl-step-{int(step or 0):06d}-{time.time_ns()}"
        resp = await self._call("save_checkpoint", lambda: self._train_client().save_state(name).result())
        tinker_path = getattr(resp, "path", None)
        if not tinker_path:
            raise TinkerBackendError(f"Tinker save_state at {self.cfg.base_url} returned no path: {resp!r:.200}")
        if path is not None:
            os.makedirs(path, exist_ok=True)
            record = {
                "tinker_path": tinker_path,
                "model_id": self.model_id,
                "base_model": self.base_model,
                "base_url": self.cfg.base_url,
                "step": step,
            }
            tmp = os.path.join(path, CHECKPOINT_RECORD + ".tmp")
            with open(tmp, "w") as fh:
                json.dump(record, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, os.path.join(path, CHECKPOINT_RECORD))
        return path

    async def load_checkpoint(self, path: Optional[str] = None, step: Optional[int] = None) -> None:
        """Restore the recorded Tinker state (weights + optimizer) into this run's model, then
        publish it to the sampler.

        Raises:
            ResumeCheckpointError: no record, or the server refuses the load (it accepts a load only
                as the first request of a model, and only a state it still has).
        """
        problem = self.checkpoint_problem(path or "", step)
        if problem:
            raise ResumeCheckpointError(f"tinker: cannot resume verl's step {step}: {problem}")
        with open(os.path.join(path, CHECKPOINT_RECORD)) as fh:
            record = json.load(fh)
        try:
            await self._call(
                "load_checkpoint",
                lambda: self._train_client().load_state_with_optimizer(record["tinker_path"]).result(),
            )
        except TinkerBackendError as exc:
            raise ResumeCheckpointError(
                f"Tinker server at {self.cfg.base_url} did not restore {record['tinker_path']} "
                f"(verl step {step}): {exc}. "
                "The state must be on this server; resume another checkpoint with trainer.resume_mode=resume_path "
                "trainer.resume_from_path=<global_step_N folder>, or start over with trainer.resume_mode=disable"
            ) from exc
        await self.update_weights()

    # ------------------------------------------------------------ optional capabilities
    async def wake_up(self) -> None:
        """Rollout server, before a generation phase: sample from the newest sampler weights."""
        await self._call("wake_up", self._refresh_sampler)

    async def sleep(self) -> None:
        return None

    async def health(self) -> None:
        """One ``GET /api/v1/healthz``; raises :class:`ConnectionLost` when the server does not answer."""
        url = f"{self.cfg.base_url.rstrip('/')}/api/v1/healthz"
        limit = float(self.cfg.connect_timeout_s)

        def probe() -> None:
            with urllib.request.urlopen(url, timeout=limit) as resp:
                if resp.status != 200:
                    raise ConnectionLost(f"Tinker server at {self.cfg.base_url}: healthz answered {resp.status}")

        try:
            await asyncio.to_thread(probe)
        except ConnectionLost:
            raise
        except Exception as exc:
            raise ConnectionLost(f"Tinker server at {self.cfg.base_url} is unreachable: {_describe(exc)}") from exc

    def log_location(self) -> str:
        if self._server is not None:
            return f"{self._server.log_path} (Tinker server at {self.cfg.base_url})"
        return f"the Tinker server's own logs ({self.cfg.base_url}; it was started outside verl)"

    # ------------------------------------------------------------ helpers (results in one place each)
    def _update_result(self, loss: float, metrics: dict, data: Any, seconds: float) -> UpdateResult:
        return UpdateResult(
            metrics,
            loss=float(loss),
            global_token_num=data["input_ids"].offsets().diff().tolist(),
            device=self._device(),
            compute_s=seconds,
        )

    def _device(self) -> BackendDevice:
        d = self.cfg.device
        return BackendDevice(type=d.type, count=1, peak_flops=d.peak_flops, name=d.name)

    def _live(self) -> None:
        if self._closed:
            raise BackendClosedError("the tinker backend was destroyed")

    def _train_client(self) -> Any:
        self._live()
        if self._training is None:  # re-attached: a training client on the owner's model
            holder = self._service.holder
            training = tinker.TrainingClient(
                holder, model_seq_id=holder.get_training_client_id(), model_id=self.model_id
            )
            if not all(isinstance(getattr(training, a, None), int) for a in ("_request_id_counter", "_turn_counter")):
                raise TinkerBackendError(
                    f"this tinker SDK ({getattr(tinker, '__version__', '?')}) numbers training requests differently "
                    "from 0.25.0; a re-attached client could collide with the owner's requests (pin tinker==0.25.0)"
                )
            # the SDK sends request k only when its turn counter reaches k: both start at the block
            base = (1 + secrets.randbelow(_ATTACHED_SEQ_BLOCKS)) * _ATTACHED_SEQ_BLOCK
            training._request_id_counter = training._turn_counter = base
            self._training = training
        return self._training

    def _base_sampler(self) -> Any:
        if self._ref_sampler is None:
            self._ref_sampler = self._service.create_sampling_client(base_model=self.base_model)
        return self._ref_sampler

    def _refresh_sampler(self) -> Any:
        """The newest ``verl-sampler-*`` checkpoint of this model, or the base model when none exists."""
        self._live()
        listing = self._service.create_rest_client().list_checkpoints(self.model_id).result()
        names = sorted(
            (c.checkpoint_id, c.tinker_path)
            for c in listing.checkpoints
            if c.checkpoint_type == "sampler" and c.checkpoint_id.startswith(SAMPLER_PREFIX)
        )
        if not names:
            self._sampler = self._base_sampler()
        elif names[-1][1] != self._sampler_path:
            self._sampler = self._service.create_sampling_client(model_path=names[-1][1])
            self._sampler_path = names[-1][1]
        return self._sampler

    def _reachable(self) -> bool:
        try:
            url = f"{self.cfg.base_url.rstrip('/')}/api/v1/healthz"
            with urllib.request.urlopen(url, timeout=min(5.0, float(self.cfg.connect_timeout_s))) as resp:
                return resp.status == 200
        except Exception as exc:
            logger.warning(
                "tinker: server %s unreachable at teardown (%s); model %s not unloaded",
                self.cfg.base_url,
                exc,
                self.model_id,
            )
            return False

    def _unload(self) -> None:
        """Unload the model and wait until the server has done it.

        The server answers ``unload_model`` with a future and runs it later, after the forward
        passes already queued (skyrl 0.4.0 batches model passes ahead of single requests), so a
        client re-attached before ``destroy`` could still compute until that future completes.
        Waiting on it makes "the owner's destroy() shut the engine down" hold when it returns.
        """
        holder = self._service.holder

        async def unload() -> None:
            from tinker.lib.api_future_impl import _APIFuture  # the SDK's own awaitable for a request's result
            from tinker.lib.client_connection_pool_type import ClientConnectionPoolType

            sent = time.time()
            with holder.aclient(ClientConnectionPoolType.TRAIN) as client:
                pending = await client.models.unload(request=ttypes.UnloadModelRequest(model_id=self.model_id))
            await _APIFuture(ttypes.UnloadModelResponse, holder, pending, request_start_time=sent,
                             request_type="UnloadModel")  # fmt: skip

        holder.run_coroutine_threadsafe(unload()).result(timeout=30)

    async def _call(self, op: str, fn: Callable[[], Any]) -> Any:
        """Run a blocking SDK call on the pool; failures become :class:`TinkerBackendError`
        (:class:`ConnectionLost` for transport failures) naming the op and the server."""
        self._live()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
        except (BackendClosedError, TinkerBackendError):
            raise
        except Exception as exc:
            kind = ConnectionLost if _is_transport(exc) else TinkerBackendError
            raise kind(f"Tinker {op} at {self.cfg.base_url} (model {self.model_id}) failed: {_describe(exc)}") from exc

    def _slots(self, op: str, out: Any, rows: list, key: str = "logprobs") -> list[list[float]]:
        outs = getattr(out, "loss_fn_outputs", None) or []
        if len(outs) != len(rows):
            raise TinkerBackendError(f"Tinker {op}: {len(outs)} outputs for {len(rows)} sequences")
        result = []
        for row, o in zip(rows, outs):
            if key not in o:
                raise TinkerBackendError(f"Tinker {op}: output has no {key!r} (keys {sorted(o)})")
            vals = list(o[key].data)
            if len(vals) != len(row.tokens) - 1:
                raise TinkerBackendError(f"Tinker {op}: {len(vals)} {key} for a sequence of {len(row.tokens)} tokens")
            result.append([float(v) for v in vals])
        return result

    @staticmethod
    def _checked(op: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ValueError as exc:
            raise TinkerBackendError(f"Tinker {op}: {exc}") from exc

    @staticmethod
    def _check_temperature(temperature: float, op: str) -> None:
        if float(temperature) != 1.0:
            raise ConfigError(
                f"tinker {op}: temperature={temperature} (actor_rollout_ref.rollout.temperature) is not "
                "supported: the server scores tokens at temperature 1 only"
            )

    @staticmethod
    def _stop_ids(main_config: Any) -> list[int]:
        """EOS ids of the model (generation_config, then tokenizer), the sampler's stop tokens."""
        path = select(main_config, "actor_rollout_ref.model.path")
        ids: list[int] = []
        try:
            from transformers import AutoTokenizer, GenerationConfig

            try:
                eos = GenerationConfig.from_pretrained(path).eos_token_id
                ids += eos if isinstance(eos, list) else ([eos] if eos is not None else [])
            except Exception:
                pass
            tok = AutoTokenizer.from_pretrained(path)
            if tok.eos_token_id is not None:
                ids.append(int(tok.eos_token_id))
        except Exception as exc:
            logger.warning("tinker: could not read EOS ids of %s (%s); sampling stops at max_tokens only", path, exc)
        return sorted(set(int(i) for i in ids))


def close_sdk_sessions(service: "tinker.ServiceClient") -> None:
    """Stop the background tasks of the SDK sessions ``service`` opened (tinker 0.25: a session
    heartbeat every 10 s, for the life of the process otherwise, which warns at every beat once
    the server has been gone for 2 minutes). Its sampling and training clients share these sessions, so call
    this only when they are no longer used. Idempotent; never raises (it runs in teardown)."""
    for name in ("_session_holder", "_rest_holder"):  # the SDK's lazily created holders
        holder = getattr(service, name, None)
        if holder is None:
            continue
        try:
            holder.close()
        except Exception as exc:
            logger.warning("tinker: closing the SDK session failed: %s", _describe(exc))


def _metric(metrics: dict, suffix: str) -> float:
    for key, value in metrics.items():
        if key == suffix or key.endswith("/" + suffix):
            return float(value)
    return float("nan")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:500]}"


def _is_transport(exc: BaseException) -> bool:
    import httpx

    if isinstance(exc, (ConnectionError, TimeoutError, httpx.TransportError)):
        return True
    name = type(exc).__name__
    return name in ("APIConnectionError", "APITimeoutError")


def _is_refusal(exc: BaseException) -> bool:
    """A 4xx answer (bad rank, unknown base model): the server is up and said no - do not wait."""
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (404, 408, 429)
