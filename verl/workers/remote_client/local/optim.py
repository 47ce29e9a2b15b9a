"""The actor's optimizer and LR schedule, built from ``actor_rollout_ref.actor.optim`` as verl builds them.

verl's FSDP engine uses ``verl.workers.config.optimizer.build_optimizer`` (any
``torch.optim``-style class named by ``optimizer``/``optimizer_impl``: lr,
betas, weight_decay, overrides) and a constant or cosine schedule with linear
warmup from ``verl.utils.torch_functional``; warmup steps come from
``lr_warmup_steps`` or, when that is <= 0, ``lr_warmup_steps_ratio *
total_training_steps``. We call the same functions with the same rules.
"""

from __future__ import annotations

from typing import Any

import torch

from .config import ConfigError, EngineSettings

__all__ = ["build_optimizer_and_scheduler"]


def build_optimizer_and_scheduler(model: torch.nn.Module, settings: EngineSettings) -> tuple[torch.optim.Optimizer, Any]:
    """Return ``(optimizer over model's trainable parameters, LambdaLR schedule)``.

    Raises:
        ConfigError: an invalid optim block, a warmup ratio or cosine schedule
            without a known number of training steps, or an unknown schedule type.
    """
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup
    from verl.workers.config import FSDPOptimizerConfig
    from verl.workers.config.optimizer import build_optimizer

    raw = dict(settings.optim)
    raw["total_training_steps"] = settings.total_training_steps
    raw.pop("grad_clip", None)  # deprecated alias; resolved into settings.grad_clip
    try:
        ocfg = omega_conf_to_dataclass(raw, FSDPOptimizerConfig)
    except Exception as exc:
        raise ConfigError(f"actor_rollout_ref.actor.optim is invalid: {exc}") from exc
    optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], ocfg)
    total = int(ocfg.total_training_steps)
    warmup = ocfg.lr_warmup_steps if ocfg.lr_warmup_steps is not None else -1
    if warmup <= 0:
        if ocfg.lr_warmup_steps_ratio > 0 and total <= 0:
            raise ConfigError(
                "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio > 0 needs the number of training steps: "
                "set trainer.total_training_steps or actor_rollout_ref.actor.optim.lr_warmup_steps"
            )
        warmup = int(ocfg.lr_warmup_steps_ratio * max(total, 0))
    if ocfg.lr_scheduler_type == "constant":
        scheduler = get_constant_schedule_with_warmup(optimizer=optimizer, num_warmup_steps=warmup)
    elif ocfg.lr_scheduler_type == "cosine":
        if total <= 0:
            raise ConfigError(
                "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine needs trainer.total_training_steps"
            )
        scheduler = get_cosine_schedule_with_warmup(
            optimizer=optimizer,
            num_warmup_steps=warmup,
            num_training_steps=total,
            min_lr_ratio=ocfg.min_lr_ratio or 0.0,
            num_cycles=ocfg.num_cycles,
            zero_indexed_step=ocfg.zero_indexed_step,
        )
    else:
        raise ConfigError(
            f"actor_rollout_ref.actor.optim.lr_scheduler_type={ocfg.lr_scheduler_type!r}: use constant or cosine"
        )
    return optimizer, scheduler
