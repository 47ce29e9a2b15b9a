"""Fault injection, slow cases: real processes die and real checkpoints break.

* the local engine's Ray actor SIGKILLed during ``update_actor`` (forwarder) and
  during generation (rollout server), and the real engine's outputs corrupted;
* the latest checkpoint corrupted before resume (forwarder ``load_checkpoint``);
* a checkpoint write SIGKILLed half-way (a child process writing with the engine);
* the Arctic stand-in server killed, and frozen, while a call is in flight (real
  arctic client over HTTP, server launched by the adapter);
* one full ``main_ppo`` run whose engine is killed during the step-2 update.

Each case checks the error type and message, the time from fault to error, that
the dead process is gone (no leak) and that checkpoints saved before are intact.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from arctic_standin.harness import mid_call_batch
from support.aio import FaultTimer, call_then_inject, run_async
from support.forwarder import in_process_forwarder
from support.local_backend_helpers import (
    dense_rollout_batch,
    engine_info,
    random_rollouts,
    random_update_batch,
    to_no_padding,
)
from support.processes import gone
from support.remote_e2e import _tree, build_gsm8k, compose, external_modules_env, small_ci_overrides

from faults.backends import CorruptingLocalBackend
from verl.remote_backend.errors import BackendDiedError, BackendOutputError, ResumeCheckpointError
from verl.remote_backend.launch.reaper import is_running

pytestmark = pytest.mark.slow

# Bound from a process's death to the error (issue 7: <= 30 s).
DEATH_BOUND_S = 30

#: when the last injected fault's call ended (call_then_inject)
_fault_timer = FaultTimer()


run = functools.partial(run_async, cap_s=120)  # every op of these tests is bounded: a hang fails fast


@pytest.fixture(autouse=True)
def clean_script():
    CorruptingLocalBackend.SCRIPT.clear()
    CorruptingLocalBackend.NTH.clear()
    CorruptingLocalBackend._counts.clear()
    yield
    CorruptingLocalBackend.SCRIPT.clear()


def local_config(model_dir: str, *overrides: str):
    return compose(
        [
            "trainer.remote_backend=fault-local",
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.n=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.use_kl_loss=false",
            "remote_backend.local.num_cpus=1",
            *overrides,
        ]
    )


@pytest.fixture
def engine(ray_session, tiny_model_dir):
    """A fresh local engine (Ray actor) behind ``fault-local``; yields (owner client, config)."""
    from verl.remote_backend import RemoteBackendRegistry

    cfg = local_config(tiny_model_dir, "data.max_response_length=1024")
    owner = RemoteBackendRegistry.create("fault-local", cfg)
    yield owner, cfg
    asyncio.run(owner.destroy())
    assert gone(int(owner.info["pid"])), "the engine actor process outlived destroy()"


@pytest.fixture(scope="module")
def shared(ray_session, tiny_model_dir):
    """One healthy engine with a forwarder and a rollout server, for faults that do not kill it."""
    from verl.remote_backend import RemoteBackendRegistry
    from verl.workers.rollout.remote_rollout.server import RemoteRolloutServer

    cfg = local_config(tiny_model_dir)
    owner = RemoteBackendRegistry.create("fault-local", cfg)
    with pytest.MonkeyPatch.context() as mp:
        yield {
            "owner": owner,
            "forwarder": in_process_forwarder(cfg, owner.reconnect_handle(), mp),
            "server": RemoteRolloutServer(cfg, owner.reconnect_handle(), 0),
        }
    asyncio.run(owner.destroy())
    assert gone(int(owner.info["pid"]))


def update_batch(n=16, epochs=1, seed=0):
    """Longer rows than the default (20-40 tokens each side), so a call lasts long enough to be hit."""
    return random_update_batch(
        n, seed=seed, mini_batch_size=4, epochs=epochs, prompt_len=(20, 40), response_len=(20, 40)
    )


def log_prob_batch(n=4, seed=1):
    prompts, responses = random_rollouts(n, seed=seed)
    return to_no_padding(dense_rollout_batch(prompts, responses), calculate_entropy=True, temperature=1.0)


def save(forwarder, root: Path, step: int) -> str:
    path = run(forwarder.save_checkpoint(str(root / f"global_step_{step}" / "actor"), None, step))
    torch.save({}, root / f"global_step_{step}" / "data.pt")  # verl's dataloader state, then its tracker
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))  # as verl does after a save
    return path


# ---------------------------------------------------------------- local engine killed
def test_engine_killed_during_update_actor(fault, engine, monkeypatch, tmp_path):
    owner, cfg = engine
    forwarder = in_process_forwarder(cfg, owner.reconnect_handle(), monkeypatch)
    fault.protect(save(forwarder, tmp_path, 1))
    CorruptingLocalBackend.SCRIPT["update_actor"] = "kill"
    with fault.expect(
        BackendDiedError,
        match=r"remote backend 'fault-local' died during update_actor: .*ActorDiedError.*Its logs: the engine actor's "
        r"Ray worker logs \(pid \d+\): .*/logs/worker-\*-\d+\.out and \.err",
        within_s=CorruptingLocalBackend.KILL_AFTER_S + DEATH_BOUND_S,
    ):
        run(forwarder.update_actor(update_batch(epochs=30)))
    kill = CorruptingLocalBackend.LAST_KILL
    assert kill["op"] == "update_actor" and kill["in_flight"], kill
    assert time.time() - kill["at"] < DEATH_BOUND_S
    assert gone(kill["pid"]), "the killed engine process is still there"
    # the forwarder does not wait on a dead engine again
    with fault.expect(BackendDiedError, match="found dead earlier", within_s=2):
        run(forwarder.compute_log_prob(log_prob_batch()))


def test_engine_killed_during_generation(fault, engine):
    from verl.workers.rollout.remote_rollout.server import RemoteRolloutServer

    owner, cfg = engine
    server = RemoteRolloutServer(cfg, owner.reconnect_handle(), 0)
    CorruptingLocalBackend.SCRIPT["generate"] = "kill"  # the first request kills the engine mid-decode

    async def eight_requests():
        calls = [
            server.generate(
                f"r{i}", prompt_ids=[5 + i, 6, 7, 8], sampling_params={"max_tokens": 1024, "temperature": 1.0}
            )
            for i in range(8)
        ]
        return await asyncio.gather(*calls, return_exceptions=True)

    with fault.expect(
        BackendDiedError,
        match=r"'fault-local' died during generate: .*ActorDiedError.*Its logs: ",
        within_s=DEATH_BOUND_S,
    ):
        results = run(eight_requests())
        died = [r for r in results if isinstance(r, BackendDiedError)]
        others = [r for r in results if isinstance(r, BaseException) and not isinstance(r, BackendDiedError)]
        assert not others, others
        raise died[0] if died else AssertionError(f"no request saw the death: {results}")
    kill = CorruptingLocalBackend.LAST_KILL
    assert kill["op"] == "generate" and kill["in_flight"], kill
    assert gone(kill["pid"])


# ---------------------------------------------------------------- the real engine's outputs corrupted
@pytest.mark.parametrize(
    "op, kind, match",
    [
        ("compute_log_prob", "wrong_shape", r"log_probs: expected shape \[\d+\] .* got \[\d+\]"),
        ("compute_log_prob", "nan", r"log_probs: expected finite values, got 1 NaN/Inf"),
        (
            "compute_log_prob",
            "missing_key",
            r"entropy was asked for \(calculate_entropy=True\) but the result has none",
        ),
        ("generate", "oov", r"token_ids\[\d+\]=\d+ is outside the model's vocabulary: expected an id in \[0, \d+\)"),
    ],
    ids=["wrong_shape", "nan", "missing_key", "oov"],
)
def test_real_engine_outputs_corrupted(fault, shared, op, kind, match):
    CorruptingLocalBackend.SCRIPT[op] = kind
    with fault.expect(BackendOutputError, match=match, within_s=30):
        if op == "generate":
            run(
                shared["server"].generate(
                    "r", prompt_ids=[5, 6, 7], sampling_params={"max_tokens": 4, "temperature": 0.0}
                )
            )
        else:
            run(shared["forwarder"].compute_log_prob(log_prob_batch()))
    owner = shared["owner"]
    assert run(engine_info(owner))["pid"] == owner.info["pid"]  # a bad answer is not a death


# ---------------------------------------------------------------- corrupt checkpoint before resume
def test_corrupt_latest_checkpoint_is_refused_on_resume(fault, ray_session, tiny_model_dir, monkeypatch, tmp_path):
    from verl.remote_backend import RemoteBackendRegistry

    cfg = local_config(tiny_model_dir)
    first = RemoteBackendRegistry.create("fault-local", cfg)
    try:
        forwarder = in_process_forwarder(cfg, first.reconnect_handle(), monkeypatch)
        step1 = fault.protect(save(forwarder, tmp_path, 1))
        run(forwarder.update_actor(update_batch(n=8)))
        step2 = save(forwarder, tmp_path, 2)
    finally:
        asyncio.run(first.destroy())
    model_file = Path(step2) / "model.safetensors"
    data = bytearray(model_file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    model_file.write_bytes(bytes(data))

    second = RemoteBackendRegistry.create("fault-local", cfg)
    try:
        forwarder = in_process_forwarder(cfg, second.reconnect_handle(), monkeypatch)
        with fault.expect(
            ResumeCheckpointError,
            match=rf"cannot resume from {re.escape(str(tmp_path / 'global_step_2'))}: CheckpointError: checkpoint file "
            r".*model\.safetensors is corrupt: its sha256 does not match manifest\.json\. Nothing was loaded.*"
            rf"trainer\.resume_from_path={re.escape(str(tmp_path / 'global_step_1'))}",
            within_s=30,
        ):
            run(forwarder.load_checkpoint(step2))
        assert run(engine_info(second))["global_step"] == 0  # nothing was loaded
        run(forwarder.load_checkpoint(step1))  # the suggested fix works
        assert run(engine_info(second))["global_step"] == 1
    finally:
        asyncio.run(second.destroy())


# ---------------------------------------------------------------- checkpoint write killed half-way
_WRITER = """
import os, sys, time, torch
from verl.workers.remote_client.local.config import EngineSettings
from verl.workers.remote_client.local.engine import LocalEngine

model, root = sys.argv[1], sys.argv[2]
engine = LocalEngine(EngineSettings(model_path=model))
engine.save_checkpoint(f"{root}/global_step_1/actor", 1)
torch.save({}, f"{root}/global_step_1/data.pt")
open(f"{root}/latest_checkpointed_iteration.txt", "w").write("1")
real_save = torch.save

def slow_save(obj, f, *args, **kwargs):  # the optimizer file is written, then the process is killed
    real_save(obj, f, *args, **kwargs)
    open(f"{root}/WRITING", "w").close()
    time.sleep(300)

torch.save = slow_save
engine.save_checkpoint(f"{root}/global_step_2/actor", 2)
"""


def test_checkpoint_write_killed_half_way(fault, tiny_model_dir, tmp_path):
    from verl.remote_backend.checkpoints import check_resume_checkpoint, complete_checkpoints
    from verl.workers.remote_client.local.checkpoint import write_checkpoint_dir

    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, tiny_model_dir, str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "WRITING").exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the writer never reached the middle of the second checkpoint"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    fault.protect(str(tmp_path / "global_step_1" / "actor"))
    step2 = tmp_path / "global_step_2"
    assert not (step2 / "actor").exists(), "a half-written checkpoint became visible"
    assert [n for n in os.listdir(step2) if n.startswith(".actor.tmp-")], "expected the killed write's temp folder"
    # verl's tracker still names step 1, the newest complete checkpoint
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert complete_checkpoints(str(tmp_path)) == [str(tmp_path / "global_step_1")]
    with fault.expect(
        ResumeCheckpointError,
        match=r"global_step_2: .*has no actor/ folder \(a save that was interrupted.*resume_from_path=.*global_step_1",
        within_s=5,
    ):
        check_resume_checkpoint(str(step2))  # resume_path pointed at the interrupted step
    # the next save of that step clears the leftover
    write_checkpoint_dir(str(step2 / "actor"), 2, {"w.bin": lambda f: open(f, "wb").write(b"x")})
    assert not [n for n in os.listdir(step2) if ".tmp-" in n]


# ---------------------------------------------------------------- Arctic stand-in stopped mid-run
@pytest.fixture
def arctic(ray_session, tiny_model_dir, monkeypatch, tmp_path):
    """An arctic backend that launched the stand-in server itself, plus a forwarder attached to it."""
    pytest.importorskip("arctic_platform")
    from arctic_standin.harness import compose_config, free_port, standin_command
    from omegaconf import OmegaConf, open_dict

    from verl.remote_backend import RemoteBackendRegistry

    port = free_port()
    cfg = compose_config(tiny_model_dir, str(tmp_path / "ckpt"), port, ["actor_rollout_ref.actor.use_kl_loss=false"])
    with open_dict(cfg):
        for key, value in {
            "remote_backend.arctic.launch_server": True,
            "remote_backend.arctic.launch_command": standin_command(),
            "remote_backend.arctic.startup_timeout_s": 120,
            "remote_backend.timeouts": {"health": 1.0},
            "remote_backend.liveness": {"interval_s": 0.5, "failures": 2},
        }.items():
            OmegaConf.update(cfg, key, value, merge=True)
    owner = RemoteBackendRegistry.create("arctic", cfg)
    proc = owner._server.proc
    try:
        forwarder = in_process_forwarder(cfg, owner.reconnect_handle(), monkeypatch)
        yield {"owner": owner, "forwarder": forwarder, "proc": proc, "port": port, "cfg": cfg}
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # a SIGSTOPped server ignores SIGTERM
        asyncio.run(owner.destroy())
        assert gone(proc.pid), "the stand-in server outlived the test"


def _arm_hang(port: int, endpoint: str) -> None:
    import requests

    requests.post(
        f"http://127.0.0.1:{port}/_standin/fault",
        json={"endpoint": endpoint, "kind": "hang", "seconds": 600},
        timeout=10,
    ).raise_for_status()


def _signal_server_mid_log_prob(arctic, sig: int):
    """A forwarded ``compute_log_prob`` with ``sig`` sent to the stand-in server 0.5 s into it
    (timed by ``_fault_timer``)."""
    pid, call = arctic["proc"].pid, arctic["forwarder"].compute_log_prob(mid_call_batch(arctic["cfg"]))
    return run(call_then_inject(lambda: os.kill(pid, sig), call, delay_s=0.5, timer=_fault_timer))


def test_arctic_server_killed_mid_call(fault, arctic):
    fwd, proc, port = arctic["forwarder"], arctic["proc"], arctic["port"]
    saved = run(
        fwd.save_checkpoint(str(Path(arctic["cfg"].trainer.default_local_dir) / "global_step_1" / "actor"), None, 1)
    )
    fault.protect(saved)
    _arm_hang(port, "/forward")
    with fault.expect(
        BackendDiedError,
        match=rf"'arctic' died during compute_log_prob: .*127\.0\.0\.1:{port}.*Its logs: .*arctic_server_{port}\.log",
        within_s=DEATH_BOUND_S,
    ):
        _signal_server_mid_log_prob(arctic, signal.SIGKILL)
    assert _fault_timer.seconds < DEATH_BOUND_S
    assert proc.wait(timeout=10) == -signal.SIGKILL


def test_arctic_server_frozen_mid_call(fault, arctic):
    """SIGSTOP: the connection stays open, nothing answers - only the liveness probes can tell."""
    port = arctic["port"]
    _arm_hang(port, "/forward")
    with fault.expect(
        BackendDiedError,
        match=r"'arctic' died during .*2 consecutive health probes failed.*Its logs: .*arctic_server_",
        within_s=DEATH_BOUND_S,
    ):
        _signal_server_mid_log_prob(arctic, signal.SIGSTOP)
    assert (
        _fault_timer.seconds < 15
    )  # by design ~3 s: interval 0.5 s + 2 probes of 1 s + backoff; slack for a loaded CI box


# ---------------------------------------------------------------- one full main_ppo run
def test_full_run_engine_killed_during_update(fault, tiny_model_dir, tmp_path):
    """The whole trainer: the engine dies in step 2's update; the run fails fast, destroys the
    backend, leaves no process behind and keeps step 1's checkpoint."""
    data_dir, ckpt = tmp_path / "data", tmp_path / "ckpt"
    train, test = build_gsm8k(data_dir, max_train=16, max_test=4)
    overrides = small_ci_overrides(
        model=tiny_model_dir, train=train, test=test, ckpt_dir=ckpt, steps=3, save_freq=1,
        backend="fault-local", batch_size=2, rollout_n=2,
    ) + ["actor_rollout_ref.actor.ppo_epochs=20"]  # fmt: skip
    env = dict(os.environ)
    env.update(external_modules_env("faults.backends"))
    env.update(
        {
            "VRB_FAULT": "update_actor:kill:2",
            "RAY_DEDUP_LOGS": "0",
            "HYDRA_FULL_ERROR": "1",
        }
    )
    log = tmp_path / "run.log"
    cmd = [sys.executable, "-m", "verl.remote_backend.main_ppo", f"hydra.run.dir={tmp_path}/hydra", *overrides]
    seen: dict[int, psutil.Process] = {}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline:
            seen.update({p.pid: p for p in _tree(proc.pid)})
            time.sleep(0.5)
        if proc.poll() is None:
            proc.kill()
        rc = proc.wait()
    exited_at = time.time()
    output = log.read_text(errors="replace")
    # what outlived the driver (Ray's own daemons get a few seconds to go)
    time.sleep(10)
    leaked = [p for p in seen.values() if p.pid != proc.pid and is_running(p)]
    for p in leaked:
        p.kill()

    fault.protect(str(ckpt / "global_step_1" / "actor"))
    kill = re.search(r"\[fault\] killed engine pid (\d+) during update_actor \(in flight: (\w+)\) at ([\d.]+)", output)
    destroyed = re.search(r"\[fault\] destroy called at ([\d.]+)", output)
    assert kill, output[-6000:]
    died = re.search(r"remote backend 'fault-local' died during update_actor: .*ActorDiedError", output)
    fault.observed(
        "engine killed during update_actor (full main_ppo run)",
        surfaced=rc != 0 and died is not None and destroyed is not None,
        seconds=(float(destroyed.group(1)) if destroyed else exited_at) - float(kill.group(3)),
        within_s=DEATH_BOUND_S,
        detail=output[-6000:],
    )
    assert kill.group(2) == "True", "the engine was killed after the update had already finished"
    # the error reaches the driver intact (Ray re-raises it there), not as an opaque unpicklable
    assert "UnserializableException" not in output
    assert re.search(r"RayTaskError\(BackendDiedError\)", output), output[-6000:]
    assert "[remote_backend] destroyed backend 'fault-local'" in output
    # the short block (cause first) comes before Hydra's error line and the traceback
    block = output.find(
        "[remote_backend] run failed: BackendDiedError: remote backend 'fault-local' died during update_actor"
    )
    assert block != -1, output[-6000:]
    assert block < output.find("Error executing job") and block < output.rfind("Traceback (most recent call last)")
    assert exited_at - float(kill.group(3)) < 120, "the driver took too long to exit after the failure"
    assert gone(int(kill.group(1)))
    assert not leaked, f"processes outlived the run: {[(p.pid, _name(p)) for p in leaked]}"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert not (ckpt / "global_step_2").exists()


def _name(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:120]
    except psutil.Error:
        return "?"


# ---------------------------------------------------------------- interrupts of a full run
INTERRUPT_BOUND_S = 15  # Ctrl-C to exit (the reliability issue)
ORPHAN_BOUND_S = 30  # driver SIGKILL to no process of the run left


def _start_long_run(model: str, tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    """A 50-step run saving every step, in a session of its own (so a "terminal" Ctrl-C can reach its
    whole process group); returns once step 2 is logged: (process, log file, checkpoint root)."""
    data_dir, ckpt = tmp_path / "data", tmp_path / "ckpt"
    train, test = build_gsm8k(data_dir, max_train=16, max_test=4)
    overrides = small_ci_overrides(
        model=model, train=train, test=test, ckpt_dir=ckpt, steps=50, save_freq=1,
        batch_size=2, rollout_n=2,
    )  # fmt: skip
    metrics, log = tmp_path / "metrics.jsonl", tmp_path / "run.log"
    env = dict(os.environ, VERL_FILE_LOGGER_PATH=str(metrics), RAY_DEDUP_LOGS="0")
    cmd = [sys.executable, "-m", "verl.remote_backend.main_ppo", f"hydra.run.dir={tmp_path}/hydra", *overrides]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            # as in a terminal: a shell's background job (e.g. CI started with `&`) ignores SIGINT, and
            # ignored signals are inherited, so give the run the default disposition back
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            return proc, log, ckpt
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"the run did not reach step 2 (rc {proc.poll()}):\n{log.read_text(errors='replace')[-6000:]}")


def _survivors(seen: dict, within_s: float) -> list:
    """Processes of ``seen`` still alive ``within_s`` from now (polled; the rest are killed after)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = [p for p in seen.values() if is_running(p)]
        if not alive:
            return []
        time.sleep(0.5)
    alive = [p for p in seen.values() if is_running(p)]
    for p in alive:
        p.kill()
    return alive


def test_ctrl_c_exits_130_destroys_the_backend_and_prints_the_resume_command(fault, tiny_model_dir, tmp_path):
    proc, log, ckpt = _start_long_run(tiny_model_dir, tmp_path)
    seen = {p.pid: p for p in _tree(proc.pid) if p.pid != proc.pid}
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    seconds = time.monotonic() - start
    output = log.read_text(errors="replace")
    saved = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    fault.protect(str(ckpt / f"global_step_{saved}" / "actor"))
    report = re.search(
        r"\[remote_backend\] interrupted \(Ctrl-C\) after step (\d+)\n  backend 'local': destroyed\n"
        r"  last complete checkpoint: (\S+) \(step (\d+)\)\n  resume with: (.+)",
        output,
    )
    fault.observed(
        "Ctrl-C during a run (exit 130, backend destroyed, resume command)",
        surfaced=rc == 130 and report is not None,
        seconds=seconds,
        within_s=INTERRUPT_BOUND_S,
        detail=output[-6000:],
    )
    step, path, path_step, resume = int(report.group(1)), report.group(2), int(report.group(3)), report.group(4)
    assert path == str(ckpt / f"global_step_{saved}") and path_step == saved and step >= 2
    assert resume.startswith("python -m verl.remote_backend.main_ppo ") and resume.endswith("trainer.resume_mode=auto")
    assert "trainer.resume_mode=disable" not in resume and f"trainer.default_local_dir={ckpt}" in resume
    assert "[remote_backend] destroyed backend 'local'" in output
    assert "died during" not in output, "the run's own teardown was reported as a backend death"
    assert "KeyboardInterrupt" not in output.split("[remote_backend] interrupted")[-1]
    leaked = _survivors(seen, ORPHAN_BOUND_S)
    assert not leaked, f"processes outlived the run: {[(p.pid, _name(p)) for p in leaked]}"


def test_killed_driver_leaves_no_process_of_the_run(fault, tiny_model_dir, tmp_path):
    proc, log, ckpt = _start_long_run(tiny_model_dir, tmp_path)
    seen = {p.pid: p for p in _tree(proc.pid) if p.pid != proc.pid}
    assert any("EngineActor" in _name(p) for p in seen.values()), "the engine is not among the run's processes"
    start = time.monotonic()
    proc.kill()
    proc.wait()
    leaked = _survivors(seen, ORPHAN_BOUND_S)
    fault.observed(
        "driver SIGKILLed: no process of the run left",
        surfaced=not leaked,
        seconds=time.monotonic() - start,
        within_s=ORPHAN_BOUND_S,
        detail=f"left: {[(p.pid, _name(p)) for p in leaked]}",
    )
    saved = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    fault.protect(str(ckpt / f"global_step_{saved}" / "actor"))
