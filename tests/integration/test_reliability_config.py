"""Config rules added for reliability: rejected by ``validate_remote_backend_config`` before Ray starts.

Unknown backend, single-forwarder violations and zero-replica rollout parallelism
are covered in ``test_config_errors.py``; this file adds model path, context
length, the shared ``remote_backend.{timeouts,liveness,retry}`` block, a missing
optional dependency, and resume checkpoints that are missing or partial.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import ray
import torch
from support.remote_e2e import REMOTE_BASE_OVERRIDES, REPO_ROOT, compose

from verl.remote_backend.errors import ConfigError, ResumeCheckpointError
from verl.remote_backend.launch.validation import validate_remote_backend_config
from verl.remote_backend.main_ppo import run
from verl.workers.remote_client.local.checkpoint import write_checkpoint_dir

BASE = [
    *REMOTE_BASE_OVERRIDES,
    "data.max_prompt_length=64",
    "data.max_response_length=32",
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A model directory as validation sees it: config.json with a 128-token context."""
    path = tmp_path_factory.mktemp("ctx_model")
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 128}))
    return str(path)


def cfg(model, *changes):
    keys = {c.split("=", 1)[0] for c in changes}
    base = [o for o in BASE + [f"actor_rollout_ref.model.path={model}"] if o.split("=", 1)[0] not in keys]
    return compose(base + list(changes))


def fails_before_ray(config, error=ConfigError) -> str:
    assert not ray.is_initialized()
    with pytest.raises(error) as info:
        run(config)
    assert not ray.is_initialized(), "validation must run before ray.init"
    return str(info.value)


def test_the_base_config_is_valid(model):
    assert validate_remote_backend_config(cfg(model)).name == "local"


@pytest.mark.parametrize(
    "path, problem",
    [
        ("null", "actor_rollout_ref.model.path=None: no model is set"),
        (
            "/nonexistent/models/qwen",
            "actor_rollout_ref.model.path='/nonexistent/models/qwen': no such model directory",
        ),
        ("'~/models/deepseek-llm-7b-chat'", "no such model directory. Fix: download the model first"),
    ],
)
def test_a_missing_model_path_is_rejected(model, path, problem):
    assert problem in fails_before_ray(cfg(model, f"actor_rollout_ref.model.path={path}"))


def test_a_directory_without_config_json_is_rejected(model, tmp_path):
    message = fails_before_ray(cfg(model, f"actor_rollout_ref.model.path={tmp_path}"))
    assert "has no config.json" in message


def test_a_hub_id_is_left_to_the_backend(model):
    plan = validate_remote_backend_config(cfg(model, "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct"))
    assert plan is not None


def test_response_length_above_the_model_context_is_rejected(model):
    message = fails_before_ray(cfg(model, "data.max_response_length=200"))
    assert message.startswith("data.max_response_length=200: the response length is above the model context")
    assert (
        "max_position_embeddings" in message
        and "= 128" in message
        and "Fix: set data.max_response_length <= 128" in message
    )


def test_prompt_plus_response_above_the_context_is_rejected(model):
    message = fails_before_ray(cfg(model, "data.max_prompt_length=100", "data.max_response_length=64"))
    assert "prompt + response (164 tokens) exceed the model context" in message


def test_a_smaller_max_model_len_is_the_context(model):
    message = fails_before_ray(cfg(model, "actor_rollout_ref.rollout.max_model_len=80"))
    assert "actor_rollout_ref.rollout.max_model_len = 80" in message


@pytest.mark.parametrize(
    "change, fragment",
    [
        ("remote_backend.timeouts.generate=-1", "remote_backend.timeouts.generate=-1: must be > 0"),
        ("remote_backend.liveness.failures=0", "remote_backend.liveness.failures=0: must be >= 1"),
        ("+remote_backend.timeouts.update_actr=5", "unknown key(s) ['remote_backend.timeouts.update_actr']"),
    ],
)
def test_bad_reliability_settings_are_rejected(model, change, fragment):
    assert fragment in fails_before_ray(cfg(model, change))


def test_the_reliability_blocks_are_not_backend_names(model):
    message = fails_before_ray(cfg(model, "trainer.remote_backend=timeouts"))
    assert "holds the shared reliability settings, not a backend" in message


def test_a_missing_optional_dependency_names_the_install_command(model):
    """arctic needs arctic-platform: without it validation fails with the pip command."""
    overrides = [o for o in BASE if not o.startswith("trainer.remote_backend")] + [
        "trainer.remote_backend=arctic",
        f"actor_rollout_ref.model.path={model}",
    ]
    code = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT / "tests")!r})
sys.modules["arctic_platform"] = None  # as if arctic-platform were not installed
import ray
from support.remote_e2e import compose
from verl.remote_backend import BackendImportError
from verl.remote_backend.main_ppo import run
try:
    run(compose({overrides!r}))
except BackendImportError as exc:
    assert not ray.is_initialized()
    print("ERROR:", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "ERROR:" in out.stdout, out.stderr[-3000:]
    assert "Remote backend 'arctic'" in out.stdout and "pip install 'verl-remote-backend[arctic]'" in out.stdout


# ---------------------------------------------------------------- resume checkpoints
def _save(root, step, files=None):
    """A complete checkpoint in the local backend's format (manifest + checksums) and verl's tracker."""
    actor = os.path.join(root, f"global_step_{step}", "actor")
    writers = {
        name: (lambda data: lambda f: open(f, "wb").write(data))(data)
        for name, data in (files or {"model.safetensors": b"w" * 64}).items()
    }
    write_checkpoint_dir(actor, step, writers)
    torch.save({"dataloader": step}, os.path.join(root, f"global_step_{step}", "data.pt"))  # verl's dataloader state
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as fh:
        fh.write(str(step))
    return actor


def _resume(model, root):
    return cfg(model, "trainer.resume_mode=auto", f"trainer.default_local_dir={root}")


def test_a_complete_checkpoint_is_accepted(model, tmp_path):
    _save(tmp_path, 1)
    assert validate_remote_backend_config(_resume(model, tmp_path)).resume_from == str(tmp_path / "global_step_1")


def test_a_truncated_checkpoint_file_is_rejected_and_the_previous_one_offered(model, tmp_path):
    _save(tmp_path, 1)
    actor = _save(tmp_path, 2)
    with open(os.path.join(actor, "model.safetensors"), "r+b") as fh:
        fh.truncate(10)
    message = fails_before_ray(_resume(model, tmp_path), ResumeCheckpointError)
    assert f"cannot resume from {tmp_path / 'global_step_2'}" in message
    assert "model.safetensors is truncated or corrupt: 10 bytes, manifest.json says 64" in message
    assert f"trainer.resume_mode=resume_path trainer.resume_from_path={tmp_path / 'global_step_1'}" in message


def test_a_same_size_corruption_is_caught_by_its_checksum_before_ray(model, tmp_path):
    _save(tmp_path, 1)
    actor = _save(tmp_path, 2)
    with open(os.path.join(actor, "model.safetensors"), "r+b") as fh:
        fh.seek(32)
        fh.write(b"X")  # same size: only the sha256 in manifest.json can tell
    message = fails_before_ray(_resume(model, tmp_path), ResumeCheckpointError)
    assert "model.safetensors is corrupt: its sha256 does not match manifest.json" in message
    assert str(tmp_path / "global_step_1") in message


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_verls_dataloader_state_is_checked_before_ray(model, tmp_path, damage):
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    data_pt = tmp_path / "global_step_2" / "data.pt"
    if damage == "missing":
        data_pt.unlink()
    else:
        data_pt.write_bytes(data_pt.read_bytes()[:40])
    message = fails_before_ray(_resume(model, tmp_path), ResumeCheckpointError)
    expected = f"{data_pt} is missing" if damage == "missing" else f"{data_pt} is truncated or corrupt"
    assert expected in message and f"trainer.resume_from_path={tmp_path / 'global_step_1'}" in message


def test_a_step_without_its_actor_folder_is_rejected(model, tmp_path):
    _save(tmp_path, 1)
    (tmp_path / "global_step_3").mkdir()
    message = fails_before_ray(
        cfg(model, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp_path / 'global_step_3'}"),
        ResumeCheckpointError,
    )
    assert "has no actor/ folder" in message and "global_step_1" in message


def test_a_tracker_naming_a_deleted_step_is_rejected_not_silently_restarted(model, tmp_path):
    _save(tmp_path, 1)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("5")
    message = fails_before_ray(_resume(model, tmp_path), ResumeCheckpointError)
    assert "names step 5, but" in message and "global_step_5 does not exist" in message
    assert str(tmp_path / "global_step_1") in message
