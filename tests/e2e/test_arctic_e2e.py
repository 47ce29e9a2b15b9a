"""End to end: ``python -m verl.remote_backend.main_ppo trainer.remote_backend=arctic`` on gsm8k.

The real entry point, verl's trainer, the CPU forwarder and the remote rollout
replica drive the ``arctic`` adapter and the real arctic-platform client, which
talk HTTP to the stand-in Arctic RL server (``tests/arctic_standin``; the session's, conftest
``standin_server``), or (``protocol=ray``) start Arctic's in-process Ray server in verl's own Ray
cluster through arctic-platform's Ray transport (the cluster declares a logical GPU and runs the
stand-in's worker set-up hook, ``arctic_standin/ray_setup.py``). A second run resumes from the
first run's checkpoint through Arctic's load-checkpoint.
"""

from __future__ import annotations

import json
import math

import pytest
from support.remote_e2e import LOGGED_STEP_METRICS, REPO_ROOT, run_entry, small_ci_overrides


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http", "ray"])
def test_grpo_on_gsm8k_through_arctic_standin_then_resume(standin_server, gsm8k_assets, tmp_path, protocol):
    model, train, test = gsm8k_assets["model"], gsm8k_assets["train"], gsm8k_assets["test"]
    ckpt = tmp_path / "ckpt"
    calls_before = standin_server.calls()  # the server is the session's: count this test's calls only

    def calls_since_start() -> dict[str, int]:
        return {path: n - calls_before.get(path, 0) for path, n in standin_server.calls().items()}

    env_extra = None
    transport = [f"remote_backend.arctic.port={standin_server.port}"]
    if protocol == "ray":
        from arctic_standin.ray_setup import entry_point_overrides

        transport, env_extra = entry_point_overrides(logical_gpus=1)
    common = [
        *transport,
        "remote_backend.arctic.device.type=cpu",
        "remote_backend.arctic.connect_timeout_s=30",
        # Dense reward that varies within a GRPO group, so the update has a non-zero gradient.
        f"reward.custom_reward_function.path={REPO_ROOT / 'tests' / 'support' / 'toy_reward.py'}",
        "reward.custom_reward_function.name=digit_share",
    ]
    first = run_entry(
        small_ci_overrides(model=model, train=train, test=test, ckpt_dir=ckpt, steps=2, backend="arctic", save_freq=2)
        + common,
        workdir=tmp_path / "run1",
        env_extra=env_extra,
    )
    assert first.returncode == 0, first.tail()
    for step in (1, 2):
        data = first.step(step)
        for key in LOGGED_STEP_METRICS:
            assert key in data and math.isfinite(float(data[key])), f"step {step}: {key}={data.get(key)}"
    assert max(float(first.step(s)["actor/grad_norm"]) for s in (1, 2)) > 0
    # Arctic's save, DeepSpeed's layout, plus the adapter's record of the server's step (for honest resume)
    saved = ckpt / "global_step_2" / "actor" / "checkpoint-2"
    tag = (saved / "latest").read_text().strip()
    assert (saved / tag / "mp_rank_00_model_states.pt").is_file()
    record = json.loads((ckpt / "global_step_2" / "actor" / "arctic_checkpoint.json").read_text())
    assert (
        record["step"] == 2
        and tag == f"global_step{record['engine_global_step']}"
        and record["engine_global_step"] >= 2
    )
    calls = calls_since_start()
    if protocol == "http":
        assert calls.get("/generate", 0) >= 2 * 4 * 2  # steps x prompts x rollout.n
        assert calls.get("/forward-backward") == 2 and calls.get("/step") == 2 and calls.get("/save") == 1
        assert standin_server.jobs() == {}  # destroy() tore the jobs down
    else:
        assert calls == {} or set(calls.values()) == {0}  # nothing went to the HTTP server
        assert "(ArcticRLRayServerState pid=" in first.output  # Arctic's state actor ran in verl's Ray cluster

    second = run_entry(
        small_ci_overrides(model=model, train=train, test=test, ckpt_dir=ckpt, steps=3, backend="arctic")
        + common
        + ["trainer.resume_mode=auto"],
        workdir=tmp_path / "run2",
        env_extra=env_extra,
    )
    assert second.returncode == 0, second.tail()
    assert [m["step"] for m in second.metrics] == [3], second.tail()
    if protocol == "http":
        assert calls_since_start().get("/load-checkpoint") == 1
    # (over Ray the resume ran load_checkpoint too: without it the adapter raises ResumeCheckpointError)
    print(
        f"arctic e2e ({protocol}): first run {first.wall_s:.0f}s, peak PSS {first.peak_pss_gb:.2f} GB; "
        f"resume run {second.wall_s:.0f}s"
    )
