"""One e2e scenario, one run per test session: a run several test files assert on is made by the
first pytest-xdist worker that needs it, and every other worker reads its result.

Session-scoped fixtures are per process, so under ``--dist loadfile`` two files on two workers
would each start the same multi-minute verl run. :func:`once_per_session` keys a run by name in a
folder all workers of the session share, builds it under a file lock (a second worker waits for
the first, which costs no more than building it again and saves the CPU), and keeps the pickled
result there for the rest of the session.
"""

from __future__ import annotations

import fcntl
import os
import pickle
from pathlib import Path
from typing import Callable, TypeVar

__all__ = ["once_per_session", "session_root"]

T = TypeVar("T")


def session_root(tmp_path_factory) -> Path:
    """A folder of this test session shared by all its workers: pytest's base temporary folder, or
    under pytest-xdist its parent (each worker's base is ``<session>/popen-gwN``)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_session(tmp_path_factory, key: str, build: Callable[[], T]) -> T:
    """``build()``'s result for ``key``: built once in the session (by whichever worker asks
    first), then read back by every later caller in any worker. ``build`` must return a picklable
    value whose paths stay valid for the session (e.g. folders made with ``tmp_path_factory``).
    A build that raises leaves nothing behind: the next caller builds again."""
    folder = session_root(tmp_path_factory) / "shared-runs"
    folder.mkdir(exist_ok=True)
    result = folder / f"{key}.pickle"
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if result.exists():
            return pickle.loads(result.read_bytes())
        value = build()
        partial = result.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(value))
        partial.rename(result)
        return value
