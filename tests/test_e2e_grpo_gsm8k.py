"""End to end: GRPO on a gsm8k subset through ``python -m verl.remote_backend.main_ppo``
with ``trainer.remote_backend=local`` - real Ray, real verl trainer, CPU only.

Besides the required metrics, the run also exercises the reference model (KL loss: the
forwarder's ``compute_ref_log_prob`` on the ``ref`` mesh) and a validation pass before
training (generation through the rollout replica with verl's validation sampling).
"""

from __future__ import annotations

import math

import pytest

from remote_e2e import REQUIRED_STEP_METRICS, e2e_assets, run_entry, small_ci_overrides

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return e2e_assets(tmp_path_factory.mktemp("e2e_assets"))


@pytest.mark.timeout(900)
def test_grpo_steps_on_gsm8k_log_finite_metrics_and_write_a_checkpoint(assets, tmp_path):
    ckpt = tmp_path / "ckpt"
    overrides = small_ci_overrides(
        model=assets["model"], train=assets["train"], test=assets["test"], ckpt_dir=ckpt, steps=2, save_freq=2
    ) + [
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=0.01",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "trainer.val_before_train=true",
    ]
    result = run_entry(overrides, workdir=tmp_path / "run")
    assert result.returncode == 0, result.tail()
    print(f"\n[e2e] wall {result.wall_s:.1f}s, peak PSS of the run's process tree {result.peak_pss_gb:.2f} GiB")

    assert [m["step"] for m in result.metrics] == [0, 1, 2]  # 0: the validation pass before training
    assert math.isfinite(result.step(0)["val-core/openai/gsm8k/acc/mean@1"])
    for step in (1, 2):
        metrics = result.step(step)
        timing = {k: round(v, 3) for k, v in metrics.items() if k.startswith("timing_s/") and "agent_loop" not in k}
        print(f"[e2e] step {step} timing: {timing}")
        for key in REQUIRED_STEP_METRICS:
            # verl renames the forwarder's actor/mfu to perf/mfu/actor when it logs it
            logged = "perf/mfu/actor" if key == "actor/mfu" else key
            assert logged in metrics, f"step {step}: {logged} missing from {sorted(metrics)}"
            assert math.isfinite(float(metrics[logged])), f"step {step}: {logged}={metrics[logged]}"
        # the local engine reports its CPU: MFU is measured against verl's CPU peak, so it is > 0
        assert metrics["perf/mfu/actor"] > 0 and metrics["perf/mfu/actor_infer"] > 0
        assert metrics["training/global_step"] == step
        assert "timing_s/ref" in metrics and math.isfinite(metrics["actor/kl_loss"])

    actor_ckpt = ckpt / "global_step_2" / "actor"
    assert (actor_ckpt / "manifest.json").is_file() and (actor_ckpt / "model.safetensors").is_file()
    assert (ckpt / "global_step_2" / "data.pt").is_file()  # verl's dataloader state, next to it
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    # the trainer tore the backend down in its finally
    assert "Traceback" not in result.output, result.tail()
