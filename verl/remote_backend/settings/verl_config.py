"""What every backend reads from verl's own config, derived once, the way verl 0.7.1 does.

The model to load, the max gradient norm, the LR schedule and whether a reference model
is needed: plain functions of verl's main config (no backend import), so the local and
the Arctic backend cannot drift apart. Each raises :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Optional

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.settings.loader import select

__all__ = [
    "MODEL_PATH_KEY",
    "model_path",
    "local_model_dir",
    "max_grad_norm",
    "LrSchedule",
    "lr_schedule",
    "needs_reference",
]

MODEL_PATH_KEY = "actor_rollout_ref.model.path"
_ACTOR = "actor_rollout_ref.actor"
_OPTIM = f"{_ACTOR}.optim"
# "org/name" Hugging Face hub ids: fetched later by whoever loads the model.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_REMOTE_PREFIXES = ("hdfs://", "s3://", "gs://", "http://", "https://")
# verl's default for both gradient-clipping keys (actor.grad_clip, actor.optim.clip_grad)
_VERL_DEFAULT_CLIP = 1.0


def model_path(main_config: Any, key: str = MODEL_PATH_KEY) -> str:
    """The model (or, with ``key=...tokenizer_path``, the tokenizer) to load, as a backend passes it on.

    A hub id (``org/name``, when no such local path exists) or a remote URI is returned as
    written; anything else is a local path, returned absolute with ``~`` expanded (a
    backend's server may run in another working directory). The filesystem is not checked
    here: :func:`local_model_dir` does.

    Raises:
        ConfigError: the key is unset.
    """
    raw = _raw_path(main_config, key)
    local = os.path.abspath(os.path.expanduser(raw))
    if raw.startswith(_REMOTE_PREFIXES) or (_HUB_ID.match(raw) and not os.path.exists(local)):
        return raw
    return local


def local_model_dir(main_config: Any, key: str = MODEL_PATH_KEY, *, need_config_json: bool = True) -> Optional[str]:
    """The local directory :func:`model_path` names, checked; ``None`` for a hub id or a remote URI.

    Raises:
        ConfigError: the key is unset, names no directory, or (with ``need_config_json``)
            a directory without a Hugging Face ``config.json``.
    """
    raw = _raw_path(main_config, key)
    path = model_path(main_config, key)
    if not os.path.isabs(path):
        return None  # a hub id or a remote URI: fetched by whoever loads it
    if not os.path.isdir(path):
        raise ConfigError.for_setting(
            key,
            raw,
            "no such model directory",
            f"download the model first (e.g. `huggingface-cli download <repo> --local-dir <dir>`) and set {key}=<dir>",
        )
    if need_config_json and not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError.for_setting(
            key,
            raw,
            "the directory has no config.json, so it is not a Hugging Face model",
            f"point {key} at the folder holding the model's config.json",
        )
    return path


def _raw_path(main_config: Any, key: str) -> str:
    raw = select(main_config, key)
    if raw is None or not str(raw).strip():
        raise ConfigError.for_setting(key, raw, "no model is set", f"set {key}=<Hugging Face model directory>")
    return str(raw).strip()


def max_grad_norm(main_config: Any) -> float:
    """The max gradient norm clipped to before every optimizer step.

    verl's engine (the worker path remote backends use) clips to ``actor.optim.clip_grad``,
    overridden by its deprecated alias ``actor.optim.grad_clip`` when set; verl's legacy
    actor reads ``actor.grad_clip``. verl defaults both to 1.0, so a command line written
    for either path means the one that differs from 1.0; two different non-default
    values are ambiguous.

    Raises:
        ConfigError: the two keys disagree, or the norm is not > 0.
    """
    alias = select(main_config, f"{_OPTIM}.grad_clip")
    optim_key = f"{_OPTIM}.grad_clip" if alias is not None else f"{_OPTIM}.clip_grad"
    optim = alias if alias is not None else select(main_config, f"{_OPTIM}.clip_grad")
    legacy = select(main_config, f"{_ACTOR}.grad_clip")
    values = {float(v) for v in (legacy, optim) if v is not None}
    custom = values - {_VERL_DEFAULT_CLIP}
    if len(custom) > 1:
        raise ConfigError(
            f"{_ACTOR}.grad_clip={legacy} and {optim_key}={optim} disagree; set both to the same max gradient norm"
        )
    norm = custom.pop() if custom else _VERL_DEFAULT_CLIP
    if not norm > 0:
        key = f"{_ACTOR}.grad_clip" if legacy is not None and float(legacy) == norm else optim_key
        raise ConfigError.for_setting(key, norm, "verl always clips the gradient norm to this bound", "set it > 0")
    return norm


@dataclass(frozen=True)
class LrSchedule:
    """verl's learning-rate schedule, counted in verl global steps (one scheduler step per update).

    Attributes:
        style: ``constant`` (after warm-up) or ``cosine`` (decay to ``min_lr_ratio x lr``).
        warmup_steps: linear warm-up from 0 over this many steps (0: none).
        total_steps: the horizon (-1: unknown, allowed only for ``constant``).
        min_lr_ratio: the cosine's floor, in [0, 1].
        num_cycles: cosine cycles over the horizon (verl's default 0.5 = one half-wave).
    """

    style: str = "constant"
    warmup_steps: int = 0
    total_steps: int = -1
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5


def lr_schedule(main_config: Any) -> LrSchedule:
    """The schedule verl's engine builds from ``actor.optim`` (``FSDPOptimizerConfig``).

    ``warmup_style`` (deprecated) overrides ``lr_scheduler_type`` when set; the horizon is
    ``optim.total_training_steps`` when > 0, else ``trainer.total_training_steps``; warm-up
    is ``optim.lr_warmup_steps`` when > 0, else ``int(lr_warmup_steps_ratio x horizon)``.

    Raises:
        ConfigError: an unknown style, a warm-up ratio or cosine without a known horizon,
            or a ``min_lr_ratio`` outside [0, 1].
    """
    style = select(main_config, f"{_OPTIM}.warmup_style") or select(
        main_config, f"{_OPTIM}.lr_scheduler_type", "constant"
    )
    if style not in ("constant", "cosine"):
        raise ConfigError.for_setting(
            f"{_OPTIM}.lr_scheduler_type", style, "verl knows no such schedule", "use constant or cosine"
        )
    total = int(select(main_config, f"{_OPTIM}.total_training_steps", -1))
    if total <= 0:
        total = int(select(main_config, "trainer.total_training_steps", -1))
    total = total if total > 0 else -1
    warmup = int(select(main_config, f"{_OPTIM}.lr_warmup_steps", -1))
    ratio = float(select(main_config, f"{_OPTIM}.lr_warmup_steps_ratio", 0.0))
    if warmup <= 0:
        if ratio > 0 and total <= 0:
            raise ConfigError(
                f"{_OPTIM}.lr_warmup_steps_ratio={ratio} needs the number of training steps, but neither "
                f"{_OPTIM}.total_training_steps nor trainer.total_training_steps is set. Fix: set "
                f"trainer.total_training_steps or {_OPTIM}.lr_warmup_steps"
            )
        warmup = int(ratio * max(total, 0))
    if style == "cosine" and total <= 0:
        raise ConfigError(
            f"{_OPTIM}.lr_scheduler_type=cosine needs the number of training steps (total_training_steps). "
            "Fix: set trainer.total_training_steps"
        )
    min_lr_ratio = float(select(main_config, f"{_OPTIM}.min_lr_ratio", 0.0))
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ConfigError.for_setting(
            f"{_OPTIM}.min_lr_ratio", min_lr_ratio, "it is a fraction of the peak lr", "set it in [0, 1]"
        )
    return LrSchedule(
        style=str(style),
        warmup_steps=max(0, warmup),
        total_steps=total,
        min_lr_ratio=min_lr_ratio,
        num_cycles=float(select(main_config, f"{_OPTIM}.num_cycles", 0.5)),
    )


def needs_reference(main_config: Any) -> bool:
    """True when the run computes reference log-probs: a KL loss or a KL penalty in the reward."""
    return bool(select(main_config, f"{_ACTOR}.use_kl_loss", False)) or bool(
        select(main_config, "algorithm.use_kl_in_reward", False)
    )
