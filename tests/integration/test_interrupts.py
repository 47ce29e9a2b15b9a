"""Ctrl-C handling, the failure block printed first, and the reaper of a killed driver's processes.

The full-run versions (a real Ctrl-C and a real ``kill -9`` of ``main_ppo``) are in the fault suite
(``tests/faults/test_fault_injection_slow.py``); these prove the pieces one by one.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from verl.remote_backend.errors import BackendDiedError, RunInterruptedError
from verl.remote_backend.launch.failure_report import failure_report, root_cause
from verl.remote_backend.launch.interrupts import (
    interrupt_report,
    raise_if_interrupted,
    resume_command,
    sigint_raises_keyboard_interrupt,
)
from verl.remote_backend.launch.reaper import is_running


# ---------------------------------------------------------------- the failure block
def test_the_failure_block_starts_with_the_innermost_cause_behind_rays_wrappers(tmp_path):
    from ray.exceptions import RayTaskError

    cause = BackendDiedError(op="update_actor", backend="local", logs="/logs/engine.err", cause="ActorDiedError")
    inner = RayTaskError("RemoteBackendWorker.update_actor", "Traceback ...\nworker frames", cause)
    outer = RayTaskError("TaskRunner.run", "Traceback ...\nrunner frames", inner.as_instanceof_cause())
    wrapped = outer.as_instanceof_cause()
    assert root_cause(wrapped) is cause

    lines = failure_report(wrapped, run_dir=str(tmp_path)).splitlines()
    assert lines[0] == (
        "[remote_backend] run failed: BackendDiedError: remote backend 'local' died during update_actor: "
        "ActorDiedError. Its logs: /logs/engine.err. Nothing was re-sent; restart the backend and resume from "
        "the last complete checkpoint (trainer.resume_mode=auto)."
    )
    assert lines[1].startswith("  logs: " + str(tmp_path)) and lines[-1] == "  (the full traceback follows)"


def test_the_failure_block_keeps_the_fix_lines_of_a_multi_line_message():
    from verl.remote_backend.errors import ConfigError

    err = ConfigError("data.train_batch_size=6: not a multiple of ppo_mini_batch_size=4.\nFix: set 8 or 4")
    lines = failure_report(err).splitlines()
    assert lines[0] == (
        "[remote_backend] run failed: ConfigError: data.train_batch_size=6: not a multiple of ppo_mini_batch_size=4."
    )
    assert lines[1] == "  Fix: set 8 or 4"


# ---------------------------------------------------------------- Ctrl-C report
def test_resume_command_replaces_the_resume_mode_and_quotes_what_the_shell_needs():
    argv = [
        "/venv/lib/python3.12/site-packages/verl/remote_backend/main_ppo.py",
        "trainer.remote_backend=local",
        "trainer.resume_mode=disable",
        "trainer.logger=[console,file]",
        "trainer.default_local_dir=/ckpt dir",
    ]
    command = resume_command(argv)
    assert command.startswith("python -m verl.remote_backend.main_ppo ")
    assert shlex.split(command)[3:] == [
        "trainer.remote_backend=local",
        "trainer.logger=[console,file]",
        "trainer.default_local_dir=/ckpt dir",
        "trainer.resume_mode=auto",
    ]


def test_interrupt_report_names_the_step_the_last_complete_checkpoint_and_the_resume_command(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    monkeypatch.setattr(sys, "argv", ["main_ppo.py", f"trainer.default_local_dir={tmp_path}"])
    config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path)}})
    none_yet = interrupt_report(config, "local", RunInterruptedError(step=1, backend_destroyed=True)).splitlines()
    assert none_yet == [
        "[remote_backend] interrupted (Ctrl-C) after step 1",
        "  backend 'local': destroyed",
        f"  last complete checkpoint: none under {tmp_path} (trainer.save_freq sets how often one is saved)",
    ]
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4")
    lines = interrupt_report(config, "local", None).splitlines()
    assert lines[0].endswith("(step reached unknown: the trainer did not answer)")
    assert "not confirmed destroyed" in lines[1]
    assert lines[2] == f"  last complete checkpoint: {tmp_path / 'global_step_4'} (step 4)"
    assert lines[3].endswith(f"trainer.default_local_dir={tmp_path} trainer.resume_mode=auto")


def test_run_interrupted_error_keeps_its_fields_through_pickling():
    import pickle

    err = pickle.loads(pickle.dumps(RunInterruptedError(step=7, backend_destroyed=True)))
    assert (err.step, err.backend_destroyed) == (7, True)


def test_sigint_raises_once_in_a_thread_where_ray_blocked_it():
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as in a Ray worker
    previous_handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            with sigint_raises_keyboard_interrupt():
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(5)  # interrupted at once
                except KeyboardInterrupt:
                    pass  # swallowed by some library's `except BaseException` ...
                raise_if_interrupted()  # ... the trainer's next forwarded call raises it again
        raise_if_interrupted()  # outside, the flag is cleared
        # inside the handler the next SIGINT is ignored: a second Ctrl-C cannot cut the teardown short
        assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # mask restored
        assert signal.getsignal(signal.SIGINT) is previous_handler
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        signal.signal(signal.SIGINT, previous_handler)


# ---------------------------------------------------------------- reaper
DRIVER = textwrap.dedent(
    """
    import subprocess, sys, time
    from verl.remote_backend.launch.reaper import start_reaper
    reaper = start_reaper()
    # like a launched Arctic server: a session of its own, so no process-group kill reaches it
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    print(reaper.pid, child.pid, flush=True)
    time.sleep(300)
    """
)


def test_a_killed_drivers_processes_are_stopped_by_the_reaper():
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    reaper_pid, child_pid = map(int, driver.stdout.readline().split())
    child, reaper = psutil.Process(child_pid), psutil.Process(reaper_pid)
    time.sleep(2.5)  # the reaper records the driver's descendants once a second
    assert child.is_running() and reaper.is_running()
    driver.kill()
    driver.wait()
    start = time.monotonic()
    while time.monotonic() - start < 15 and any(is_running(p) for p in (child, reaper)):
        time.sleep(0.2)
    alive = {name: p for name, p in (("child", child), ("reaper", reaper)) if is_running(p)}
    for proc in alive.values():
        proc.kill()
    assert not alive, f"still running 15 s after the driver's death: {sorted(alive)}"
    assert time.monotonic() - start < 10
