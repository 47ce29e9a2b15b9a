"""The adapter conformance kit: it passes for our backends and the README's example adapter, and
each deliberately broken adapter (tests/support/broken_adapters.py) fails exactly the check meant to
catch it, with a message naming the check and the measured value."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.broken_adapters import BROKEN, STUB_NAME

from verl.remote_backend.testing.conformance import CHECKS, KitOptions, kit_config, run_conformance

pytestmark = pytest.mark.slow

#: the kit on both releases in CI (.ci/run); the broken adapters on verl 0.7.1 only there (verl-independent checks).
every_verl = pytest.mark.every_verl

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent


def _kit_cli(args: list[str], *, cwd: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "verl.remote_backend.testing", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def _report_lines(output: str) -> dict[str, str]:
    lines = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1] in CHECKS:
            lines[parts[1]] = parts[0]
    return lines


@every_verl
def test_the_kit_passes_for_the_local_backend_from_the_command_line(tmp_path):
    proc = _kit_cli(["--backend", "local"], cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    statuses = _report_lines(proc.stdout)
    assert set(statuses) == set(CHECKS), out[-4000:]
    assert all(status == "PASS" for status in statuses.values()), statuses
    assert "backend 'local': 24 passed, 0 failed" in proc.stdout


@every_verl
def test_the_readme_adapter_passes_as_pytest_tests_from_its_own_file(tmp_path):
    readme = (REPO_ROOT / "README.md").read_text()
    code = readme.split("## Writing your own adapter", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_engine_adapter.py").write_text(code)
    (tmp_path / "test_my_engine_conformance.py").write_text(
        textwrap.dedent("""
        from verl.remote_backend.testing.pytest_support import conformance_test

        test_my_engine = conformance_test("my-engine")
    """)
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "VERL_USE_EXTERNAL_MODULES": "my_engine_adapter"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "test_my_engine_conformance.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # every check is a test case: the example delegates to the local engine and has its capabilities
    # except the ones it does not forward (health, log_location, ...), which pass as "absent"
    assert f"{len(CHECKS)} passed" in proc.stdout, out[-4000:]


@pytest.fixture(scope="module")
def kit_ray():
    """A Ray cluster whose workers import the broken adapters (the kit re-attaches in workers)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    env = {"PYTHONPATH": str(TESTS_DIR), "VERL_USE_EXTERNAL_MODULES": "support.broken_adapters"}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    yield
    ray.shutdown()


@pytest.mark.parametrize("name", sorted(BROKEN))  # CI: 0.7.1 only, the checks are verl-independent (~4 min)
def test_a_broken_adapter_fails_exactly_the_check_meant_to_catch_it(kit_ray, tiny_model_dir, name):
    report = run_conformance(name, kit_config(name, model_path=tiny_model_dir))
    failed = [r for r in report.results if r.status == "fail"]
    assert [r.check for r in failed] == [BROKEN[name]], report.text()
    line = failed[0].line()
    assert line.startswith("FAIL") and BROKEN[name] in line and "contract:" in line, line
    assert failed[0].detail, line  # the measured value or what the backend did


#: the checks that need a real model, deselected for the model-free stub, and why
STUB_NEEDS_A_MODEL = {
    "2.alignment": "sampler-vs-trainer parity needs a model: the stub's sampler and trainer report the same "
    "constant log-prob, so their agreement says nothing about slot alignment",
    "4.direction": "learning needs a model: the stub has no weights, so an update moves no log-prob",
    "4.sampler-follows": "needs a model that learns: the stub's sampler cannot change after update_weights",
    "6.resume": "restoring needs state: the stub has no weights or optimizer to save and load, so equal "
    "log-probs after a load would prove nothing",
}


@every_verl
def test_the_stub_backend_passes_every_model_free_check(kit_ray, tiny_model_dir):
    model_free = [check for check in CHECKS if check not in STUB_NEEDS_A_MODEL]
    report = run_conformance(STUB_NAME, kit_config(STUB_NAME, model_path=tiny_model_dir), KitOptions(checks=model_free))
    statuses = {r.check: r.status for r in report.results}
    assert {check: statuses[check] for check in model_free} == {check: "pass" for check in model_free}, report.text()
    assert all(report.get(check).detail == "not selected" for check in STUB_NEEDS_A_MODEL), report.text()


def test_the_kit_passes_for_arctic_on_the_standin(tmp_path, tiny_model_dir):
    from arctic_standin.harness import free_port, start_standin

    port = free_port()
    server = start_standin(port, str(tmp_path / "logs"), log_prob_gpus=1)
    try:
        proc = _kit_cli(
            [
                "--backend", "arctic",
                f"actor_rollout_ref.model.path={tiny_model_dir}",
                f"trainer.default_local_dir={tmp_path / 'ckpt'}",
                f"remote_backend.arctic.port={port}",
                "remote_backend.arctic.launch_server=false",
                "remote_backend.arctic.device.type=cpu",
                "remote_backend.arctic.connect_timeout_s=5",
            ],
            cwd=tmp_path,
        )  # fmt: skip
    finally:
        server.stop()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    statuses = _report_lines(proc.stdout)
    assert set(statuses) == set(CHECKS) and "FAIL" not in statuses.values(), statuses
