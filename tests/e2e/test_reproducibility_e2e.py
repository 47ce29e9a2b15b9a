"""Same seeds -> same run; a run interrupted and resumed = the uninterrupted run.

Real entry point, real verl trainer, the local engine on CPU, gsm8k prompts and a reward
that varies within each GRPO group (so losses and gradients are non-zero). Every rollout
sample draws from its own random stream, derived from ``data.seed`` and the sample's
identity (``verl/workers/rollout/remote_rollout/seeding.py``), so neither the order in
which concurrent requests reach the engine nor the batch they are decoded in matters.

The runs are the session's (conftest ``seeded_local_run``): one uninterrupted 4-step run, and the
same run interrupted after step 2 (``head``, also the second fresh run with the same seeds: its two
steps and its step-2 weights must equal the first run's) and resumed to step 4 (``tail``). The
interrupted and resumed runs are also the ones test_resume_e2e inspects.
"""

from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.slow

# Wall-clock figures differ between any two runs, and so do the sampler's batching statistics:
# which requests share a prefill depends on which arrive in the same burst (arrival timing), not
# on what they sample. Everything else must not differ.
_TIMING_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/", "throughput", "time")
_BATCHING_STATISTICS = ("actor/sampler_prefill_tokens", "actor/sampler_rows_sharing_a_prefill")


def _deterministic(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(_TIMING_PREFIXES) and k not in _BATCHING_STATISTICS}


def _weights_digest(ckpt, step) -> str:
    return json.loads((ckpt / f"global_step_{step}" / "actor" / "manifest.json").read_text())["files"][
        "model.safetensors"
    ]


@pytest.mark.timeout(2400)
def test_same_seeds_same_run_and_resumed_equals_uninterrupted(seeded_local_run):
    first_run, head_run = seeded_local_run("first"), seeded_local_run("head")
    first, ckpt_a = first_run.result, first_run.ckpt
    head, ckpt_h = head_run.result, head_run.ckpt
    assert first.returncode == 0, first.tail()
    assert head.returncode == 0, head.tail()
    assert [m["step"] for m in first.metrics] == [1, 2, 3, 4]
    assert [m["step"] for m in head.metrics] == [1, 2]
    # the runs train for real: rewards vary, the policy loss and gradient are non-zero
    assert any(float(first.step(s)["actor/grad_norm"]) > 0 for s in (1, 2, 3, 4))
    assert len({float(first.step(s)["critic/score/mean"]) for s in (1, 2, 3, 4)}) > 1

    # two fresh runs with the same seeds (``head`` is one, stopped after step 2): same steps, same weights
    for step in (1, 2):
        a, b = _deterministic(first.step(step)), _deterministic(head.step(step))
        assert a.keys() == b.keys()
        different = {k: (a[k], b[k]) for k in a if a[k] != b[k] and not (_nan(a[k]) and _nan(b[k]))}
        assert not different, f"step {step}: two fresh runs with the same seeds differ in {different}"
    assert _weights_digest(ckpt_a, 2) == _weights_digest(ckpt_h, 2)

    # ``head`` interrupted after step 2 (its checkpoint), then ``tail`` resumed from it to step 4
    tail_run = seeded_local_run("tail")
    tail, ckpt_c = tail_run.result, tail_run.ckpt
    assert tail.returncode == 0, tail.tail()
    assert [m["step"] for m in tail.metrics] == [3, 4]
    for step in (3, 4):
        a, c = _deterministic(first.step(step)), _deterministic(tail.step(step))
        different = {k: (a[k], c[k]) for k in a if k in c and a[k] != c[k] and not (_nan(a[k]) and _nan(c[k]))}
        assert not different, f"step {step}: the resumed run differs from the uninterrupted one in {different}"
    assert _weights_digest(ckpt_c, 4) == _weights_digest(ckpt_a, 4)
    print(
        f"\n[repro] 4-step run {first.wall_s:.0f}s; "
        f"the same run interrupted {head.wall_s:.0f}s + resumed {tail.wall_s:.0f}s"
    )


def _nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)
