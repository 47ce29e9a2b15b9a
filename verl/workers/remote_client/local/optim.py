"""The actor's optimizer and LR schedule, built with verl's own functions.

The optimizer comes from ``verl.workers.config.optimizer.build_optimizer`` (any
``torch.optim``-style class named by ``optimizer``/``optimizer_impl``); the schedule is
the one :func:`verl.remote_backend.settings.verl_config.lr_schedule` derived, built with
``verl.utils.torch_functional``'s warm-up schedules as verl's FSDP engine builds it.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.remote_backend.errors import ConfigError

from .config import EngineSettings

__all__ = ["build_optimizer_and_scheduler"]

# Keys of verl's optimizer block that describe the schedule or clipping, read through
# EngineSettings.lr_schedule / grad_clip instead.
_NOT_OPTIMIZER_KEYS = (
    "grad_clip",
    "clip_grad",
    "total_training_steps",
    "lr_warmup_steps",
    "lr_warmup_steps_ratio",
    "lr_scheduler_type",
    "warmup_style",
    "min_lr_ratio",
    "num_cycles",
    "zero_indexed_step",
)


def build_optimizer_and_scheduler(
    model: torch.nn.Module, settings: EngineSettings
) -> tuple[torch.optim.Optimizer, Any]:
    """Return ``(optimizer over model's trainable parameters, LambdaLR schedule)``.

    Raises:
        ConfigError: an invalid optim block.
    """
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup
    from verl.workers.config import FSDPOptimizerConfig
    from verl.workers.config.optimizer import build_optimizer

    raw = {k: v for k, v in settings.optim.items() if k not in _NOT_OPTIMIZER_KEYS}
    try:
        ocfg = omega_conf_to_dataclass(raw, FSDPOptimizerConfig)
    except Exception as exc:
        raise ConfigError(f"actor_rollout_ref.actor.optim is invalid: {exc}") from exc
    optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], ocfg)
    schedule = settings.lr_schedule
    if schedule.style == "cosine":
        scheduler = get_cosine_schedule_with_warmup(
            optimizer=optimizer,
            num_warmup_steps=schedule.warmup_steps,
            num_training_steps=schedule.total_steps,
            min_lr_ratio=schedule.min_lr_ratio,
            num_cycles=schedule.num_cycles,
        )
    else:
        scheduler = get_constant_schedule_with_warmup(optimizer=optimizer, num_warmup_steps=schedule.warmup_steps)
    return optimizer, scheduler
