"""verl's bypass mode on the local engine: skipping the old-log-prob recompute trains as recomputing does.

Two runs of the session's seeded GRPO line (conftest ``seeded_local_run``): ``head`` recomputes
old log-probs with the trainer; ``bypass`` sets ``algorithm.rollout_correction.bypass_mode=true``,
so verl takes the sampler's log-probs instead (the local engine vouches that they are the same
computation: ``LocalBackend.rollout_log_prob_problem``). Same seeds, same weights: the rollouts of
step 1 are the same, and the update may differ by float32 noise only.
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.slow


def _weights(ckpt, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(ckpt / f"global_step_{step}" / "actor" / "model.safetensors"))


@pytest.mark.timeout(1200)
def test_bypass_mode_skips_the_recompute_and_trains_as_recomputing_does(seeded_local_run):
    ref_run, skip_run = seeded_local_run("head"), seeded_local_run("bypass")
    ref, skip = ref_run.result, skip_run.result
    assert ref.returncode == 0, ref.tail()
    assert skip.returncode == 0, skip.tail()
    assert "actor_rollout_ref.rollout.calculate_log_probs=True" in skip.output  # derived by the switch
    for step in (1, 2):
        r, s = ref.step(step), skip.step(step)
        # the recompute ran in one run only
        assert "timing_s/old_log_prob" in r and "timing_s/old_log_prob" not in s, sorted(s)
        print(f"[bypass] step {step}: old_log_prob {r['timing_s/old_log_prob']:.2f}s skipped; "
              f"step {r['timing_s/step']:.1f}s -> {s['timing_s/step']:.1f}s")  # fmt: skip
        # the same rollouts (same weights, same per-sample seeds), hence the same rewards and advantages
        for key in ("critic/score/mean", "response_length/mean", "critic/advantages/mean"):
            assert r[key] == s[key], (step, key, r[key], s[key])
        # the update: float32 noise (measured: pg_loss 7e-9 and 2e-8 apart, the rest equal)
        assert abs(r["actor/pg_loss"] - s["actor/pg_loss"]) < 1e-6, (step, r["actor/pg_loss"], s["actor/pg_loss"])
        for key in ("actor/grad_norm", "actor/entropy", "actor/pg_clipfrac"):
            assert math.isclose(r[key], s[key], rel_tol=1e-5, abs_tol=1e-7), (step, key, r[key], s[key])
    # the weights after step 1: AdamW turns round-off in near-zero gradient entries into steps of up to lr, so
    # a few entries differ by ~1e-5 (printed); on average they are equal to float32 noise (measured 4.4e-10)
    w_ref, w_skip = _weights(ref_run.ckpt, 1), _weights(skip_run.ckpt, 1)
    assert w_ref.keys() == w_skip.keys()
    worst = max(float((w_ref[k] - w_skip[k]).abs().max()) for k in w_ref)
    mean = sum(float((w_ref[k] - w_skip[k]).abs().sum()) for k in w_ref) / sum(v.numel() for v in w_ref.values())
    print(f"[bypass] step-1 weights: max |diff| {worst:.3g}, mean |diff| {mean:.3g}")
    assert mean < 1e-8, mean
