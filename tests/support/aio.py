"""The suite's one way to run a coroutine from a synchronous test, optionally with a hard cap."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Coroutine, Optional


class Hang(AssertionError):
    """A bounded wait ran out: the fault did not surface."""


async def bounded(awaitable: Awaitable[Any], cap_s: float) -> Any:
    """Await with a hard cap; past it raise :class:`Hang` (so a hang never blocks the suite)."""
    # not asyncio.wait_for: the errors under test (BackendTimeoutError) are TimeoutErrors themselves
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=cap_s)
    if not done:
        task.cancel()
        raise Hang(f"no result within {cap_s}s")
    return task.result()


def run_async(coro: Coroutine[Any, Any, Any], cap_s: Optional[float] = None) -> Any:
    """``coro``'s result, run on a fresh event loop; with ``cap_s``, :class:`Hang` once it has run that long."""
    return asyncio.run(coro if cap_s is None else bounded(coro, cap_s))


class FaultTimer:
    """Seconds from a fault's injection to the end of the call it hit (:func:`call_then_inject`)."""

    seconds: float = float("nan")


async def call_then_inject(
    inject: Callable[[], None], call: Awaitable[Any], *, delay_s: float, timer: Optional[FaultTimer] = None
) -> Any:
    """Start ``call``, inject a fault ``delay_s`` later while it is still in flight (asserted), and
    return its result (or raise its error); ``timer.seconds`` = injection to end of the call."""
    task = asyncio.ensure_future(call)
    await asyncio.sleep(delay_s)
    assert not task.done(), "the call finished before the fault was injected"
    inject()
    started = time.monotonic()
    try:
        return await task
    finally:
        if timer is not None:
            timer.seconds = time.monotonic() - started
