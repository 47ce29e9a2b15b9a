"""``BackendGuard``: every backend call under a time limit, a liveness watchdog and the retry policy.

Used by the forwarder and the rollout server (async ops) and by the trainer
(:func:`run_with_timeout` for create/destroy). It knows nothing of Ray or HTTP: liveness uses
the backend's optional ``health()`` / ``log_location()`` (see :mod:`.base`). A dead backend
fails every in-flight and later call at once; only idempotent ops are re-sent, after
transport errors; the backend's own input errors pass through unchanged.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import random
import threading
from typing import Any, Awaitable, Callable, Optional, TypeVar

from verl.remote_backend.base import log_location, supports_health
from verl.remote_backend.errors import BackendDiedError, BackendStoppedError, BackendTimeoutError
from verl.remote_backend.reliability.policy import (
    ReliabilitySettings,
    is_death_error,
    is_retryable,
    is_stop_error,
    timeout_key,
)

__all__ = ["BackendGuard", "run_with_timeout"]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

T = TypeVar("T")

# The backend's own verdict on its input or config: never a sign of death, never retried.
_INPUT_ERRORS = (ValueError, TypeError, KeyError, NotImplementedError)
# Longest quoted cause in a death message (Ray's actor-death text runs to pages).
_CAUSE_CHARS = 400


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= _CAUSE_CHARS else text[:_CAUSE_CHARS] + " ..."


class BackendGuard:
    """Wraps one backend client; every call of the forwarder or rollout server goes through it.

    Args:
        backend: the (re-attached) backend client.
        name: its registry name, quoted in errors.
        settings: ``remote_backend.{timeouts, liveness, retry}``.
        rng: random source of the retry jitter (tests pin it).
    """

    def __init__(
        self, backend: Any, *, name: str, settings: ReliabilitySettings, rng: Optional[random.Random] = None
    ) -> None:
        self.backend = backend
        self.name = name
        self.settings = settings
        self._rng = rng or random.Random()
        self._watch_health = settings.liveness.enabled and supports_health(backend)
        self._dead: Optional[BackendDiedError] = None
        self._stopped = False  # the death was a ray.kill (BackendStoppedError), not a crash
        # Event-loop-bound state, rebuilt when the running loop changes (tests use asyncio.run per call).
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._death: Optional[asyncio.Future] = None
        self._watchdog: Optional[asyncio.Task] = None
        self._inflight = 0

    @property
    def dead(self) -> Optional[BackendDiedError]:
        """The error that declared the backend dead, or ``None`` while it is believed alive."""
        return self._dead

    # ------------------------------------------------------------ calls
    async def call(self, op: str, factory: Callable[[], Awaitable[T]]) -> T:
        """``await factory()`` as backend op ``op``: returns its result, or raises within the op's
        limit (``remote_backend.timeouts.<op>``) plus at most one health probe.

        A backend found dead (a Ray actor-death error, a failed call followed by a failed probe,
        or ``liveness.failures`` failed probes while calls run) fails this and every later call
        with :class:`BackendDiedError` at once. Only idempotent ops are re-sent, after transport
        errors, with backoff (``is_retryable``); the backend's own input errors pass through."""
        delays = self.settings.retry.delays(self._rng)
        while True:
            if self._dead is not None:
                raise self._died(op, f"it was found dead earlier ({self._dead.args[0][:_CAUSE_CHARS]})")
            try:
                return await self._once(op, factory)
            except (BackendTimeoutError, BackendDiedError, asyncio.CancelledError):
                raise  # the guard's own verdicts (an adapter's BackendError is retried or diagnosed like any error)
            except Exception as exc:
                if is_retryable(op, exc):
                    delay = next(delays, None)
                    if delay is not None:
                        logger.warning(
                            "remote backend %r: %s failed (%s); retrying in %.2fs", self.name, op, _short(exc), delay
                        )
                        await asyncio.sleep(delay)
                        continue
                died = await self._diagnose(op, exc)
                if died is not None:
                    raise died from exc
                raise

    async def probe(self) -> Optional[str]:
        """One health probe within ``timeouts.health``: ``None`` if healthy, else what failed.
        Always ``None`` for backends without ``health()``."""
        if not supports_health(self.backend):
            return None
        limit = self.settings.timeouts.limit("health")
        try:
            await asyncio.wait_for(self.backend.health(), timeout=limit)
            return None
        except asyncio.TimeoutError:
            return f"no answer to health() within {limit:g}s ({timeout_key('health')})"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the probe is the answer
            return _short(exc)

    async def _once(self, op: str, factory: Callable[[], Awaitable[T]]) -> T:
        self._bind_loop()
        limit = self.settings.timeouts.limit(op)
        task = asyncio.ensure_future(factory())
        self._inflight += 1
        self._ensure_watchdog()
        try:
            assert self._death is not None
            done, _ = await asyncio.wait({task, self._death}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                return task.result()
            _abandon(task)
            if self._death.done():
                raise self._died(op, self._death.result())
            raise BackendTimeoutError(
                op=op,
                backend=self.name,
                limit_s=float(limit or 0),
                key=timeout_key(op),
                detail=f"Its logs: {log_location(self.backend)}.",  # where the engine is (an HTTP server's address)
            )
        except asyncio.CancelledError:
            _abandon(task)
            raise
        finally:
            self._inflight -= 1

    async def _diagnose(self, op: str, exc: BaseException) -> Optional[BackendDiedError]:
        """After ``op`` failed with ``exc``: is the backend dead? (marks it so)."""
        if is_death_error(exc):
            return self._mark_dead(op, _short(exc), stopped=is_stop_error(exc))
        if isinstance(exc, _INPUT_ERRORS):
            return None
        failure = await self.probe()
        if failure is None:
            return None
        return self._mark_dead(op, f"{op} failed ({_short(exc)}) and the health probe failed too ({failure})")

    # ------------------------------------------------------------ liveness
    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._watchdog, self._inflight = loop, None, 0
            self._death = loop.create_future()

    def _ensure_watchdog(self) -> None:
        if self._watch_health and (self._watchdog is None or self._watchdog.done()):
            self._watchdog = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        """Probe while calls are in flight; declare death after ``liveness.failures`` failed probes."""
        live = self.settings.liveness
        failures = 0
        while self._inflight > 0 and self._dead is None:
            await asyncio.sleep(
                live.interval_s
                if failures == 0
                else min(live.interval_s, self.settings.retry.delay(failures, self._rng))
            )
            if self._inflight == 0 or self._dead is not None:
                return
            failure = await self.probe()
            if failure is None:
                failures = 0
                continue
            failures += 1
            logger.warning(
                "remote backend %r: health probe %d/%d failed: %s", self.name, failures, live.failures, failure
            )
            if failures >= live.failures:
                self._mark_dead("a call", f"{failures} consecutive health probes failed (last: {failure})")
                return

    def _mark_dead(self, op: str, cause: str, *, stopped: bool = False) -> BackendDiedError:
        if self._dead is None:
            self._stopped = stopped
            self._dead = self._died(op, cause)
            # a stop is the consequence of another failure: never the first error on screen
            (logger.warning if stopped else logger.error)("%s", self._dead)
            if self._death is not None and not self._death.done():
                self._death.set_result(cause)
        return self._dead

    def _died(self, op: str, cause: str) -> BackendDiedError:
        cls = BackendStoppedError if self._stopped else BackendDiedError
        return cls(op=op, backend=self.name, logs=log_location(self.backend), cause=cause)


def _abandon(task: asyncio.Future) -> None:
    """Cancel a backend call we no longer wait for, and swallow its eventual outcome."""
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


def run_with_timeout(fn: Callable[[], Any], *, op: str, backend: str, limit_s: Optional[float]) -> Any:
    """Call a backend op from synchronous code (``from_config``, ``destroy_backend``) within
    ``limit_s``. An awaitable result is awaited on the same worker thread. On timeout the thread is abandoned (it
    is a daemon) and :class:`BackendTimeoutError` names the op, the backend and the key.
    """

    def _target() -> None:
        try:
            result = fn()
            if inspect.isawaitable(result):
                result = asyncio.run(_await(result))
            box["value"] = result
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    box: dict[str, Any] = {}
    thread = threading.Thread(target=_target, name=f"remote-backend-{op}", daemon=True)
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        raise BackendTimeoutError(op=op, backend=backend, limit_s=float(limit_s or 0), key=timeout_key(op))
    if "error" in box:
        raise box["error"]
    return box.get("value")


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
