"""Fault injection, fast cases: the real forwarder worker and rollout server against the
``fault-scripted`` contract double (no Ray, no engine), and interrupted checkpoint writes.

Slow cases (the real engine actor killed, the Arctic stand-in stopped, a corrupt
checkpoint on resume, a SIGKILLed checkpoint write, one full ``main_ppo`` run) are
in ``test_fault_injection_slow.py``.
"""

from __future__ import annotations

import functools
import itertools
import os
import re

import pytest
import torch
from support.aio import run_async
from support.forwarder import in_process_forwarder
from support.remote_e2e import compose

from faults.backends import ScriptedBackend
from verl.remote_backend.errors import BackendDiedError, BackendOutputError, BackendTimeoutError
from verl.utils import tensordict_utils as tu

TEST_TIER = "integration"  # starts Ray, a server, an engine or a model (tiers: tests/conftest.py)

NAME = "fault-scripted"


@pytest.fixture(autouse=True)
def clean_script():
    ScriptedBackend.SCRIPT.clear()
    yield
    ScriptedBackend.SCRIPT.clear()


def config(model_dir: str, *overrides: str):
    return compose(
        [
            f"trainer.remote_backend={NAME}",
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.n=1",
            "data.max_response_length=16",
            # quick liveness so a frozen backend is declared dead in ~2 s
            "remote_backend.timeouts.health=0.5",
            "remote_backend.liveness.interval_s=0.2",
            *overrides,
        ]
    )


@pytest.fixture
def make_forwarder(tiny_model_dir, monkeypatch):
    def make(*overrides: str):
        return in_process_forwarder(config(tiny_model_dir, *overrides), _engine_handle(), monkeypatch)

    return make


def _engine_handle() -> dict:
    """A handle to a fresh scripted engine, as the trainer hands it to forwarders and servers
    (the engine lives until the test process exits)."""
    return ScriptedBackend.from_config({}).reconnect_handle()


def make_server(model_dir, *overrides):
    from verl.workers.rollout.remote_rollout.server import RemoteRolloutServer

    return RemoteRolloutServer(config(model_dir, *overrides), _engine_handle(), 0)


def batch(lengths=(5, 7)):
    values = torch.arange(sum(lengths)) % 50 + 3
    offsets = torch.tensor([0, *itertools.accumulate(lengths)])
    return tu.get_tensordict(
        {
            "input_ids": torch.nested.nested_tensor_from_jagged(values, offsets=offsets),
            "position_ids": torch.nested.nested_tensor_from_jagged(
                torch.cat([torch.arange(n) for n in lengths]), offsets=offsets
            ),
        },
        {"epochs": 1, "temperature": 1.0, "calculate_entropy": True},
    )


run = functools.partial(run_async, cap_s=30)  # every op of these tests is bounded: a hang fails fast


def save(forwarder, root, step) -> str:
    path = run(forwarder.save_checkpoint(str(root / f"global_step_{step}" / "actor"), None, step))
    return path


# ---------------------------------------------------------------- hangs
def test_update_hanging_past_its_timeout(fault, make_forwarder, tmp_path):
    forwarder = make_forwarder("remote_backend.timeouts.update_actor=1")
    fault.protect(save(forwarder, tmp_path, 1))
    ScriptedBackend.SCRIPT["update_actor"] = "hang"
    with fault.expect(
        BackendTimeoutError,
        match=r"'fault-scripted': update_actor did not finish within 1s.*raise remote_backend\.timeouts\.update_actor",
        within_s=5,
    ):
        run(forwarder.update_actor(batch()))


def test_generate_hanging_past_its_timeout(fault, tiny_model_dir):
    server = make_server(tiny_model_dir, "remote_backend.timeouts.generate=1")
    ScriptedBackend.SCRIPT["generate"] = "hang"
    with fault.expect(BackendTimeoutError, match=r"generate did not finish within 1s.*timeouts\.generate", within_s=5):
        run(server.generate("r1", prompt_ids=[5, 6, 7], sampling_params={"max_tokens": 4}))


def test_frozen_backend_is_declared_dead_by_the_watchdog(fault, make_forwarder, tmp_path):
    """The call's own limit is long; the backend stops answering health probes: dead in seconds."""
    forwarder = make_forwarder("remote_backend.timeouts.compute_log_prob=600")
    fault.protect(save(forwarder, tmp_path, 1))
    ScriptedBackend.SCRIPT.update(compute_log_prob="hang", health="hang")
    with fault.expect(
        BackendDiedError,
        match=r"'fault-scripted' died during .*2 consecutive health probes failed.*no answer to health\(\) within 0\.5s"
        r".*Its logs: /nonexistent/stub-backend\.log",
        within_s=6,
    ):
        run(forwarder.compute_log_prob(batch()))
    # once dead, every further call fails at once instead of waiting
    with fault.expect(BackendDiedError, match="found dead earlier", within_s=1):
        run(forwarder.update_weights())


# ---------------------------------------------------------------- malformed outputs
@pytest.mark.parametrize(
    "kind, match",
    [
        (
            "wrong_shape",
            r"compute_log_prob: log_probs: expected shape \[12\] "
            r"\(one value per packed token; rows \[5, 7\]\), got \[11\]",
        ),
        (
            "nan",
            r"compute_log_prob: log_probs: expected finite values, got 1 NaN/Inf "
            r"\(first at packed index 3: row 0, token 3",
        ),
        ("missing_key", r"compute_log_prob: entropy was asked for \(calculate_entropy=True\) but the result has none"),
    ],
)
def test_malformed_log_probs_are_named(fault, make_forwarder, kind, match):
    forwarder = make_forwarder()
    ScriptedBackend.SCRIPT["compute_log_prob"] = kind
    with fault.expect(BackendOutputError, match=match, within_s=5):
        run(forwarder.compute_log_prob(batch()))


def test_out_of_vocabulary_token_is_named(fault, tiny_model_dir):
    server = make_server(tiny_model_dir)
    ScriptedBackend.SCRIPT["generate"] = "oov"
    vocab = server._vocab_size
    assert vocab is not None
    ScriptedBackend.VOCAB = vocab
    with fault.expect(
        BackendOutputError,
        match=rf"token_ids\[2\]={vocab + 7} is outside the model's vocabulary: expected an id in \[0, {vocab}\)",
        within_s=5,
    ):
        run(server.generate("r1", prompt_ids=[5, 6, 7], sampling_params={"max_tokens": 4}))


# ---------------------------------------------------------------- interrupted checkpoint writes
def _writers(interrupt_at: int | None):
    def make(i):
        def write(f):
            if i == interrupt_at:
                raise KeyboardInterrupt("simulated interrupt during the write of part_%d" % i)
            with open(f, "wb") as fh:
                fh.write(bytes([i]) * 1024)

        return write

    return {f"part_{i}.bin": make(i) for i in range(3)}


@pytest.mark.parametrize("same_step", [False, True], ids=["new-step", "overwrite-same-step"])
def test_interrupted_checkpoint_write_leaves_the_previous_one(fault, tmp_path, same_step):
    from verl.workers.remote_client.local.checkpoint import CheckpointError, verify_checkpoint_dir, write_checkpoint_dir

    first = fault.protect(write_checkpoint_dir(str(tmp_path / "global_step_1" / "actor"), 1, _writers(None)))
    target = first if same_step else str(tmp_path / "global_step_2" / "actor")
    with fault.expect(KeyboardInterrupt, match="simulated interrupt during the write of part_1", within_s=5):
        write_checkpoint_dir(target, 1 if same_step else 2, _writers(1))
    parent = os.path.dirname(target)
    assert not [n for n in os.listdir(parent) if ".tmp-" in n], "the temporary folder was not removed"
    if not same_step:
        assert not os.path.exists(target)
        with pytest.raises(CheckpointError, match="does not exist"):
            verify_checkpoint_dir(target)
    assert verify_checkpoint_dir(first)["step"] == 1


# ---------------------------------------------------------------- bad input: refused before Ray starts
def _bad_input_cases():
    def parquet(path, rows):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), str(path))
        return str(path)

    def local_checkpoint(model, root, damage):
        from verl.workers.remote_client.local.config import EngineSettings
        from verl.workers.remote_client.local.engine import LocalEngine

        LocalEngine(EngineSettings(model_path=model)).save_checkpoint(str(root / "global_step_1" / "actor"), 1)
        torch.save({"dataloader": 1}, root / "global_step_1" / "data.pt")
        (root / "latest_checkpointed_iteration.txt").write_text("1")
        if damage == "truncated data.pt":
            data_pt = root / "global_step_1" / "data.pt"
            data_pt.write_bytes(data_pt.read_bytes()[:50])
        else:  # same-size corruption: only the sha256 can tell
            optim = root / "global_step_1" / "actor" / "optimizer.pt"
            data = bytearray(optim.read_bytes())
            data[len(data) // 2] ^= 0xFF
            optim.write_bytes(bytes(data))
        return [f"trainer.default_local_dir={root}", "trainer.resume_mode=auto"]

    prompt = [{"role": "user", "content": "What is 12 + 30?"}]
    return {
        "rollout.n=0": lambda m, t: ["actor_rollout_ref.rollout.n=0"],
        "train_batch_size=6, ppo_mini_batch_size=4": lambda m, t: [
            "data.train_batch_size=6",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        ],
        "train file without a prompt column": lambda m, t: [
            f"data.train_files={parquet(t / 'q.parquet', [{'question': 'x'}] * 4)}"
        ],
        "train file with empty prompts": lambda m, t: [
            f"data.train_files={parquet(t / 'e.parquet', [{'prompt': prompt}, {'prompt': []}] * 2)}"
        ],
        "overlong prompts, filtering off": lambda m, t: [
            "data.train_files="
            f"{parquet(t / 'l.parquet', [{'prompt': [{'role': 'user', 'content': 'long ' * 300}]}] * 4)}",
            "data.filter_overlong_prompts=false",
        ],
        "local engine on cuda without a GPU": lambda m, t: ["remote_backend.local.device=cuda"],
        "resume: truncated data.pt": lambda m, t: local_checkpoint(m, t, "truncated data.pt"),
        "resume: same-size corruption of optimizer.pt": lambda m, t: local_checkpoint(m, t, "corrupt optimizer.pt"),
    }


BAD_INPUT_EXPECTED = {
    "rollout.n=0": "actor_rollout_ref.rollout.n=0",
    "train_batch_size=6, ppo_mini_batch_size=4": "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "train file without a prompt column": "has no 'prompt' column",
    "train file with empty prompts": "2 of 4 rows have an empty 'prompt'",
    "overlong prompts, filtering off": "4 prompt\\(s\\) are longer than data.max_prompt_length",
    "local engine on cuda without a GPU": "remote_backend.local.device='cuda'",
    "resume: truncated data.pt": "data.pt is truncated or corrupt",
    "resume: same-size corruption of optimizer.pt": "optimizer.pt is corrupt: its sha256 does not match",
}


@pytest.mark.parametrize("case", list(BAD_INPUT_EXPECTED))
def test_bad_input_is_refused_before_ray_starts(fault, tiny_model_dir, tmp_path, case):
    import ray
    from support.remote_e2e import build_gsm8k, small_ci_overrides

    from verl.remote_backend.errors import ConfigError, ResumeCheckpointError
    from verl.remote_backend.launch.failure_report import failure_report
    from verl.remote_backend.main_ppo import run

    if case.startswith("local engine on cuda") and torch.cuda.device_count() > 0:
        pytest.skip("this machine has a GPU")
    train, test = build_gsm8k(tmp_path / "data")
    base = small_ci_overrides(model=tiny_model_dir, train=train, test=test, ckpt_dir=tmp_path / "ckpt", steps=2)
    changes = _bad_input_cases()[case](tiny_model_dir, tmp_path)
    keys = {c.split("=", 1)[0] for c in changes}
    overrides = [o for o in base if o.split("=", 1)[0] not in keys] + changes
    assert not ray.is_initialized()
    error = ResumeCheckpointError if case.startswith("resume") else ConfigError
    with fault.expect(error, match=BAD_INPUT_EXPECTED[case], within_s=15) as outcome:
        run(compose(overrides))
    assert not ray.is_initialized(), "refused after Ray started"
    # what the user sees first (main_ppo.main prints it before Hydra's traceback): the cause and the fix
    first = failure_report(outcome.error).splitlines()[0]
    assert first.startswith(f"[remote_backend] run failed: {error.__name__}: ") and re.search(
        BAD_INPUT_EXPECTED[case], first
    )
    assert re.search(r"\b[Ff]ix\b|start over with|set ", first), first
