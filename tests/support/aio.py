"""The suite's one way to run a coroutine from a synchronous test, optionally with a hard cap."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Coroutine, Optional


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
