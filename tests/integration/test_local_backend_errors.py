"""Bad input to the local backend fails early with an error that names the key and the fix."""

from __future__ import annotations

import os

import pytest
import torch
from support.local_backend_helpers import engine_settings, main_config


def _cfg(model_path, **local):
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"path": model_path}, "actor": {"optim": {"lr": 1e-3}}},
            "remote_backend": {"local": local},
        }
    )


@pytest.mark.parametrize(
    "path, match", [(None, "no model is set"), ("/definitely/not/here", "no such model directory")]
)
def test_missing_model_path_names_the_key(path, match):
    from verl.remote_backend.errors import ConfigError
    from verl.workers.remote_client.local.config import EngineSettings

    with pytest.raises(ConfigError, match=f"actor_rollout_ref.model.path.*{match}"):
        EngineSettings.from_main_config(_cfg(path))


def test_directory_that_is_not_a_model_names_the_key(tmp_path):
    from verl.remote_backend.errors import ConfigError
    from verl.workers.remote_client.local.config import EngineSettings

    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path.*config.json"):
        EngineSettings.from_main_config(_cfg(str(tmp_path)))


def test_unloadable_weights_name_the_key(tiny_model_dir, tmp_path):
    import shutil

    from verl.remote_backend.errors import ConfigError
    from verl.workers.remote_client.local.config import EngineSettings
    from verl.workers.remote_client.local.engine import LocalEngine

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    with open(broken / "model.safetensors", "wb") as fh:
        fh.write(b"not a safetensors file")
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path.*not a loadable"):
        LocalEngine(EngineSettings.from_main_config(_cfg(str(broken))))


def test_backend_creation_fails_before_starting_ray_on_a_bad_path():
    """from_config validates first: no Ray session is needed to see the config error."""
    from verl.remote_backend.errors import ConfigError
    from verl.workers.remote_client.local.backend import LocalBackend

    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path"):
        LocalBackend.from_config(_cfg("/definitely/not/here"))


@pytest.mark.parametrize(
    "local, match",
    [
        ({"devcie": "cpu"}, r"unknown key.*remote_backend.local.devcie"),
        ({"device": "tpu"}, r"remote_backend.local.device='tpu': must be one of"),
        ({"dtype": "float64"}, r"remote_backend.local.dtype='float64': must be one of"),
        ({"max_batch_size": 0}, r"remote_backend.local.max_batch_size=0: must be >= 1"),
        ({"heap_keep_free_gib": -1}, r"remote_backend.local.heap_keep_free_gib=-1: must be >= 0"),
        ({"attn_implementation": "flash_attention_2"}, r"flash attention needs device=cuda"),
    ],
)
def test_invalid_backend_keys_are_named(tiny_model_dir, local, match):
    from verl.remote_backend.errors import ConfigError
    from verl.workers.remote_client.local.config import EngineSettings

    with pytest.raises(ConfigError, match=match):
        EngineSettings.from_main_config(_cfg(tiny_model_dir, **local))


def test_conflicting_grad_clip_keys_are_rejected(tiny_model_dir):
    from verl.remote_backend.errors import ConfigError
    from verl.workers.remote_client.local.config import EngineSettings

    cfg = main_config(tiny_model_dir, grad_clip=0.5, **{"optim.clip_grad": 2.0})
    with pytest.raises(ConfigError, match="grad_clip=0.5 and actor_rollout_ref.actor.optim.clip_grad=2.0"):
        EngineSettings.from_main_config(cfg)
    assert EngineSettings.from_main_config(main_config(tiny_model_dir, grad_clip=0.5)).grad_clip == 0.5
    assert EngineSettings.from_main_config(main_config(tiny_model_dir, **{"optim.clip_grad": 0.3})).grad_clip == 0.3


def test_warmup_ratio_without_a_step_count_is_rejected(tiny_model_dir):
    from verl.remote_backend.errors import ConfigError
    from verl.workers.remote_client.local.config import EngineSettings
    from verl.workers.remote_client.local.engine import LocalEngine

    cfg = main_config(tiny_model_dir, **{"optim.lr_warmup_steps_ratio": 0.1})
    with pytest.raises(ConfigError, match="trainer.total_training_steps"):
        LocalEngine(EngineSettings.from_main_config(cfg))


def test_reference_log_probs_without_a_reference_model_explain_the_switch(tiny_model_dir):
    from verl.workers.remote_client.local.engine import LocalEngine

    eng = LocalEngine(engine_settings(tiny_model_dir))
    ids = torch.nested.nested_tensor_from_jagged(torch.tensor([3, 4, 5]), torch.tensor([0, 3]))
    with pytest.raises(RuntimeError, match="use_kl_loss=true or algorithm.use_kl_in_reward=true"):
        eng.log_probs({"input_ids": ids}, ref=True)
    with pytest.raises(TypeError, match="nested-jagged"):
        eng.log_probs({"input_ids": torch.tensor([[3, 4, 5]])})
    with pytest.raises(ValueError, match="outside the vocabulary"):
        bad = torch.nested.nested_tensor_from_jagged(torch.tensor([3, 4, 99999]), torch.tensor([0, 3]))
        eng.log_probs({"input_ids": bad})


def test_ref_model_is_built_only_when_the_run_needs_one(tiny_model_dir):
    from omegaconf import OmegaConf

    from verl.workers.remote_client.local.config import EngineSettings

    assert not EngineSettings.from_main_config(main_config(tiny_model_dir)).need_ref
    assert EngineSettings.from_main_config(main_config(tiny_model_dir, use_kl_loss=True)).need_ref
    cfg = main_config(tiny_model_dir)
    OmegaConf.update(cfg, "algorithm.use_kl_in_reward", True)
    assert EngineSettings.from_main_config(cfg).need_ref


def test_yaml_defaults_equal_the_dataclass_defaults():
    import yaml

    import verl.remote_backend as rb
    from verl.remote_backend.settings.loader import build_settings
    from verl.workers.remote_client.local.config import LocalBackendConfig

    path = os.path.join(os.path.dirname(rb.__file__), "config", "backend", "local.yaml")
    with open(path) as fh:
        from_yaml = yaml.safe_load(fh)
    assert from_yaml == LocalBackendConfig().to_dict()
    assert build_settings(LocalBackendConfig, from_yaml, "remote_backend.local") == LocalBackendConfig()
