"""Waiting for a process to exit, as the fault tests check that killed servers leave nothing behind."""

from __future__ import annotations

import time

import psutil


def gone(pid: int, within_s: float = 15) -> bool:
    """True once ``pid`` has exited within ``within_s`` seconds (a zombie of our own child counts as gone)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False
