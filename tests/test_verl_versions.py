"""The supported verl releases: one glue module per release, chosen by the installed verl; any
other release fails on import of the package, naming the supported ones."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import verl
from verl.remote_backend.verl_versions import SUPPORTED_VERL_VERSIONS, installed_verl_version, verl_glue

pytestmark = pytest.mark.every_verl  # also on verl 0.9.1 (tests/conftest.py)

GLUE_DIR = Path(__file__).resolve().parents[1] / "verl" / "remote_backend" / "verl_versions"


def _public_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    names |= {
        t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    }
    names |= {node.target.id for node in tree.body if isinstance(node, ast.AnnAssign)}
    return {name for name in names if not name.startswith("_")}


def test_the_installed_release_picks_its_own_glue_module():
    assert installed_verl_version() == verl.__version__ in SUPPORTED_VERL_VERSIONS
    assert verl_glue().__name__.endswith("." + SUPPORTED_VERL_VERSIONS[verl.__version__])


def test_every_release_module_answers_the_same_questions():
    names = {module: _public_names(GLUE_DIR / f"{module}.py") for module in SUPPORTED_VERL_VERSIONS.values()}
    required = {
        "TASK_RUNNER_MODULE",
        "task_runner_class",
        "run_stock_ppo",
        "rollout_replicas",
        "uses_v1_trainer",
        "transfer_queue_cpus",
        "release_defaults",
        "check_release_settings",
    }
    for module, defined in names.items():
        assert required <= defined, f"{module} lacks {required - defined}"
    # a release may add its own helpers (v0_9.VerlTaskRunner, VerlTaskRunnerV1), never drop a shared name
    assert all(required | {"RELEASE_REQUIRED_SETTINGS"} <= defined for defined in names.values())


@pytest.mark.parametrize("version", ["0.8.0", "0.9.0", "0.6.1"])
def test_an_untested_verl_release_fails_on_import_naming_the_supported_ones(version):
    code = f"import verl; verl.__version__ = {version!r}; import verl.remote_backend"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: verl-remote-backend supports verl 0.7.1 and 0.9.1;"), result.stderr[-2000:]
    assert f"this environment has verl {version}" in last and "pip install verl==" in last
