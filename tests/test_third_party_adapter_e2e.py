"""A new adapter class, defined outside the package and registered the documented way
(``@RemoteBackendRegistry.register`` + verl's ``VERL_USE_EXTERNAL_MODULES`` hook), drives
a GRPO step through the entry point with ``trainer.remote_backend=my-engine``."""

from __future__ import annotations

import math
import os

import pytest

from remote_e2e import REQUIRED_STEP_METRICS, TESTS_DIR, build_gsm8k, build_model, run_entry, small_ci_overrides

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_an_adapter_registered_outside_the_package_drives_a_grpo_step(tmp_path):
    train, test = build_gsm8k(tmp_path / "data", max_train=8, max_test=4)
    overrides = small_ci_overrides(
        model=build_model(tmp_path / "model"),
        train=train,
        test=test,
        ckpt_dir=tmp_path / "ckpt",
        steps=1,
        backend="my-engine",
    )
    env = {
        "VERL_USE_EXTERNAL_MODULES": "third_party_adapter",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])),
    }
    result = run_entry(overrides, workdir=tmp_path / "run", env_extra=env)
    assert result.returncode == 0, result.tail()
    out = result.output
    # created once on the driver, re-attached by the forwarder and the rollout server
    assert out.count("[my-engine] from_config owner=True") == 1
    assert out.count("[my-engine] from_config owner=False") >= 2
    for op in ("compute_log_prob ref=False", "update_actor", "update_weights"):
        assert f"[my-engine] {op}" in out, op
    assert "[my-engine] destroy owner=True" in out  # the trainer's finally
    metrics = result.step(1)
    for key in REQUIRED_STEP_METRICS:
        logged = "perf/mfu/actor" if key == "actor/mfu" else key
        assert math.isfinite(float(metrics[logged])), logged
