"""Small file systems made by a test: a size-limited tmpfs that fills up, and the same read-only."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(where: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` (rounded up to 4 KiB pages by the kernel) mounted at ``where``,
    unmounted afterwards. Skips the test, with the reason, where this machine cannot mount one
    (not root, or a container without ``CAP_SYS_ADMIN``)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={int(size_bytes)}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here ({mounted.stderr.strip() or 'mount failed'}): needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def remount_read_only(where: Path) -> None:
    """Make the tmpfs at ``where`` read-only (writes then fail with ``EROFS``, even for root)."""
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)


def fill(where: Path, leave_bytes: int = 0) -> None:
    """Write a filler file until at most ``leave_bytes`` are free on ``where``'s file system."""
    import shutil

    free = shutil.disk_usage(where).free - leave_bytes
    with open(where / "filler", "wb") as fh:
        chunk = b"\0" * (1 << 16)
        while free > 0:
            try:
                fh.write(chunk[: min(len(chunk), free)])
                fh.flush()
            except OSError:
                break
            free -= len(chunk)
