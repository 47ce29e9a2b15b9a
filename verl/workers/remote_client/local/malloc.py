"""The local engine process's C heap: the glibc settings Ray starts it with, and the trim that
hands freed memory back to the system after an engine call.

Why: the engine allocates tensors of shapes that change from step to step (prompt and response
lengths vary), and glibc keeps freed blocks in its heaps; without a policy the engine's resident
memory grows with every step until Ray's memory monitor kills it. Numbers: ``ENGINE_MALLOC_ENV``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Optional

__all__ = ["ENGINE_MALLOC_ENV", "KEEP_FREE_BYTES", "engine_malloc_env", "free_heap_bytes", "release_freed_memory"]

#: glibc malloc settings for the engine's process; Ray starts the process with them (glibc reads
#: them only when a process starts); a variable already set in the caller's environment wins.
#: ``MALLOC_ARENA_MAX=2``: every thread that allocates would otherwise get its own heaps (Ray and
#: ``asyncio.to_thread`` use many), each keeping its own freed memory.
#: ``MALLOC_MMAP_THRESHOLD_=8 MiB``: blocks from 8 MiB (logits, attention scores, the optimizer's
#: temporaries) are mapped and unmapped, so they never fragment the heaps; a fixed value also stops
#: glibc raising the threshold to the largest block freed (up to 32 MiB). Smaller blocks (the
#: activations of a micro-batch, a few MB each) are reused from the heaps: at 1 MiB they were
#: mapped afresh each time and the main job's update took 42.1 s instead of 33.3 s (medians;
#: actor MFU 0.47 against 0.64; SmolLM2-135M, 2 cores; examples/gsm8k_remote/README.md).
#: ``MALLOC_TRIM_THRESHOLD_=1 GiB``: with a fixed mmap threshold glibc's trim threshold stays at
#: 128 KiB, so freeing a temporary at the top of a heap gave its pages back at once and the next
#: one faulted them in again (an elementwise op on ``[24, 49152]`` logits took 1.5 ms instead of
#: 0.2 ms); the heaps now keep their free memory during a call, and after it
#: :func:`release_freed_memory` hands it back once more than :data:`KEEP_FREE_BYTES` are free.
ENGINE_MALLOC_ENV = {
    "MALLOC_ARENA_MAX": "2",
    "MALLOC_MMAP_THRESHOLD_": str(8 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
}


def engine_malloc_env() -> dict[str, str]:
    """:data:`ENGINE_MALLOC_ENV` without the variables the caller's environment already sets."""
    return {key: value for key, value in ENGINE_MALLOC_ENV.items() if key not in os.environ}


#: Free memory the heaps may keep between calls: below it nothing is handed back, so the next
#: call reuses it without faulting its pages in again; above it everything free is handed back.
#: (On the main job, trimming after every call and trimming above 1 GiB gave the same step times
#: within their run-to-run spread; the engine peaked at 8.4 and 8.2 GB.)
KEEP_FREE_BYTES = 1 << 30


_MALLINFO2_FIELDS = (
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
)


class _Mallinfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (all ``size_t``); ``fordblks`` = free bytes in the heaps."""

    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2_FIELDS]


@functools.lru_cache(maxsize=1)
def _glibc() -> Optional[ctypes.CDLL]:
    """The C library if it is glibc with ``malloc_trim`` and ``mallinfo2`` (2.33+), else ``None``."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):
        return None
    return libc


def free_heap_bytes() -> Optional[int]:
    """Bytes free inside this process's malloc heaps (all arenas), or ``None`` without glibc."""
    libc = _glibc()
    return int(libc.mallinfo2().fordblks) if libc is not None else None


def release_freed_memory(keep_free_bytes: int = KEEP_FREE_BYTES) -> bool:
    """Hand the free pages of every malloc heap back to the system (``malloc_trim(0)``: heap tops
    and whole free pages inside them) once more than ``keep_free_bytes`` are free in the heaps.
    Called by the engine actor after each training, log-prob and checkpoint call and when its
    decode batch empties; costs a few ms when it trims.

    Returns whether memory was handed back (``False`` where glibc is absent: a no-op)."""
    free = free_heap_bytes()
    if free is None or free <= keep_free_bytes:
        return False
    return bool(_glibc().malloc_trim(0))
