"""The distribution installs beside verl without touching verl's files, and every process can import it."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path, PurePosixPath

import pytest

import verl

OUR_PACKAGES = (
    "verl/remote_backend/",
    "verl/workers/remote_client/",
    "verl/workers/rollout/remote_rollout/",
    "hydra_plugins/verl_remote_backend/",  # in Hydra's plugin namespace: the search-path plugin
)


def _installed_files(dist: str) -> set[str]:
    # Read the metadata installed next to verl, not a build artefact in the checkout.
    site_dir = str(Path(verl.__file__).resolve().parents[1])
    (found,) = [d for d in importlib.metadata.distributions(path=[site_dir]) if d.metadata["Name"] == dist]
    files = found.files
    assert files, f"distribution {dist!r} has no RECORD"
    return {str(PurePosixPath(f)) for f in files if ".dist-info/" not in str(f) and "__pycache__" not in str(f)}


def test_installed_files_do_not_collide_with_verl():
    ours = _installed_files("verl-remote-backend")
    verls = _installed_files("verl")
    assert ours, "our distribution installed no files"
    assert not ours & verls, f"files owned by both distributions: {sorted(ours & verls)}"
    outside = [f for f in ours if not f.startswith(OUR_PACKAGES)]
    assert not outside, f"files installed outside our sub-packages (would be removed by uninstall): {outside}"
    assert "verl/__init__.py" in verls and "verl/__init__.py" not in ours


@pytest.mark.slow
def test_ray_worker_process_imports_the_plugin_and_adapters_package():
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote(num_cpus=1)
        def import_in_worker() -> dict:
            import os

            import verl.remote_backend
            import verl.workers.remote_client
            import verl.workers.rollout.remote_rollout
            from verl.remote_backend import RemoteBackendRegistry

            return {
                "pid": os.getpid(),
                "modules": [
                    verl.remote_backend.__name__,
                    verl.workers.remote_client.__name__,
                    verl.workers.rollout.remote_rollout.__name__,
                ],
                "names": RemoteBackendRegistry.list(),
            }

        result = ray.get(import_in_worker.remote(), timeout=180)
    finally:
        ray.shutdown()
    import os

    assert result["pid"] != os.getpid()
    assert result["modules"] == [
        "verl.remote_backend",
        "verl.workers.remote_client",
        "verl.workers.rollout.remote_rollout",
    ]
    assert {"local", "arctic"} <= set(result["names"])
