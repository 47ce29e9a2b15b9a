"""The CPU forwarder: a verl ``Worker`` standing in for the actor/ref workers.

verl's trainer (``use_legacy_worker_impl=disable``, or verl 0.9.1's V1 trainer) drives it through
``compute_log_prob``, ``compute_ref_log_prob``, ``update_actor``, ``update_weights`` and
``save/load_checkpoint``; each awaits the shared :class:`RemoteBackend` under the guard and turns
its typed result into what the trainer reads back (nested tensors, verl ``Metric`` objects, MFU
against the backend's devices). A V1 batch (read from TransferQueue by verl's ``tqbridge``, all
fields jagged) reaches the backend in the dense layout of the legacy trainer (``v1_layout.py``).
It never creates an engine: ``attach_backend`` re-attaches by handle.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from typing import Any, Awaitable, Callable, Optional, TypeVar

from omegaconf import DictConfig
from tensordict import TensorDict

from verl.remote_backend.base import RemoteBackend, accepts_batch_refs, destroy_backend, supports_resume
from verl.remote_backend.checkpoints import (
    checkpoints_to_prune,
    parse_global_step,
    protected_checkpoint,
    resume_failure,
)
from verl.remote_backend.errors import (
    BackendDiedError,
    BackendOutputError,
    BackendTimeoutError,
    ConfigError,
    ResumeCheckpointError,
)
from verl.remote_backend.forwarder.dispatch import make_forwarder_dispatch_fn
from verl.remote_backend.forwarder.metrics import normalise_metrics
from verl.remote_backend.forwarder.mfu import compute_mfu
from verl.remote_backend.forwarder.output_checks import check_log_prob_output, check_update_output
from verl.remote_backend.forwarder.step_timing import StepTiming
from verl.remote_backend.forwarder.v1_layout import is_v1_layout, to_dense_layout
from verl.remote_backend.launch.cpu_compat import install_flash_attn_fallback
from verl.remote_backend.registry import RemoteBackendRegistry
from verl.remote_backend.reliability.guard import BackendGuard
from verl.remote_backend.reliability.policy import ReliabilitySettings
from verl.remote_backend.results import BackendDevice, as_log_prob_result, as_update_result
from verl.remote_backend.transport.batch_ref import BatchRef, batch_field
from verl.remote_backend.transport.layout import packed_to_nested, sequence_lengths
from verl.remote_backend.transport.wire import WireBatch, to_wire
from verl.remote_backend.update_schedule import read_update_schedule
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils import tensordict_utils as tu

__all__ = ["RemoteBackendWorker"]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

install_flash_attn_fallback()

T = TypeVar("T")


class RemoteBackendWorker(Worker):
    """verl actor/ref worker whose compute happens in a remote backend.

    Args:
        config: verl's ``actor_rollout_ref`` block (what the trainer passes to
            every actor worker).
        role: ``"actor_rollout"`` or ``"actor_rollout_ref"`` (the latter when a
            reference policy is needed).
    """

    def __init__(self, config: DictConfig, role: str, **kwargs: Any) -> None:
        Worker.__init__(self)
        self.config = config
        self.role = role
        self._backend: Optional[RemoteBackend] = None
        self._guard: Optional[BackendGuard] = None
        self._flops_counter = None
        self._pad_token_id: int = 0
        self._device: Optional[BackendDevice] = None
        self._warned_no_device = False
        self._saved_checkpoints: list[str] = []
        self._step_timing = StepTiming()

    # ------------------------------------------------------------ set-up
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Register the dispatch meshes and load what MFU and padding need (config + tokenizer).

        Every rank is its own data-parallel rank. ``actor``/``ref`` collect from
        every rank (their outputs are per-sample); ``actor_update`` collects rank
        0 only, since an update returns one set of metrics for the whole step.
        """
        self._register_dispatch_collect_info("actor", dp_rank=self.rank, is_collect=True)
        self._register_dispatch_collect_info("actor_update", dp_rank=self.rank, is_collect=self.rank == 0)
        if "ref" in self.role:
            self._register_dispatch_collect_info("ref", dp_rank=self.rank, is_collect=True)

        from transformers import AutoConfig

        from verl.utils import hf_tokenizer
        from verl.utils.flops_counter import FlopsCounter
        from verl.utils.fs import copy_to_local

        model = self.config.model
        trust = bool(model.get("trust_remote_code", False))
        local_path = copy_to_local(model.path, use_shm=model.get("use_shm", False))
        self._flops_counter = FlopsCounter(AutoConfig.from_pretrained(local_path, trust_remote_code=trust))
        tokenizer = hf_tokenizer(local_path, trust_remote_code=trust)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._pad_token_id = int(pad) if pad is not None else 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def attach_backend(self, main_config: DictConfig, handle: dict[str, Any]) -> None:
        """Re-attach to the trainer's backend: ``from_config(main_config, handle=handle)``."""
        name = str(main_config.trainer.remote_backend)
        self._backend = RemoteBackendRegistry.get(name).from_config(main_config, handle=handle)
        # Time limits, liveness probes and the retry policy of every call below.
        self._guard = BackendGuard(self._backend, name=name, settings=ReliabilitySettings.from_main_config(main_config))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def detach_backend(self) -> None:
        """Drop this worker's connection (never the shared engine: the client was re-attached)."""
        backend, self._backend = self._backend, None
        guard, self._guard = self._guard, None
        if backend is not None:
            limit = guard.settings.timeouts.destroy if guard is not None else None
            try:
                await asyncio.wait_for(destroy_backend(backend), timeout=limit)
            except asyncio.TimeoutError:  # teardown must finish: the trainer destroys the engine next
                logger.warning("Detaching from the backend took over %ss (remote_backend.timeouts.destroy)", limit)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_loss_fn(self, loss_fn: Any) -> None:
        """No-op: the backend applies verl's policy loss from ``actor_config`` itself."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True) -> None:
        """No-op: nothing lives on this worker to offload; the backend manages its memory."""

    # ------------------------------------------------------------ data path
    # Data-path methods are dispatched by reference (dispatch.py): ``data`` arrives as a
    # BatchRef when called through the worker group, as a TensorDict when called directly.
    @register(dispatch_mode=make_forwarder_dispatch_fn("actor"))
    async def compute_log_prob(self, data: TensorDict | BatchRef) -> TensorDict | WireBatch:
        """Actor log-probs (and entropy when ``calculate_entropy``) for the batch.

        verl sends ``no_lora_adapter=True`` when the reference policy is the
        actor without its adapter; that request goes to the backend as ``ref=True``.
        """
        ref = bool(_pop_field(data, "no_lora_adapter", False))
        return await self._forward(data, ref=ref)

    @register(dispatch_mode=make_forwarder_dispatch_fn("ref"))
    async def compute_ref_log_prob(self, data: TensorDict | BatchRef) -> TensorDict | WireBatch:
        """Reference-model log-probs for the batch."""
        return await self._forward(data, ref=True)

    async def _forward(self, data: TensorDict | BatchRef, *, ref: bool) -> TensorDict | WireBatch:
        backend = self._require_backend()
        from_v1 = is_v1_layout(data)
        data = self._backend_layout(data)
        calculate_entropy = bool(batch_field(data, "calculate_entropy", False))
        input_ids = _layout(data)
        op = "compute_ref_log_prob" if ref else "compute_log_prob"
        payload = await _payload_for(backend, data)
        start = time.perf_counter()
        result = await self._call(
            op,
            lambda: backend.compute_log_prob(
                payload,
                ref=ref,
                calculate_entropy=calculate_entropy,
                rollout_n=int(self.config.rollout.n),
                temperature=self._temperature(data),
                pad_token_id=self._pad_token_id,
            ),
        )
        seconds = time.perf_counter() - start
        result = as_log_prob_result(result, op)
        self._step_timing.record(seconds, result.compute_s)
        check_log_prob_output(result, input_ids, calculate_entropy=calculate_entropy, op=op)
        outputs = {"log_probs": packed_to_nested(result.log_probs, input_ids, key="log_probs")}
        if calculate_entropy:
            outputs["entropy"] = packed_to_nested(result.entropy, input_ids, key="entropy")
        seqlens = sequence_lengths(input_ids).tolist()
        # A plain float: the trainer logs metrics["mfu"] of log-prob calls without reducing it.
        metrics = {"mfu": self._mfu(result.device, seqlens, seconds, forward_only=True)}
        if from_v1 and not ref:  # verl's V1 trainer drops these metrics: the update's carry the MFU
            self._step_timing.record_infer_mfu(metrics["mfu"])
        output = tu.get_tensordict(tensor_dict=outputs, non_tensor_dict={"metrics": metrics})
        # Called through the worker group (a BatchRef came in), the output goes back to the driver
        # over Ray: its per-token tensors travel as numpy buffers and arrive as this TensorDict.
        return to_wire(output) if isinstance(data, BatchRef) else output

    @register(dispatch_mode=make_forwarder_dispatch_fn("actor_update"))
    async def update_actor(self, data: TensorDict | BatchRef) -> TensorDict:
        """One policy update on this rank's share of the batch; returns ``{"metrics": ...}``.

        Metrics are verl ``Metric`` objects keyed without the ``actor/`` prefix,
        plus ``loss`` and ``mfu`` (the trainer renames ``actor/mfu`` to
        ``perf/mfu/actor``). MFU counts every token once per PPO epoch. The
        ``remote/*`` timing metrics of the step's forwarded calls ride along
        (:class:`~verl.remote_backend.forwarder.step_timing.StepTiming`).
        """
        backend = self._require_backend()
        data = self._backend_layout(data)
        # MFU counts each token once per epoch: the epochs of the schedule the backend runs
        epochs = read_update_schedule(data, actor_config=self.config.actor, rollout_n=int(self.config.rollout.n)).epochs
        seqlens_default = sequence_lengths(_layout(data)).tolist()
        payload = await _payload_for(backend, data)
        start = time.perf_counter()
        result = await self._call(
            "update_actor",
            lambda: backend.update_actor(
                payload,
                actor_config=self.config.actor,
                pad_token_id=self._pad_token_id,
                rollout_n=int(self.config.rollout.n),
                temperature=self._temperature(data),
            ),
        )
        seconds = time.perf_counter() - start
        result = as_update_result(result)
        self._step_timing.record(seconds, result.compute_s)
        check_update_output(result, batch_size=len(seqlens_default))
        metrics = normalise_metrics(result.metrics)
        if result.loss is not None:
            metrics.update(normalise_metrics({"loss": result.loss}))
        seqlens = result.global_token_num or seqlens_default
        metrics["mfu"] = self._mfu(result.device, seqlens * epochs, seconds, forward_only=False)
        metrics.update(normalise_metrics(self._step_timing.pop_metrics()))
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: Optional[int] = None, mode: str = "naive") -> Optional[dict[str, Any]]:
        """Make the backend's sampler use the latest weights (rank 0 forwards; one engine). verl's
        checkpoint engine passes ``global_steps`` (and, on verl 0.9.1, its transfer ``mode``); the
        backend syncs its own way, so neither changes what is done."""
        if self.rank != 0:
            return None
        backend = self._require_backend()
        return await self._call("update_weights", backend.update_weights)

    # ------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def save_checkpoint(
        self,
        local_path: str,
        hdfs_path: Optional[str] = None,
        global_step: int = 0,
        max_ckpt_to_keep: Optional[int] = None,
    ) -> Optional[str]:
        """Save under verl's ``<default_local_dir>/global_step_<N>/actor`` and keep at most
        ``max_ckpt_to_keep`` of the checkpoints this worker saved (verl's retention rule)."""
        if self.rank != 0:
            return None
        backend = self._require_backend()
        written = await self._call(
            "save_checkpoint", lambda: backend.save_checkpoint(path=local_path, step=int(global_step))
        )
        path = str(written or local_path)
        if path in self._saved_checkpoints:
            self._saved_checkpoints.remove(path)
        self._saved_checkpoints.append(path)
        # verl updates its tracker only after this returns: the step it names now is the only one
        # a crash would resume from, so it survives pruning until a newer one is confirmed.
        keep = protected_checkpoint(local_path)
        for old in checkpoints_to_prune(self._saved_checkpoints, max_ckpt_to_keep, protect=keep):
            shutil.rmtree(old, ignore_errors=True)
            self._saved_checkpoints.remove(old)
        return path

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def load_checkpoint(
        self, local_path: str, hdfs_path: Optional[str] = None, del_local_after_load: bool = False
    ) -> None:
        """Restore the backend from ``local_path`` (the step is parsed from ``global_step_<N>``)."""
        if self.rank != 0:
            return None
        backend = self._require_backend()
        if not supports_resume(backend):
            raise ConfigError(
                f"trainer.resume_mode: the run would resume from {local_path}, but backend "
                f"{type(backend).__name__!r} has no `async load_checkpoint(path, step)`. "
                "Fix: set trainer.resume_mode=disable"
            )
        step = parse_global_step(local_path)
        if step is None:
            raise ResumeCheckpointError(
                f"checkpoint path {local_path!r} has no global_step_<N> component: verl resumes only from "
                "the global_step_<N> folders it saves"
            )
        try:
            await self._call("load_checkpoint", lambda: backend.load_checkpoint(local_path, step))
        except (BackendTimeoutError, BackendDiedError, ResumeCheckpointError):
            raise  # timeouts, deaths and the backend's own resume verdict say so themselves
        except BackendOutputError as exc:
            raise resume_failure(os.path.dirname(os.path.abspath(local_path)), str(exc)) from exc
        except (RuntimeError, ValueError, OSError) as exc:  # the backend refused the checkpoint
            raise resume_failure(os.path.dirname(os.path.abspath(local_path)), f"{type(exc).__name__}: {exc}") from exc
        if local_path not in self._saved_checkpoints:
            self._saved_checkpoints.append(local_path)
        if del_local_after_load:
            shutil.rmtree(local_path, ignore_errors=True)

    # ------------------------------------------------------------ helpers
    def _require_backend(self) -> RemoteBackend:
        if self._backend is None:
            raise RuntimeError(
                "RemoteBackendWorker has no backend attached: RemoteBackendTrainer.init_workers calls "
                "attach_backend(main_config, handle) after the worker group starts."
            )
        return self._backend

    async def _call(self, op: str, factory: Callable[[], Awaitable[T]]) -> T:
        """``await factory()`` under the guard (time limit, liveness, retry policy)."""
        if self._guard is None:
            raise RuntimeError("RemoteBackendWorker has no backend attached (see attach_backend)")
        return await self._guard.call(op, factory)

    def _backend_layout(self, data: TensorDict | BatchRef) -> TensorDict | BatchRef:
        """A batch of verl 0.9.1's V1 trainer in the dense layout backends read
        (:mod:`~verl.remote_backend.forwarder.v1_layout`); any other batch as it is."""
        if not is_v1_layout(data):
            return data
        rollout = self.config.rollout
        return to_dense_layout(
            data,
            prompt_length=int(rollout.prompt_length),
            response_length=int(rollout.response_length),
            pad_token_id=self._pad_token_id,
        )

    def _temperature(self, data: TensorDict | BatchRef) -> float:
        value = batch_field(data, "temperature", None)
        return float(self.config.rollout.temperature if value is None else value)

    def _mfu(self, device: Optional[BackendDevice], seqlens: list[int], seconds: float, *, forward_only: bool) -> float:
        if device is not None:
            self._device = device
        if self._device is None:
            if not self._warned_no_device:
                logger.warning("Backend reports no device; MFU is logged as 0 (see BackendDevice in results.py).")
                self._warned_no_device = True
            return 0.0
        return compute_mfu(self._flops_counter, seqlens, seconds, self._device, forward_only=forward_only)


# ------------------------------------------------------------ batch access (TensorDict or BatchRef)
def _pop_field(data: TensorDict | BatchRef, key: str, default: Any) -> Any:
    return data.pop(key, default) if isinstance(data, BatchRef) else tu.pop(data, key=key, default=default)


def _layout(data: TensorDict | BatchRef) -> Any:
    """The batch's nested ``input_ids``, or a data-free nested tensor with its offsets."""
    return data.layout() if isinstance(data, BatchRef) else data["input_ids"]


async def _payload_for(backend: RemoteBackend, data: TensorDict | BatchRef) -> TensorDict | BatchRef:
    """What the backend receives: the ``BatchRef`` itself if it accepts references, else the batch."""
    if isinstance(data, BatchRef) and not accepts_batch_refs(backend):
        return await data.fetch()
    return data
