"""End to end: GRPO on a gsm8k subset through ``python -m verl.remote_backend.main_ppo``
with ``trainer.remote_backend=local`` - real Ray, real verl trainer, CPU only.

Besides the required metrics, the run also exercises the reference model (KL loss: the
forwarder's ``compute_ref_log_prob`` on the ``ref`` mesh) and a validation pass before
training (generation through the rollout replica with verl's validation sampling).

The run is verl's own GRPO command line with the switch added, two steps, shared for the
session with test_derived_settings (conftest ``verl_grpo_line_run``): that line already has the
KL loss, validates before training and checkpoints at its last step. Its logger is
``console`` + ``wandb`` (offline), so the metrics are read from verl's console lines.
"""

from __future__ import annotations

import math
import re

import pytest
from support.remote_e2e import REQUIRED_STEP_METRICS

pytestmark = [pytest.mark.slow, pytest.mark.every_verl]  # CI runs it on both releases (.ci/run)


@pytest.mark.timeout(900)
def test_grpo_steps_on_gsm8k_log_finite_metrics_and_write_a_checkpoint(verl_grpo_line_run):
    run = verl_grpo_line_run("local")
    result, ckpt = run.result, run.ckpt
    assert result.returncode == 0, result.tail()
    print(f"\n[e2e] wall {result.wall_s:.1f}s, peak PSS of the run's process tree {result.peak_pss_gb:.2f} GiB")

    assert result.console_steps() == [0, 1, 2]  # 0: the validation pass before training
    assert math.isfinite(result.console_step(0)["val-core/openai/gsm8k/acc/mean@1"])
    for step in (1, 2):
        metrics = result.console_step(step)
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
    assert "[remote_backend] destroyed backend 'local'" in result.output
    assert not unexplained_tracebacks(result.output), result.tail()


def unexplained_tracebacks(output: str) -> list[int]:
    """Line numbers in ``output`` of tracebacks that are not wandb's own shutdown: any traceback
    before the trainer destroyed the backend, and after it any stack frame outside wandb's shutdown
    (:func:`_in_wandbs_shutdown`).

    The line's ``trainer.logger`` includes wandb: when the run ends, the TaskRunner actor can be
    stopped while wandb's atexit hook and verl's ``Tracking.__del__`` still close wandb's service
    connection, and Python prints those as "Exception ignored in ..." with tracebacks inside wandb
    (seen on a loaded 2-core box; Ray interleaves the two). They come after the run's own teardown;
    any other traceback counts."""
    lines = output.splitlines()
    teardown = next((i for i, line in enumerate(lines) if "[remote_backend] destroyed backend" in line), len(lines))
    found = [i for i, line in enumerate(lines[:teardown]) if "Traceback (most recent call last)" in line]
    for i, line in enumerate(lines[teardown:], teardown):
        frame = re.search(r'File "([^"]+)"', line)
        if frame and not _in_wandbs_shutdown(frame.group(1)):
            found.append(i)
    return found


def _in_wandbs_shutdown(path: str) -> bool:
    """A frame of wandb's shutdown: wandb itself, verl's ``Tracking.__del__``, or the standard library
    under them (wandb's service connection is asyncio)."""
    stdlib = "site-packages" not in path and "/lib/python3" in path
    return "/site-packages/wandb/" in path or path.endswith("/verl/utils/tracking.py") or stdlib
