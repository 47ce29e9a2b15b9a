"""``verl.remote_backend.testing.soak``: process roles, the least-squares trend, and step-boundary
sampling from verl's file logger (on this test's own process tree; no Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from verl.remote_backend.testing.soak import (
    ProcessSampler,
    StepSampler,
    Trend,
    _gcs_address,
    least_squares_slope,
    role_of,
)


def test_roles_come_from_ray_titles_executables_and_python_modules():
    assert role_of(["ray::EngineActor.generate"]) == "EngineActor"
    assert role_of(["ray::RemoteRolloutServer"]) == "RemoteRolloutServer"
    assert role_of(["ray::IDLE"]) == "IDLE"
    assert role_of(["/x/ray/core/src/ray/raylet/raylet", "--port=1"]) == "raylet"
    assert role_of(["/v/bin/python", "-m", "verl.remote_backend.main_ppo", "a=b"]) == "main_ppo"
    assert role_of(["/v/bin/python", "/v/lib/verl/remote_backend/launch/reaper.py", "5"]) == "reaper"
    assert role_of(["/v/bin/python", "-m", "x"], is_root=True) == "driver"


def test_gcs_address_is_read_from_a_daemons_flag():
    assert _gcs_address(["raylet", "--gcs-address=192.0.2.2:35493", "--x=1"]) == "192.0.2.2:35493"
    assert _gcs_address(["gcs_server", "--gcs_server_port=0"]) is None


def test_least_squares_slope_and_trend_read_growth_against_noise():
    assert least_squares_slope([0, 10, 20], [5.0, 6.0, 7.0]) == pytest.approx(0.1)
    assert least_squares_slope([3], [1.0]) is None
    trend = Trend.of([10, 20, 30, 40], [100.0, 104.0, 98.0, 102.0])
    assert trend.per_100_steps == pytest.approx(100 * least_squares_slope([10, 20, 30, 40], [100, 104, 98, 102]))
    assert (trend.first, trend.last, trend.max_rise, trend.spread) == (100.0, 102.0, 4.0, 6.0)


def test_step_sampler_samples_at_each_multiple_of_every_and_reports_after_the_warmup(tmp_path):
    """Contract: a sample is taken once verl's file logger has a finished step at or past the next
    multiple of ``every`` (a half-written line waits for the next call); every process of the tree
    under the given pid is recorded; the report fits only the samples after the warm-up."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        metrics = tmp_path / "metrics.jsonl"
        sampler = StepSampler(2, object_store=False)
        sampler(os.getpid(), metrics)  # no file yet: nothing to do
        assert sampler.sampler is not None and sampler.sampler.samples == []
        with open(metrics, "w") as fh:
            fh.write(json.dumps({"step": 1, "data": {}}) + "\n" + '{"step": 2, "da')
        sampler(os.getpid(), metrics)
        assert sampler.last_step == 1 and sampler.sampler.samples == []
        with open(metrics, "a") as fh:
            fh.write('ta": {}}\n' + "".join(json.dumps({"step": s, "data": {}}) + "\n" for s in (3, 4, 5)))
        sampler(os.getpid(), metrics)
        assert sampler.last_step == 5
        with open(metrics, "a") as fh:
            fh.write(json.dumps({"step": 6, "data": {}}) + "\n")
        sampler(os.getpid(), metrics)
        steps = sorted({s.step for s in sampler.sampler.samples})
        assert steps == [5, 6]
        pids = {s.pid for s in sampler.sampler.samples}
        assert {os.getpid(), child.pid} <= pids
        roles = {s.pid: s.role for s in sampler.sampler.samples}
        assert roles[os.getpid()] == "driver"
        assert all(s.rss_mb > 0 and s.threads >= 1 for s in sampler.sampler.samples)

        reports = sampler.report(warmup_steps=5)
        assert {r.pid for r in reports} >= {os.getpid(), child.pid}
        assert all(r.first_step == 6 and r.samples == 1 for r in reports)
        assert ProcessSampler(child.pid, object_store=False).sample(1)[0].role == "driver"
    finally:
        child.kill()
        child.wait()
