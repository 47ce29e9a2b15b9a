"""Stops what a run started when its driver dies without cleaning up (SIGKILL, the OOM killer).

Ray's fate sharing ends the raylet, the GCS and the job's workers with a driver that started its
own cluster, but not the raylet's dashboard and runtime-env agents, nor a process a worker
started in a session of its own (the launched Arctic server). The reaper is a small process in
its own session that the driver starts; it outlives the driver and stops those leftovers.
Run as ``python <this file> <driver pid>``: stdlib and psutil only, no verl import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

__all__ = ["is_running", "reap_after", "start_reaper"]

POLL_S = 1.0
GRACE_S = 5.0


def start_reaper() -> subprocess.Popen:
    """Start the reaper for this process (the driver). Returns its ``Popen``; it exits by itself."""
    return subprocess.Popen(
        # Run as a script, not ``-m``: importing the verl package would take seconds and ~GBs of torch.
        [sys.executable, os.path.abspath(__file__), str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a terminal's Ctrl-C reaches the driver's group, not the reaper
        close_fds=True,
    )


def reap_after(driver_pid: int, *, poll_s: float = POLL_S, grace_s: float = GRACE_S) -> list[int]:
    """Record ``driver_pid``'s descendants until it exits, then stop the survivors.

    Descendants are recorded every ``poll_s`` seconds; once the driver is gone each survivor
    gets SIGTERM, and SIGKILL ``grace_s`` seconds later.

    Returns the pids that were still running when the driver had gone (and were stopped).
    Processes are tracked as ``psutil.Process`` objects, so a recycled pid is never signalled.
    """
    import psutil

    me = os.getpid()
    seen: dict[int, psutil.Process] = {}
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:
        return []
    while True:
        try:
            for proc in driver.children(recursive=True):
                if proc.pid != me:
                    seen.setdefault(proc.pid, proc)
        except psutil.NoSuchProcess:
            pass
        if not is_running(driver):
            break
        time.sleep(poll_s)
    survivors = [proc for proc in seen.values() if is_running(proc)]
    for proc in survivors:
        _signal(proc, "terminate")
    _, still = psutil.wait_procs(survivors, timeout=grace_s)
    for proc in still:
        _signal(proc, "kill")
    return [proc.pid for proc in survivors]


def is_running(proc) -> bool:
    """``proc`` (a ``psutil.Process``) runs and is not a zombie (an exited orphan may never be reaped)."""
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(proc, how: str) -> None:
    import psutil

    try:
        getattr(proc, how)()
    except psutil.Error:
        pass


if __name__ == "__main__":
    reap_after(int(sys.argv[1]))
