"""The suite's own pytest plugins, each in a child pytest run:

* a test run that is killed leaves no server behind (support/reaping.py): the child starts a server
  in a session of its own, as the suite's Arctic stand-in and skyrl fixtures do, and is then killed
  by SIGKILL, by SIGTERM, or by pytest-timeout's per-test limit;
* under the test command a test skipped for a missing module fails (support/no_silent_skips.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.processes import gone

TESTS_DIR = Path(__file__).resolve().parents[1]

#: The child run's only test: a server in its own session (which starts a worker of its own, as
#: skyrl's API starts its engine), the pids written down, then a wait the parent cuts short.
CHILD_TEST = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from verl.remote_backend.reliability.server_process import ServerProcess

    WORKER = "import time; time.sleep(600)"
    SERVER = [sys.executable, "-c",
              f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {{WORKER!r}}]); time.sleep(600)"]

    def test_starts_a_server_and_waits(tmp_path):
        server = ServerProcess.start(SERVER, log_path=str(tmp_path / "server.log"))
        Path({pids!r}).write_text(str(server.proc.pid))
        time.sleep(600)
    """
)


def _child_env() -> dict[str, str]:
    """The environment of a child pytest run: ours, with ``tests/`` on its path (``support.*`` plugins)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}


def _start_child_run(tmp_path: Path, *pytest_args: str, reaping: bool = True) -> tuple[subprocess.Popen, Path]:
    pids = tmp_path / "server.pid"
    test_file = tmp_path / "test_child.py"
    test_file.write_text(CHILD_TEST.format(pids=str(pids)))
    env = _child_env()
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", *(["-p", "support.reaping"] if reaping else []),
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), *pytest_args, str(test_file)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not pids.exists() or not pids.read_text():
        assert child.poll() is None, child.stdout.read().decode(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the child run never started its server"
        time.sleep(0.2)
    time.sleep(2.5)  # the reaper records descendants once a second: let it see the server's worker
    return child, pids


def _session_members(leader_pid: int) -> list[int]:
    """The pids of every running process in the session ``leader_pid`` leads (the server and its worker)."""
    import psutil

    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == leader_pid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return members


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_killed_test_run_leaves_no_server_running(tmp_path, how):
    child, pids = _start_child_run(tmp_path)
    server = int(pids.read_text())
    members = _session_members(server)
    assert len(members) == 2, f"expected the server and its worker, found {members}"
    os.killpg(child.pid, getattr(signal, how))  # the pytest run's own group; the server is in its own session
    child.wait(timeout=60)
    assert all(gone(pid, within_s=20) for pid in members), f"left running: {_session_members(server)}"


def test_a_test_past_its_timeout_leaves_no_server_running(tmp_path):
    child, pids = _start_child_run(tmp_path, "--timeout=8")
    members = _session_members(int(pids.read_text()))
    assert len(members) == 2
    out, _ = child.communicate(timeout=120)
    assert child.returncode != 0 and b"Timeout" in out, out.decode(errors="replace")[-3000:]
    assert all(gone(pid, within_s=20) for pid in members), f"left running: {members}"


def test_without_the_reaper_a_killed_run_leaves_its_server_running(tmp_path):
    """The control: the same run without the plugin loses its server (what CI saw before)."""
    child, pids = _start_child_run(tmp_path, reaping=False)
    members = _session_members(int(pids.read_text()))
    try:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        assert not any(gone(pid, within_s=8) for pid in members)
    finally:
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


MISSING_EXTRA_TESTS = textwrap.dedent(
    """
    import pytest

    def test_needs_an_extra():
        pytest.importorskip("no_such_extra_module")

    def test_skips_for_its_own_reason():
        pytest.skip("not a missing module")
    """
)


@pytest.mark.parametrize("tagged", [True, False], ids=["test-command", "by-hand"])
def test_a_skip_for_a_missing_module_fails_under_the_test_command_only(tmp_path, tagged):
    (tmp_path / "test_child.py").write_text(MISSING_EXTRA_TESTS)
    env = _child_env()
    env.pop("VRB_TEST_RUN", None)
    if tagged:
        env["VRB_TEST_RUN"] = "plugin-test"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "support.no_silent_skips", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "test_child.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    summary = result.stdout.strip().splitlines()[-1]
    expected = "1 failed, 1 skipped" if tagged else "2 skipped"
    assert summary.startswith(expected), result.stdout[-2000:]
    if tagged:
        assert "FAILED test_child.py::test_needs_an_extra" in result.stdout, result.stdout[-2000:]


def test_the_ci_leftover_check_lists_a_tagged_process_and_fails_until_it_is_gone(tmp_path):
    script = TESTS_DIR.parent / "scripts" / "leftover_processes.py"
    tag = f"leftover-check-{os.getpid()}"
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, "VRB_TEST_RUN": tag}
    )
    try:
        found = subprocess.run([sys.executable, str(script), tag, "--wait", "1"], capture_output=True, text=True)
        assert found.returncode == 1, found.stdout
        assert f"pid {sleeper.pid}: " in found.stdout and "time.sleep(120)" in found.stdout, found.stdout
    finally:
        sleeper.kill()
        sleeper.wait()
    clean = subprocess.run([sys.executable, str(script), tag, "--wait", "5"], capture_output=True, text=True)
    assert clean.returncode == 0 and "none of test run" in clean.stdout, clean.stdout
