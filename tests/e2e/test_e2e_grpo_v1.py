"""End to end on verl 0.9.1's V1 trainer (``PPOTrainerSync`` over TransferQueue), the remote path's
default there: GRPO through ``python -m verl.remote_backend.main_ppo`` with the local backend -
real Ray, real verl trainer, CPU only - and the same run on 0.9.1's legacy trainer
(``trainer.use_v1=false``) for comparison.

The runs are the session's seeded ``head`` (2 steps, a reward that varies within each group,
shared with test_resume_e2e, which resumes it) and ``legacy091`` (the same settings on the
legacy trainer), from conftest ``seeded_local_run``; verl writes every step's samples to
``<run>/rollouts/<step>.jsonl``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
from support.remote_e2e import LOGGED_STEP_METRICS, RunResult

from verl.remote_backend.verl_versions import installed_verl_version

pytestmark = [
    pytest.mark.slow,
    pytest.mark.every_verl,
    pytest.mark.skipif(installed_verl_version() != "0.9.1", reason="verl 0.9.1's V1 trainer"),
]

#: The one line the entry point prints for the keys it derived; on the V1 trainer it shrinks
#: TransferQueue's storage units, which the legacy trainer does not start.
V1_DERIVED = "transfer_queue.backend.SimpleStorage.num_data_storage_units=1 (was 8)"


def _groups(result: RunResult, step: int) -> dict[str, list[tuple[str, float]]]:
    """Step ``step``'s samples as verl dumped them: prompt text -> ``[(response text, score)]``."""
    path = Path(result.log_path).parent / "rollouts" / f"{step}.jsonl"
    groups: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        sample = json.loads(line)
        groups[sample["input"]].append((sample["output"], float(sample["score"])))
    return dict(groups)


def _assert_required_metrics(result: RunResult, step: int) -> dict:
    metrics = result.step(step)
    for key in LOGGED_STEP_METRICS:
        assert key in metrics, f"step {step}: {key} missing from {sorted(metrics)}"
        assert math.isfinite(float(metrics[key])), f"step {step}: {key}={metrics[key]}"
    # the local engine reports its CPU: MFU (of the update, and of the old log-probs) is > 0
    assert metrics["perf/mfu/actor"] > 0 and metrics["perf/mfu/actor_infer"] > 0
    assert metrics["training/global_step"] == step
    return metrics


@pytest.mark.timeout(1500)
def test_grpo_on_the_v1_trainer_trains_on_distinct_samples_per_group(seeded_local_run):
    run = seeded_local_run("head")
    result = run.result
    assert result.returncode == 0, result.tail()
    assert V1_DERIVED in result.output  # the V1 trainer ran, with one TransferQueue storage unit
    assert [m["step"] for m in result.metrics] == [1, 2]
    varied = 0
    for step in (1, 2):
        metrics = _assert_required_metrics(result, step)
        # every sample carries the weight version that sampled it (the rollout server's stamp):
        # the previous step's, in one piece
        assert metrics["training/off_policy/trajectory_staleness/mean"] == 0
        assert metrics["training/off_policy/trajectory_spans/max"] == 1
        assert math.isfinite(metrics["perf/remote/wall_s"]) and metrics["perf/remote/wall_s"] > 0
        groups = _groups(result, step)
        assert len(groups) == 4 and all(len(samples) == 2 for samples in groups.values()), groups
        # each sample of a group has its own seed: the n responses differ
        for prompt, samples in groups.items():
            assert len({text for text, _ in samples}) == len(samples), (prompt, samples)
        varied += sum(len({score for _, score in samples}) > 1 for samples in groups.values())
    assert varied > 0  # rewards vary within groups, so GRPO's advantages are not all zero
    assert run.latest_checkpoint == "2"
    assert "[remote_backend] destroyed backend 'local-resume-probe'" in result.output
    print(f"\n[v1] wall {result.wall_s:.1f}s, peak PSS {result.peak_pss_gb:.2f} GiB")


@pytest.mark.timeout(1500)
def test_the_legacy_trainer_still_runs_on_0_9_1_and_computes_the_v1_runs_first_step(seeded_local_run):
    v1, legacy = seeded_local_run("head").result, seeded_local_run("legacy091").result
    assert legacy.returncode == 0, legacy.tail()
    assert V1_DERIVED not in legacy.output
    assert [m["step"] for m in legacy.metrics] == [1, 2]
    for step in (1, 2):
        metrics = _assert_required_metrics(legacy, step)
        assert "training/off_policy/trajectory_staleness/mean" not in metrics  # a V1 metric

    # Same prompts, seeds and initial weights: both trainers sample the same responses and score them
    # alike in step 1 (each sample's seed is its identity, whichever agent loop runs it).
    def first_step(result: RunResult) -> dict:
        return {prompt: sorted(samples) for prompt, samples in _groups(result, 1).items()}

    assert first_step(v1) == first_step(legacy)
    first_v1, first_legacy = v1.step(1), legacy.step(1)
    assert first_v1["critic/score/mean"] == pytest.approx(first_legacy["critic/score/mean"], abs=1e-6)
    # and the backend computed the same update from the two layouts of the same samples
    for key in ("actor/grad_norm", "actor/entropy"):
        assert first_v1[key] == pytest.approx(first_legacy[key], rel=1e-4), key
    for step in (1, 2):
        for key in ("critic/score/mean", "actor/grad_norm", "actor/entropy", "timing_s/gen", "timing_s/step"):
            print(f"[v1 vs legacy] step {step} {key}: {v1.step(step)[key]} vs {legacy.step(step)[key]}")
    print(f"[v1 vs legacy] wall {v1.wall_s:.1f}s vs {legacy.wall_s:.1f}s")
