"""The engine's Ray actor: an async front for :class:`~.engine.LocalEngine`.

Every method is ``async`` and pushes the compute to a worker thread
(``asyncio.to_thread``), so the actor's event loop keeps accepting calls while
a forward/backward or a decoding batch runs. That is what makes dynamic
batching work: ``generate`` calls arriving concurrently (verl's agent loop sends
one per sample, all at once) queue up, and one batching task decodes up to
``max_batch_size`` of them together, waiting ``batch_wait_ms`` after the first
arrival for the rest. Requests that arrive while a batch decodes form the next
batch.

The class is plain Python; :func:`remote_engine_class` wraps it with
``ray.remote`` so importing this module does not need Ray.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Sequence

from .config import EngineSettings
from .engine import LocalEngine
from .sampler import SampleRequest

__all__ = ["EngineActor", "remote_engine_class"]


class EngineActor:
    """Ray actor body owning one :class:`LocalEngine` (see module docstring)."""

    def __init__(self, settings: EngineSettings) -> None:
        self.engine = LocalEngine(settings)
        self._pending: list[tuple[SampleRequest, asyncio.Future]] = []
        self._wakeup: Optional[asyncio.Event] = None
        self._batcher: Optional[asyncio.Task] = None
        self.batches_run = 0

    async def info(self) -> dict[str, Any]:
        return {**self.engine.info(), "batches_run": self.batches_run}

    async def compute_log_prob(self, data: Any, *, ref: bool, calculate_entropy: bool, temperature: float) -> dict:
        return await asyncio.to_thread(
            self.engine.compute_log_prob, data, ref=ref, calculate_entropy=calculate_entropy, temperature=temperature
        )

    async def update_actor(self, data: Any, *, actor_config: Any, temperature: float) -> dict:
        return await asyncio.to_thread(self.engine.update_actor, data, actor_config, temperature=temperature)

    async def update_weights(self) -> dict:
        return await asyncio.to_thread(self.engine.sync_sampler_weights)

    async def save_checkpoint(self, path: str, step: Optional[int]) -> str:
        return await asyncio.to_thread(self.engine.save_checkpoint, path, step)

    async def load_checkpoint(self, path: str, step: Optional[int]) -> dict:
        return await asyncio.to_thread(self.engine.load_checkpoint, path, step)

    async def generate(self, prompt_ids: Sequence[int], sampling_params: dict[str, Any]) -> dict[str, Any]:
        """Validate (raising ``ValueError`` before any work), enqueue, await the batched result."""
        request = self.engine.make_request(prompt_ids, sampling_params)
        future = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        self._ensure_batcher().set()
        return (await future).to_dict()

    def _ensure_batcher(self) -> asyncio.Event:
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.get_running_loop().create_task(self._batch_loop())
        return self._wakeup

    async def _batch_loop(self) -> None:
        cfg = self.engine.settings.backend
        assert self._wakeup is not None
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            if len(self._pending) < cfg.max_batch_size and cfg.batch_wait_ms > 0:
                await asyncio.sleep(cfg.batch_wait_ms / 1000.0)
            batch = self._pending[: cfg.max_batch_size]
            del self._pending[: cfg.max_batch_size]
            try:
                results = await asyncio.to_thread(self.engine.sample, [req for req, _ in batch])
            except BaseException as exc:  # fail the callers, keep serving
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            self.batches_run += 1
            for (_, fut), result in zip(batch, results):
                if not fut.done():
                    fut.set_result(result)


def remote_engine_class():
    """``ray.remote(EngineActor)`` (built lazily so this module imports without Ray)."""
    import ray

    return ray.remote(EngineActor)
