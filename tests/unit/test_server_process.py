"""``ServerProcess``: a launched server's whole process session ends with it, its log is kept."""

from __future__ import annotations

import os
import time

from verl.remote_backend.reliability.server_process import ServerProcess

# A leader that exits on SIGTERM and a worker that ignores SIGTERM: what an engine server's
# spawned workers can look like. The worker writes its pid so the test can watch it.
SCRIPT = """
(trap '' TERM; echo $BASHPID > "$1"; while true; do sleep 0.1; done) &
echo leader up
wait
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _worker_pid(path: str) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if os.path.exists(path) and open(path).read().strip():
            return int(open(path).read())
        time.sleep(0.05)
    raise AssertionError("the worker did not start")


def test_stop_ends_workers_that_ignore_sigterm_and_keeps_the_log(tmp_path):
    pid_file = str(tmp_path / "worker.pid")
    server = ServerProcess.start(
        ["bash", "-c", SCRIPT, "bash", pid_file], log_path=str(tmp_path / "logs" / "s.log"), address="127.0.0.1:0"
    )
    worker = _worker_pid(pid_file)
    assert server.alive() and _running(worker)
    server.stop(timeout_s=2)
    assert not server.alive()
    deadline = time.monotonic() + 5
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(worker), "a worker that ignored SIGTERM outlived stop()"
    assert "leader up" in server.tail()
    server.stop()  # idempotent


def test_kill_ends_the_session_at_once(tmp_path):
    pid_file = str(tmp_path / "worker.pid")
    server = ServerProcess.start(["bash", "-c", SCRIPT, "bash", pid_file], log_path=str(tmp_path / "s.log"))
    worker = _worker_pid(pid_file)
    server.kill()
    assert server.proc.returncode == -9
    deadline = time.monotonic() + 5
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(worker)
