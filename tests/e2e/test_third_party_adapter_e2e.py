"""A new adapter class, defined outside the package and registered the documented way
(``@RemoteBackendRegistry.register`` + verl's ``VERL_USE_EXTERNAL_MODULES`` hook), drives
a GRPO step through the entry point with ``trainer.remote_backend=my-engine``.

The run is verl's own GRPO command line with ``trainer.remote_backend=my-engine``, shared for
the session with test_derived_settings (conftest ``verl_grpo_line_run``); its logger is
``console`` + ``wandb`` (offline), so the metrics are read from verl's console line."""

from __future__ import annotations

import math

import pytest
from support.remote_e2e import REQUIRED_STEP_METRICS

pytestmark = [pytest.mark.slow, pytest.mark.every_verl]  # CI runs it on both releases (.ci/run)


@pytest.mark.timeout(900)
def test_an_adapter_registered_outside_the_package_drives_a_grpo_step(verl_grpo_line_run):
    result = verl_grpo_line_run("my-engine").result
    assert result.returncode == 0, result.tail()
    out = result.output
    # created once on the driver, re-attached by the forwarder and the rollout server
    assert out.count("[my-engine] from_config owner=True") == 1
    assert out.count("[my-engine] from_config owner=False") >= 2
    for op in ("compute_log_prob ref=False", "update_actor", "update_weights"):
        assert f"[my-engine] {op}" in out, op
    assert "[my-engine] destroy owner=True" in out  # the trainer's finally
    metrics = result.console_step(1)
    for key in REQUIRED_STEP_METRICS:
        logged = "perf/mfu/actor" if key == "actor/mfu" else key
        assert math.isfinite(float(metrics[logged])), logged
