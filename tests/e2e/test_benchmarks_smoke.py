"""The benchmark suite at tiny sizes (``python -m benchmarks.run --smoke``), so it cannot rot.

No thresholds are judged (tiny sizes measure fixed costs only); the test checks
that every row runs end to end and reports finite, positive figures, and that
the GRPO run logs the per-step ``perf/remote/*`` overhead metrics.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from support.remote_e2e import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1200)
def test_every_benchmark_row_runs_at_smoke_size(tmp_path):
    out = tmp_path / "results.json"
    table = tmp_path / "results.md"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--smoke", "--json", str(out), "--out", str(table)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    results = json.loads(out.read_text())["results"]
    rows = {r["row"].split()[0] for r in results}
    assert rows == {"1", "2", "3", "4", "5", "6", "7"}, rows
    for r in results:
        assert r["met"] is None  # smoke mode judges no targets
        for key in ("a", "b", "ratio"):
            if r[key] is not None:
                assert math.isfinite(r[key]) and r[key] >= 0, r
        assert r["b"] is None or r["b"] > 0, r  # a reference figure of zero would make the ratio meaningless
    forwarding = [r for r in results if r["row"].startswith("1")]
    assert {r["case"].split()[0] for r in forwarding} == {"compute_log_prob", "update_actor"}
    share = next(r for r in results if r["row"].startswith("3") and r["target"])
    assert 0 < share["ratio"] < 1 and share["extra"]["perf/remote/compute_s"] > 0
    assert "| row | case |" in table.read_text()
