"""Same seeds -> same run; a run interrupted and resumed = the uninterrupted run.

Real entry point, real verl trainer, the local engine on CPU, gsm8k prompts and a reward
that varies within each GRPO group (so losses and gradients are non-zero). Every rollout
sample draws from its own random stream, derived from ``data.seed`` and the sample's
identity (``verl/workers/rollout/remote_rollout/seeding.py``), so neither the order in
which concurrent requests reach the engine nor the batch they are decoded in matters.
"""

from __future__ import annotations

import json
import math

import pytest

from remote_e2e import REPO_ROOT, e2e_assets, run_entry, small_ci_overrides

pytestmark = pytest.mark.slow

# Wall-clock figures differ between any two runs; everything else must not.
_TIMING_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/", "throughput", "time")


def _overrides(assets, ckpt, steps, resume_mode="disable"):
    base = small_ci_overrides(
        model=assets["model"], train=assets["train"], test=assets["test"], ckpt_dir=ckpt, steps=steps, save_freq=2
    )
    return [o for o in base if not o.startswith("trainer.resume_mode=")] + [
        f"trainer.resume_mode={resume_mode}",
        "data.seed=7",  # verl's prompt shuffle; each sample's stream derives from it too
        "actor_rollout_ref.actor.optim.lr=1e-3",
        f"reward.custom_reward_function.path={REPO_ROOT / 'tests' / 'toy_reward.py'}",
        "reward.custom_reward_function.name=digit_share",
    ]


def _deterministic(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(_TIMING_PREFIXES)}


def _weights_digest(ckpt, step) -> str:
    return json.loads((ckpt / f"global_step_{step}" / "actor" / "manifest.json").read_text())["files"]["model.safetensors"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return e2e_assets(tmp_path_factory.mktemp("repro_assets"))


@pytest.mark.timeout(2400)
def test_same_seeds_same_run_and_resumed_equals_uninterrupted(assets, tmp_path):
    runs = {}
    for name in ("first", "second"):
        ckpt = tmp_path / name / "ckpt"
        result = run_entry(_overrides(assets, ckpt, steps=4), workdir=tmp_path / name)
        assert result.returncode == 0, result.tail()
        runs[name] = (result, ckpt)
    first, ckpt_a = runs["first"]
    second, ckpt_b = runs["second"]
    assert [m["step"] for m in first.metrics] == [1, 2, 3, 4]
    # the runs train for real: rewards vary, the policy loss and gradient are non-zero
    assert any(float(first.step(s)["actor/grad_norm"]) > 0 for s in (1, 2, 3, 4))
    assert len({float(first.step(s)["critic/score/mean"]) for s in (1, 2, 3, 4)}) > 1
    for step in (1, 2, 3, 4):
        a, b = _deterministic(first.step(step)), _deterministic(second.step(step))
        assert a.keys() == b.keys()
        different = {k: (a[k], b[k]) for k in a if a[k] != b[k] and not (_nan(a[k]) and _nan(b[k]))}
        assert not different, f"step {step}: two fresh runs with the same seeds differ in {different}"
    assert _weights_digest(ckpt_a, 4) == _weights_digest(ckpt_b, 4)

    # interrupted after step 2 (its checkpoint), then resumed to step 4
    ckpt_c = tmp_path / "resumed" / "ckpt"
    head = run_entry(_overrides(assets, ckpt_c, steps=2), workdir=tmp_path / "resumed" / "head")
    assert head.returncode == 0, head.tail()
    tail = run_entry(_overrides(assets, ckpt_c, steps=4, resume_mode="auto"), workdir=tmp_path / "resumed" / "tail")
    assert tail.returncode == 0, tail.tail()
    assert [m["step"] for m in tail.metrics] == [3, 4]
    for step in (3, 4):
        a, c = _deterministic(first.step(step)), _deterministic(tail.step(step))
        different = {k: (a[k], c[k]) for k in a if k in c and a[k] != c[k] and not (_nan(a[k]) and _nan(c[k]))}
        assert not different, f"step {step}: the resumed run differs from the uninterrupted one in {different}"
    assert _weights_digest(ckpt_c, 4) == _weights_digest(ckpt_a, 4)
    print(f"\n[repro] 4-step runs {first.wall_s:.0f}s / {second.wall_s:.0f}s; resumed {head.wall_s:.0f}s + {tail.wall_s:.0f}s")


def _nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)
