"""Fixtures shared across the suite: the tiny model and a Ray session (pytest finds them here)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny random Qwen2 model + tokenizer on disk, built once per session."""
    from verl.remote_backend.testing.tiny_model import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("local_backend_tiny")))


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray cluster for the module, unless one is already running (then it is shared)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()
        assert not ray.is_initialized()
