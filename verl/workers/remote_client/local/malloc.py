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

#: Free memory the heap may keep between calls by default
#: (``remote_backend.local.heap_keep_free_gib`` sets it): below it nothing is handed back, so the
#: next call reuses it without faulting its pages in again; above it everything free is handed back.
#: The main job's update works in ~2.5 GB; kept at 1 GiB, every update faulted it in again in its
#: first 10-15 s (up to 80k faults/s, ~70 % of a core in the kernel on this VM) and steps 1-3 took
#: 38.6, 38.1 and 36.0 s; kept at 4 GiB, 38.8, 33.2 and 30.5 s, and the whole default job peaked at
#: 8.5 GB (8.2 GB at 1 GiB with blocks from 8 MiB mapped).
KEEP_FREE_BYTES = 4 << 30


#: glibc malloc settings for the engine's process; Ray starts the process with them (glibc reads
#: them only when a process starts); a variable already set in the caller's environment wins.
#: ``MALLOC_ARENA_MAX=1`` and ``MALLOC_MMAP_MAX_=0``: every block, whatever its size and whichever
#: thread asks, comes from the one main heap, and a freed block is reused by the next allocation
#: of the call instead of being unmapped. Otherwise the blocks above the mmap threshold (a
#: micro-batch's vocabulary logits and their gradients, 70-115 MB each on SmolLM2-135M, the
#: optimizer's temporaries) are mapped afresh and page-faulted in on every use, and the compute
#: thread's own arena hands its 64 MiB heaps back whenever they empty. In the engine actor the
#: update of the main job's batch (24 rows, micro-batches of 4) took 2.0M page faults and
#: 32.5-35.9 s with ``MALLOC_ARENA_MAX=2, MALLOC_MMAP_THRESHOLD_=8 MiB``, 0.72-0.85M and 31.0-33.1 s
#: with these two (trim threshold 1 GiB; ``sys`` time 6-8 s against 3-5 s). Earlier: a 1 MiB mmap
#: threshold made that update 42.1 s instead of 33.3 s.
#: ``MALLOC_TRIM_THRESHOLD_=4 GiB`` (:data:`KEEP_FREE_BYTES`): freeing a block at the top of the
#: heap would otherwise give its pages back at once (glibc's default: 128 KiB) and the next one
#: would fault them in again (an elementwise op on ``[24, 49152]`` logits took 1.5 ms instead of
#: 0.2 ms); the heap keeps its free memory during a call, and after it :func:`release_freed_memory`
#: hands it back once more than :data:`KEEP_FREE_BYTES` are free, whole free pages inside the heap
#: included, so a heap that cannot shrink from the top still does not hold resident memory.
ENGINE_MALLOC_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(KEEP_FREE_BYTES),
}


def engine_malloc_env(keep_free_bytes: int = KEEP_FREE_BYTES) -> dict[str, str]:
    """:data:`ENGINE_MALLOC_ENV` with the trim threshold at ``keep_free_bytes`` (the engine's
    ``remote_backend.local.heap_keep_free_gib``), without the variables the caller's environment
    already sets."""
    env = {**ENGINE_MALLOC_ENV, "MALLOC_TRIM_THRESHOLD_": str(keep_free_bytes)}
    return {key: value for key, value in env.items() if key not in os.environ}


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
