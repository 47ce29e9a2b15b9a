"""The rollout server actor: verl's token-in/token-out ``generate`` served by a remote backend.

verl's agent loop workers send every sample to a rollout server and expect a ``TokenOutput``;
this actor takes that place for ``rollout.name=remote``. It re-attaches to the trainer's backend
(it never creates an engine), caps ``max_tokens`` to the configured lengths, checks what comes
back, and maps verl's lifecycle calls onto the backend's optional capabilities.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Optional

from omegaconf import DictConfig

from verl.remote_backend.base import destroy_backend, implements
from verl.remote_backend.registry import RemoteBackendRegistry
from verl.remote_backend.reliability.guard import BackendGuard
from verl.remote_backend.reliability.policy import ReliabilitySettings
from verl.workers.rollout.remote_rollout.sampling import (
    backend_sampling_params,
    cap_max_tokens,
    check_generate_result,
)
from verl.workers.rollout.replica import TokenOutput

__all__ = ["RemoteRolloutServer"]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))


class RemoteRolloutServer:
    """Ray actor (async) forwarding one replica's generate requests to the backend.

    Many requests run concurrently on its event loop; the backend is expected to batch them.
    Lifecycle calls without a matching optional backend capability are no-ops.

    Args:
        main_config: verl's full config (``trainer.remote_backend`` names the backend;
            ``actor_rollout_ref.rollout`` gives the lengths).
        handle: the trainer backend's ``reconnect_handle()``.
        replica_rank: rank of the owning replica (for logs).
    """

    def __init__(self, main_config: DictConfig, handle: dict[str, Any], replica_rank: int = 0) -> None:
        name = str(main_config.trainer.remote_backend)
        self._backend = RemoteBackendRegistry.get(name).from_config(main_config, handle=handle)
        # One guard for all concurrent requests: time limits, one shared liveness watchdog.
        self._guard = BackendGuard(self._backend, name=name, settings=ReliabilitySettings.from_main_config(main_config))
        self._vocab_size = _model_vocab_size(main_config)
        rollout = main_config.actor_rollout_ref.rollout
        self._response_length = int(rollout.response_length)
        self._prompt_length = int(rollout.prompt_length)
        self._max_model_len: Optional[int] = (
            None if rollout.get("max_model_len") is None else int(rollout.max_model_len)
        )
        self._replica_rank = replica_rank
        self._global_steps: Optional[int] = None  # the weight version, once the trainer sets one
        self._asleep = False
        self._lifecycle_lock = asyncio.Lock()

    async def ready(self) -> bool:
        """Returns once the backend is attached (surfaces attach errors at launch)."""
        return True

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
    ) -> TokenOutput:
        """Sample one response for ``prompt_ids`` (text only).

        After :meth:`sleep`, wakes the backend first: with verl's ``naive`` weight sync nobody
        else calls ``wake_up`` before the next rollout."""
        if image_data or video_data:
            raise NotImplementedError("remote rollout servers take text prompts only (no image/video data)")
        if self._asleep:
            await self.wake_up()
        requested = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        max_tokens = cap_max_tokens(
            requested,
            len(prompt_ids),
            response_length=self._response_length,
            prompt_length=self._prompt_length,
            max_model_len=self._max_model_len,
        )
        want_logprobs = bool(sampling_params.get("logprobs", False))
        # verl 0.9.1's V1 trainer tags every trajectory with the weight version that sampled it
        stamp = {} if self._global_steps is None else {"extra_fields": {"global_steps": self._global_steps}}
        if max_tokens == 0:
            return TokenOutput(token_ids=[], log_probs=[] if want_logprobs else None, stop_reason="completed", **stamp)
        params = backend_sampling_params(sampling_params, max_tokens)
        prompt = list(prompt_ids)
        result = await self._guard.call("generate", lambda: self._backend.generate(prompt, params))
        checked = check_generate_result(
            result, max_tokens=max_tokens, want_logprobs=want_logprobs, vocab_size=self._vocab_size
        )
        return TokenOutput(**checked, **stamp)

    async def set_global_steps(self, global_steps: int) -> None:
        """Record the weight version the backend samples with (the trainer's step of its last
        ``update_weights``); every later ``TokenOutput`` carries it as ``extra_fields["global_steps"]``,
        as verl's own rollout servers do for the V1 trainer's staleness metrics."""
        self._global_steps = int(global_steps)

    # ------------------------------------------------------------ lifecycle
    async def wake_up(self) -> None:
        """Bring the backend's sampler back (optional ``wake_up`` capability)."""
        async with self._lifecycle_lock:
            if self._asleep:
                await self._maybe_call("wake_up")
                self._asleep = False

    async def sleep(self) -> None:
        """Let the backend free sampler memory (optional ``sleep`` capability)."""
        async with self._lifecycle_lock:
            if not self._asleep:
                await self._maybe_call("sleep")
                self._asleep = True

    async def clear_kv_cache(self) -> None:
        """Drop cached prefixes (optional ``clear_kv_cache`` capability)."""
        await self._maybe_call("clear_kv_cache")

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """Partial rollout is not supported; requests always run to completion (verl 0.9.1 also
        passes ``reject_request``)."""

    async def resume_generation(self) -> None:
        """Counterpart of :meth:`abort_all_requests` (nothing to resume)."""

    async def start_profile(self, **kwargs: Any) -> None:
        """Profiling happens inside the backend, if at all."""

    async def stop_profile(self) -> None:
        """See :meth:`start_profile`."""

    async def _maybe_call(self, method: str) -> None:
        if implements(self._backend, method):
            await self._guard.call(method, getattr(self._backend, method))

    async def destroy(self) -> None:
        """Drop this server's connection (the shared engine stays up: the client was re-attached)."""
        await asyncio.wait_for(destroy_backend(self._backend), timeout=self._guard.settings.timeouts.destroy)


def _model_vocab_size(main_config: DictConfig) -> Optional[int]:
    """Rows of the model's embedding (``vocab_size`` of its HF config): generated ids must be below it.

    ``None`` (check disabled, with a warning) when the config cannot be read here.
    """
    model = main_config.actor_rollout_ref.model
    try:
        from transformers import AutoConfig

        from verl.utils.fs import copy_to_local

        local = copy_to_local(model.path, use_shm=model.get("use_shm", False))
        hf = AutoConfig.from_pretrained(local, trust_remote_code=bool(model.get("trust_remote_code", False)))
        text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
        size = getattr(text, "vocab_size", None)
        return int(size) if size else None
    except Exception as exc:  # noqa: BLE001 - the check is a safeguard, not a requirement
        logger.warning("Cannot read the model's vocab_size (%s); generated token ids are not range-checked", exc)
        return None
