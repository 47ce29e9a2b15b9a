"""Helpers of the local-backend tests: engine settings, verl's composed config, the engine's
live status. verl-shaped batches come from :mod:`verl.remote_backend.testing.batches`."""

from __future__ import annotations

from typing import Any

from verl.remote_backend.testing.batches import (
    PAD_ID,
    dense_rollout_batch,
    random_rollouts,
    random_update_batch,
    to_no_padding,
)

__all__ = [
    "PAD_ID",
    "dense_rollout_batch",
    "random_rollouts",
    "random_update_batch",
    "to_no_padding",
    "engine_info",
    "engine_settings",
    "main_config",
]


async def engine_info(backend: Any) -> dict[str, Any]:
    """The local engine actor's live status (pid, global_step, policy_version, batches_run, ...)."""
    return await backend.reconnect_handle()["actor"].info.remote()


def engine_settings(model_dir: str, **overrides: Any):
    from verl.workers.remote_client.local.config import EngineSettings

    base = dict(model_path=model_dir, optim={"lr": 1e-3, "weight_decay": 0.01})
    base.update(overrides)
    return EngineSettings(**base)


def main_config(model_dir: str, **actor_overrides: Any):
    """verl's real composed ``ppo_trainer`` config, pointed at the tiny model, with our block added."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf, open_dict

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer")
    with open_dict(cfg):
        cfg.actor_rollout_ref.model.path = model_dir
        cfg.actor_rollout_ref.actor.optim.lr = 1e-3
        cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 4
        cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 4
        cfg.actor_rollout_ref.actor.use_torch_compile = False
        for key, val in actor_overrides.items():
            OmegaConf.update(cfg, f"actor_rollout_ref.actor.{key}", val, merge=True)
        cfg.remote_backend = {"local": {"num_cpus": 1}}
    return cfg
