"""Snowflake's adapter and ours on the same batch against the same Arctic server (the session's
stand-in): ``tests/arctic_standin/side_by_side.py``, run in its own process because importing
Snowflake's adapter registers it as ``arctic``. Pins the differences the README's table states."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.remote_e2e import TESTS_DIR


@pytest.fixture(scope="module")
def side_by_side(standin_server, tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("side_by_side")
    proc = subprocess.run(
        [
            sys.executable,
            str(TESTS_DIR / "arctic_standin" / "side_by_side.py"),
            "--port",
            str(standin_server.port),
            "--model",
            tiny_model_dir,
            "--workdir",
            str(workdir),
            "--table",
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("{"))
    print("\n".join(lines[start + 1 :]))  # the Markdown table, for the README
    return json.loads(lines[start])


def test_forward_log_probs_agree_at_temperature_one(side_by_side):
    assert side_by_side["log_probs_t1_max_abs_diff"] < 1e-5


def test_their_forward_log_probs_ignore_the_temperature_and_ours_apply_it(side_by_side):
    assert side_by_side["theirs_t_vs_ours_t1_max_abs_diff"] < 1e-5  # theirs at T = ours at 1
    assert side_by_side["log_probs_t_max_abs_diff"] > 1e-2  # ours at T differ


def test_one_update_step_trains_the_same_weights_on_one_mini_batch(side_by_side):
    ours, theirs = side_by_side["ours"], side_by_side["theirs"]
    assert ours["grad_norm"] > 0
    assert theirs["grad_norm"] == pytest.approx(ours["grad_norm"], rel=1e-5)
    assert side_by_side["weights_after_max_abs_diff"] <= 1e-3 * side_by_side["weights_step_max_abs"]
