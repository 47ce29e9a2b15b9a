"""Both backends derive the same settings from the same verl config: grad clip, LR schedule,
reference model, model path (``verl/remote_backend/settings/verl_config.py``, verl 0.7.1's rules)."""

from __future__ import annotations

import os

import pytest

from verl.remote_backend.errors import ConfigError

pytest.importorskip("arctic_platform")

OPTIM = "actor_rollout_ref.actor.optim"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("hf_model")
    (path / "config.json").write_text("{}")  # nothing is loaded: a directory verl's rules accept
    return str(path)


def _config(model_path: str, overrides: dict):
    """verl's composed ``ppo_trainer`` config (4 prompts, mini-batches of 2, 2 epochs: 4 optimizer steps per step)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf, open_dict

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer")
    base = {
        "actor_rollout_ref.model.path": model_path,
        f"{OPTIM}.lr": 1e-3,
        "data.train_batch_size": 4,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
        "actor_rollout_ref.actor.ppo_epochs": 2,
        "trainer.default_local_dir": "/tmp/ckpt",
    }
    with open_dict(cfg):
        for key, value in {**base, **overrides}.items():
            OmegaConf.update(cfg, key, value, merge=True)
    return cfg


def _local(cfg) -> dict:
    from verl.workers.remote_client.local.config import EngineSettings

    s = EngineSettings.from_main_config(cfg)
    schedule = s.lr_schedule
    return {
        "grad_clip": s.grad_clip,
        "schedule": (
            schedule.style,
            schedule.warmup_steps,
            schedule.total_steps if schedule.style == "cosine" else None,
            schedule.min_lr_ratio if schedule.style == "cosine" else None,
        ),
        "need_ref": s.need_ref,
        "model_path": s.model_path,
    }


def _arctic(cfg) -> dict:
    """What the Arctic backend sends its server, read back in verl's units (global steps)."""
    from verl.workers.remote_client.arctic.config import load_arctic_config
    from verl.workers.remote_client.arctic.derive import build_client_config, optimizer_steps_per_global_step

    client = build_client_config(cfg, load_arctic_config(cfg))
    ds = client.training.ds_config
    per_step = optimizer_steps_per_global_step(cfg)
    sched = ds.get("scheduler")
    if sched is None:
        schedule = ("constant", 0, None, None)
    elif sched["type"] == "WarmupLR":
        schedule = ("constant", sched["params"]["warmup_num_steps"] // per_step, None, None)
    else:
        p = sched["params"]
        schedule = ("cosine", p["warmup_num_steps"] // per_step, p["total_num_steps"] // per_step, p["cos_min_ratio"])
    return {
        "grad_clip": ds["gradient_clipping"],
        "schedule": schedule,
        "need_ref": client.log_prob_gpus > 0,
        "model_path": client.model_name,
    }


# case -> (verl overrides, expected grad clip, expected (style, warm-up, horizon, floor), reference needed)
CASES = {
    "verl defaults": ({}, 1.0, ("constant", 0, None, None), False),
    "legacy actor.grad_clip": ({"actor_rollout_ref.actor.grad_clip": 0.5}, 0.5, ("constant", 0, None, None), False),
    "optim.clip_grad": ({f"{OPTIM}.clip_grad": 0.3}, 0.3, ("constant", 0, None, None), False),
    "deprecated optim.grad_clip wins over clip_grad": (
        {f"{OPTIM}.grad_clip": 0.7, f"{OPTIM}.clip_grad": 1.0},
        0.7,
        ("constant", 0, None, None),
        False,
    ),
    "same value under both keys": (
        {"actor_rollout_ref.actor.grad_clip": 2.0, f"{OPTIM}.clip_grad": 2.0},
        2.0,
        ("constant", 0, None, None),
        False,
    ),
    "warm-up steps, constant": (
        {f"{OPTIM}.lr_warmup_steps": 3, "trainer.total_training_steps": 10},
        1.0,
        ("constant", 3, None, None),
        False,
    ),
    "warm-up ratio of trainer.total_training_steps": (
        {f"{OPTIM}.lr_warmup_steps_ratio": 0.25, "trainer.total_training_steps": 8},
        1.0,
        ("constant", 2, None, None),
        False,
    ),
    "warm-up steps win over the ratio": (
        {f"{OPTIM}.lr_warmup_steps": 1, f"{OPTIM}.lr_warmup_steps_ratio": 0.5, "trainer.total_training_steps": 8},
        1.0,
        ("constant", 1, None, None),
        False,
    ),
    "cosine with a floor, optim horizon wins over trainer's": (
        {
            f"{OPTIM}.lr_scheduler_type": "cosine",
            f"{OPTIM}.min_lr_ratio": 0.1,
            f"{OPTIM}.lr_warmup_steps": 2,
            f"{OPTIM}.total_training_steps": 12,
            "trainer.total_training_steps": 99,
        },
        1.0,
        ("cosine", 2, 12, 0.1),
        False,
    ),
    "deprecated warmup_style wins over lr_scheduler_type": (
        {
            f"{OPTIM}.warmup_style": "cosine",
            f"{OPTIM}.lr_scheduler_type": "constant",
            "trainer.total_training_steps": 6,
        },
        1.0,
        ("cosine", 0, 6, 0.0),
        False,
    ),
    "KL loss needs a reference": (
        {"actor_rollout_ref.actor.use_kl_loss": True},
        1.0,
        ("constant", 0, None, None),
        True,
    ),
    "KL in reward needs a reference": ({"algorithm.use_kl_in_reward": True}, 1.0, ("constant", 0, None, None), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_both_backends_derive_the_same_settings(model_dir, case):
    overrides, grad_clip, schedule, need_ref = CASES[case]
    cfg = _config(model_dir, overrides)
    local, arctic = _local(cfg), _arctic(cfg)
    assert local == arctic
    assert local == {"grad_clip": grad_clip, "schedule": schedule, "need_ref": need_ref, "model_path": model_dir}


def test_a_local_model_path_reaches_both_backends_absolute(model_dir, monkeypatch):
    parent, name = os.path.split(model_dir)
    monkeypatch.chdir(parent)
    cfg = _config(name, {})  # relative to the working directory
    assert _local(cfg)["model_path"] == _arctic(cfg)["model_path"] == model_dir


@pytest.mark.parametrize(
    "overrides, match",
    [
        (
            {"actor_rollout_ref.actor.grad_clip": 0.5, f"{OPTIM}.clip_grad": 2.0},
            "grad_clip=0.5 and .*clip_grad=2.0 disagree",
        ),
        ({f"{OPTIM}.clip_grad": 0.0}, r"clip_grad=0.0: verl always clips"),
        ({f"{OPTIM}.lr_warmup_steps_ratio": 0.1}, "needs the number of training steps"),
        ({f"{OPTIM}.lr_scheduler_type": "cosine"}, "cosine needs the number of training steps"),
        (
            {f"{OPTIM}.lr_scheduler_type": "cosine", f"{OPTIM}.min_lr_ratio": 1.5, "trainer.total_training_steps": 4},
            r"min_lr_ratio=1.5: .*Fix: set it in \[0, 1\]",
        ),
        ({"actor_rollout_ref.model.path": None}, r"actor_rollout_ref.model.path=None: no model is set"),
    ],
)
def test_both_backends_refuse_the_same_settings(model_dir, overrides, match):
    cfg = _config(model_dir, overrides)
    with pytest.raises(ConfigError, match=match):
        _local(cfg)
    with pytest.raises(ConfigError, match=match):
        _arctic(cfg)
