"""The supported verl releases: one glue module per release, chosen by the installed verl; any
other release fails on import of the package, naming the supported ones."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import verl
from verl.remote_backend.verl_versions import SUPPORTED_VERL_VERSIONS, installed_verl_version, verl_glue

pytestmark = pytest.mark.every_verl  # CI runs it on both releases (.ci/run)

GLUE_DIR = Path(__file__).resolve().parents[2] / "verl" / "remote_backend" / "verl_versions"


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


#: What verl's ``release/v0.7.1`` branch (upstream's remote-backend seam, pull request #6422) installs
#: under this package's folder, as its wheel's RECORD lists it, beside one of verl's ordinary files.
UPSTREAM_SEAM_RECORD = [
    "verl/__init__.py",
    "verl/remote_backend/__init__.py",
    "verl/remote_backend/base.py",
    "verl/remote_backend/trainer.py",
    "verl/remote_backend/worker_utils.py",
]


def _verl_distribution_shipping(tmp_path: Path, record: list[str]) -> dict[str, str]:
    """An environment (``PYTHONPATH``) in which the installed ``verl`` distribution's metadata is a
    verl whose RECORD lists ``record``: what pip leaves after installing such a verl."""
    dist_info = tmp_path / f"verl-{verl.__version__}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: verl\nVersion: {verl.__version__}\n")
    (dist_info / "RECORD").write_text("".join(f"{path},,\n" for path in record))
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_a_pypi_verl_ships_no_file_in_this_packages_folders():
    from verl.remote_backend.verl_versions import verl_files_in_own_subpackages

    assert verl_files_in_own_subpackages() == []


@pytest.mark.parametrize("entry", ["import verl.remote_backend", "import verl.remote_backend.main_ppo"])
def test_a_verl_that_ships_its_own_remote_backend_is_refused_on_import_naming_the_clash_and_the_fix(tmp_path, entry):
    env = _verl_distribution_shipping(tmp_path, UPSTREAM_SEAM_RECORD)
    result = subprocess.run([sys.executable, "-c", entry], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: verl-remote-backend cannot share an environment with this verl"), last
    assert "verl/remote_backend/base.py" in last and "release/v0.7.1" in last
    assert "pip install --force-reinstall --no-deps verl==" in last and "pip uninstall verl-remote-backend" in last


def test_a_verl_record_without_the_seam_imports_the_package(tmp_path):
    env = _verl_distribution_shipping(tmp_path, ["verl/__init__.py", "verl/trainer/main_ppo.py"])
    result = subprocess.run(
        [sys.executable, "-c", "import verl.remote_backend"], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
