"""The ``local`` engine's Ray actor: an async front for :class:`~.engine.LocalEngine`.

It exists so that one engine can serve verl's concurrent callers: compute runs on the engine's
own compute thread while the actor's event loop keeps accepting calls, which is what lets
concurrent ``generate`` calls be decoded as one continuous batch. The class is plain Python;
:func:`remote_engine_class` wraps it with ``ray.remote``, so importing this module needs no Ray.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import time
from typing import Any, Callable, Optional, Sequence, TypeVar

from verl.remote_backend.results import GenerateResult, LogProbResult, UpdateResult

from .config import EngineSettings
from .engine import LocalEngine
from .malloc import release_freed_memory
from .sampler import SampleRequest
from .transport import LogProbWire

__all__ = ["EngineActor", "remote_engine_class", "use_threads"]

R = TypeVar("R", LogProbResult, UpdateResult)
T = TypeVar("T")


def use_threads(requested: Optional[int]) -> int:
    """Size torch's intra-op thread pool of this process (the engine actor's, which it owns) and
    return the size: ``requested``, or ``None`` = every core the process may run on (its CPU
    affinity; Ray's ``OMP_NUM_THREADS``, set from the actor's ``num_cpus``, is overridden)."""
    import torch

    if requested:
        threads = int(requested)
    elif hasattr(os, "sched_getaffinity"):
        threads = len(os.sched_getaffinity(0))
    else:  # macOS: no affinity masks
        threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    return threads


class EngineActor:
    """Ray actor body owning one :class:`LocalEngine`.

    Every method is ``async``; all torch work, the engine's construction included, runs on one
    compute thread that the actor owns (see :meth:`_compute`). Concurrent
    ``generate`` calls queue up; one batching task decodes up to ``max_batch_size`` of them
    together, admits queued requests between decode steps, and answers each caller as soon
    as its own row finishes. Admission rule of an idle engine: after the first arrival, wait
    until ``batch_wait_ms`` pass with no new arrival (a burst's calls arrive one by one), at
    most ``20 * batch_wait_ms`` in all, or until ``max_batch_size`` are queued; then admit
    them together. When the sampler shares the trained weights, training calls first drain
    the decode batch (held-back requests are admitted after).
    """

    def __init__(self, settings: EngineSettings) -> None:
        # A constructor error would surface as Ray's generic "actor died"; keep it and
        # raise it from info() instead, so the client can re-raise the engine's own error.
        self.init_error: Optional[BaseException] = None
        self._heap_keep_free_bytes = settings.backend.heap_keep_free_bytes
        self._compute_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine-compute")
        # sized before the engine measures its peak
        self.threads = self._compute_thread.submit(use_threads, settings.backend.threads).result()
        try:
            self.engine = self._compute_thread.submit(LocalEngine, settings).result()
        except Exception as exc:
            self.init_error = exc
            return
        self._batch = self.engine.decode_batch()
        self._pending: list[tuple[asyncio.Future, SampleRequest]] = []
        self._wakeup: Optional[asyncio.Event] = None
        self._batcher: Optional[asyncio.Task] = None
        self._admission_paused = 0  # > 0 while some call needs the decode batch drained
        self._step_in_flight = False
        self.batches_run = 0  # admission events (prefills), for tests and the benchmark
        self.peak_rows = 0  # most rows ever decoded together (bounded by max_batch_size)
        self._prefill_reported = (0, 0, 0)  # (decode batch id, its prefill counters) at the last update

    async def _compute(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the compute thread, awaited without blocking the event loop.

        Why one thread: torch's OpenMP runtime (libgomp) gives every thread that starts a parallel
        region its own team of workers; once teams outnumber the cores, it stops letting idle
        workers spin and every parallel region has to wake them from sleep. Run on a second
        thread beside the one that built the engine, an update of the main job's shape (24 rows,
        SmolLM2-135M, 2 cores, in one process) took 32.5 s at 177 % CPU instead of 27.7 s at 198 %.
        """
        return await asyncio.get_running_loop().run_in_executor(
            self._compute_thread, functools.partial(fn, *args, **kwargs)
        )

    async def info(self) -> dict[str, Any]:
        if self.init_error is not None:
            raise self.init_error
        return {
            **self.engine.info(),
            "batches_run": self.batches_run,
            "threads": self.threads,
            # the sampler's request bookkeeping: both 0 once every request has been answered
            "pending_requests": len(self._pending),
            "decoding_rows": len(self._batch),
            "peak_rows": self.peak_rows,
            # prefill work of the current decode batch (since start or the last failed step): real
            # tokens of the distinct prompts prefilled, and rows that reused another row's prefill
            "prefill_tokens": self._batch.prefill_tokens,
            "prefill_rows_shared": self._batch.prefill_rows_shared,
        }

    async def compute_log_prob(
        self, data: Any, *, ref: bool, calculate_entropy: bool, temperature: float
    ) -> LogProbWire:
        result = await self._compute(
            self._then_release,
            functools.partial(
                _timed,
                self.engine.compute_log_prob,
                data,
                ref=ref,
                calculate_entropy=calculate_entropy,
                temperature=temperature,
            ),
        )
        return LogProbWire.of(result)  # numpy through the object store; the client rebuilds the result

    async def update_actor(self, data: Any, *, actor_config: Any, temperature: float) -> UpdateResult:
        """The engine's update, plus the sampler's prefill work since the previous update
        (``sampler_prefill_tokens``: prompt tokens prefilled; ``sampler_rows_sharing_a_prefill``:
        requests that reused the prefill of an identical prompt), logged by verl as ``actor/*``.
        Both depend on which requests arrived in the same burst, so, like timings, they can
        differ between two runs with the same seeds; what the rows sample does not."""
        fn = functools.partial(_timed, self.engine.update_actor, data, actor_config, temperature=temperature)
        if not self.engine.shares_sampler_weights:
            result = await self._compute(self._then_release, fn)
        else:
            result = await self._with_sampler_drained(fn)
        result.metrics.update(self._prefill_since_last_update())
        return result

    def _prefill_since_last_update(self) -> dict[str, float]:
        now = (id(self._batch), self._batch.prefill_tokens, self._batch.prefill_rows_shared)
        last = self._prefill_reported if self._prefill_reported[0] == now[0] else (now[0], 0, 0)  # new batch
        self._prefill_reported = now
        return {
            "sampler_prefill_tokens": float(now[1] - last[1]),
            "sampler_rows_sharing_a_prefill": float(now[2] - last[2]),
        }

    async def save_checkpoint(self, path: str, step: Optional[int]) -> str:
        return await self._compute(self._then_release, functools.partial(self.engine.save_checkpoint, path, step))

    async def load_checkpoint(self, path: str, step: Optional[int]) -> dict:
        return await self._with_sampler_drained(functools.partial(self.engine.load_checkpoint, path, step))

    async def generate(self, prompt_ids: Sequence[int], sampling_params: dict[str, Any]) -> GenerateResult:
        """Validate (raising ``ValueError`` before any work), enqueue, await the result."""
        request = self.engine.make_request(prompt_ids, sampling_params)
        future = asyncio.get_running_loop().create_future()
        self._pending.append((future, request))
        self._ensure_batcher().set()
        return (await future).to_result()

    async def update_weights(self) -> dict:
        """Sync the sampler once the running decode batch has drained.

        New requests are held back meanwhile, so every request is decoded
        entirely with one policy version: in-flight ones with the old weights,
        later ones with the new.
        """
        return await self._with_sampler_drained(self.engine.sync_sampler_weights)

    async def _with_sampler_drained(self, fn: Callable[[], Any]) -> Any:
        """Hold back new requests, wait for the running decode batch to finish, run ``fn`` on the compute thread."""
        self._admission_paused += 1
        try:
            while len(self._batch) or self._step_in_flight:
                await asyncio.sleep(0.002)
            return await self._compute(self._then_release, fn)
        finally:
            self._admission_paused -= 1
            if self._wakeup is not None:
                self._wakeup.set()

    def _ensure_batcher(self) -> asyncio.Event:
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.get_running_loop().create_task(self._batch_loop())
        return self._wakeup

    async def _batch_loop(self) -> None:
        """Continuous batching: between decode steps, admit queued requests into the running batch."""
        cfg = self.engine.settings.backend
        assert self._wakeup is not None
        while True:
            if not len(self._batch) and (not self._pending or self._admission_paused):
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if not len(self._batch) and cfg.batch_wait_ms > 0:
                await self._gather_burst(cfg.batch_wait_ms / 1000.0, cfg.max_batch_size)
            admit: list = []
            if not self._admission_paused:
                room = cfg.max_batch_size - len(self._batch)
                admit, self._pending = self._pending[:room], self._pending[room:]
            self._step_in_flight = True
            try:
                finished = await self._compute(self.engine.decode_step, self._batch, admit)
            except BaseException as exc:  # fail every caller in the batch, keep serving
                failed = [fut for fut, _ in admit] + list(self._batch.keys)
                self._batch = self.engine.decode_batch()
                for fut in failed:
                    if not fut.done():
                        fut.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            finally:
                self._step_in_flight = False
            if admit:
                self.batches_run += 1
            self.peak_rows = max(self.peak_rows, len(self._batch) + len(finished))
            for fut, result in finished:
                if not fut.done():
                    fut.set_result(result)
            if finished and not len(self._batch):  # the burst is decoded: its KV cache was freed
                await self._compute(release_freed_memory, self._heap_keep_free_bytes)

    def _then_release(self, fn: Callable[[], T]) -> T:
        """``fn()``, then hand the memory it freed back to the system once more than
        ``heap_keep_free_gib`` is free (:func:`release_freed_memory`), so that the engine's
        resident memory does not grow from call to call. Runs on the compute thread."""
        try:
            return fn()
        finally:
            release_freed_memory(self._heap_keep_free_bytes)

    async def _gather_burst(self, gap_s: float, limit: int) -> None:
        """Wait while a burst is still arriving: until ``gap_s`` passes without a new request,
        ``limit`` requests are queued, or ``20 * gap_s`` has passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20 * gap_s
        seen = len(self._pending)
        while seen < limit and loop.time() < deadline:
            await asyncio.sleep(min(gap_s, max(0.0, deadline - loop.time())))
            if len(self._pending) == seen:
                return
            seen = len(self._pending)


def _timed(op: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """Run ``op`` and set its result's ``compute_s``: the seconds spent computing, measured in
    the compute thread itself so that Ray transport and thread hand-off stay on the plugin's
    side of the ledger."""
    start = time.perf_counter()
    result = op(*args, **kwargs)
    result.compute_s = time.perf_counter() - start
    return result


def remote_engine_class():
    """``ray.remote(EngineActor)`` (built lazily so this module imports without Ray)."""
    import ray

    return ray.remote(EngineActor)
