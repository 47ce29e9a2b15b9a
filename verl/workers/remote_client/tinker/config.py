"""``remote_backend.tinker.*``: the typed config, and the start-up rules of the tinker backend.

Defaults live in ``verl/remote_backend/config/remote_backend/tinker.yaml`` (each key documented
there). Nothing here imports the ``tinker`` SDK, so the rules run on the driver in milliseconds.

What a Tinker-API server computes (skyrl 0.4.0's JAX backend, read from its code and measured):

* loss: ``ppo`` = ``-min(r*A, clip(r, lo, hi)*A)`` or ``importance_sampling`` = ``-r*A`` per
  token, times the per-token ``weights``; per sequence ``sum / sum(weights)``; summed over the
  sequences of a ``forward_backward`` call; the accumulated gradient is divided by the number of
  sequences at ``optim_step`` - i.e. verl's ``seq-mean-token-mean``. The adapter reproduces the
  other aggregation modes exactly by scaling each sequence's advantages (the loss is linear in
  ``A`` and the clip test does not depend on its scale), see :mod:`.batch`;
* optimizer: AdamW (``learning_rate, beta1, beta2, eps, weight_decay`` per ``optim_step``),
  no gradient clipping, no schedule of its own;
* LoRA only, on every attention and MLP projection, ``alpha`` fixed by the server (32);
* log-probs at temperature 1 only; no entropy, no reference-KL term, no entropy bonus.

Every verl setting whose objective the server cannot reproduce is refused by
:func:`check_config` before Ray starts, naming the key, the value, what is supported and why.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["TinkerConfig", "ConfigError", "load_tinker_config", "check_config", "SUPPORTED_LOSS_FNS", "adam_params"]

SUPPORTED_LOSS_FNS = ("ppo", "importance_sampling")
_LOCAL_API_KEY = "tml-verl-remote-backend"
_GRAD_CLIP_OFF = 1e6


class ConfigError(ValueError):
    """A ``remote_backend.tinker`` setting, or a verl setting the Tinker server cannot reproduce."""


@dataclass
class DeviceConfig:
    type: str = "cpu"
    peak_flops: Optional[float] = None
    name: Optional[str] = None


@dataclass
class TinkerConfig:
    """Typed view of ``remote_backend.tinker``; see tinker.yaml for each key's meaning."""

    base_url: str = "http://127.0.0.1:8000"
    api_key: Optional[str] = None
    base_model: Optional[str] = None
    max_lora_rank: int = 32
    server_lora_alpha: float = 32.0
    loss_fn: Optional[str] = None
    seed: Optional[int] = None
    launch_server: bool = False
    launch_command: Optional[list] = None
    startup_timeout_s: float = 900.0
    connect_timeout_s: float = 10.0
    device: DeviceConfig = field(default_factory=DeviceConfig)

    def resolved_api_key(self) -> str:
        return self.api_key or os.environ.get("TINKER_API_KEY") or _LOCAL_API_KEY


def get_path(cfg: Any, path: str, default: Any = None) -> Any:
    """Dotted lookup on an OmegaConf node, a dataclass or a dict (``default`` when absent or None)."""
    node = cfg
    for part in path.split("."):
        if node is None:
            return default
        if isinstance(node, dict) or (hasattr(node, "keys") and not hasattr(node, part)):
            try:
                node = node.get(part, None)
            except Exception:
                node = None
        else:
            node = getattr(node, part, None)
    return default if node is None else node


def _plain(node: Any) -> Any:
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(node):
            return OmegaConf.to_container(node, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return node


def load_tinker_config(main_config: "DictConfig") -> TinkerConfig:
    """``remote_backend.tinker`` as a :class:`TinkerConfig`; unknown keys and bad values raise :class:`ConfigError`."""
    raw = _plain(get_path(main_config, "remote_backend.tinker", {})) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"remote_backend.tinker must be a mapping, got {type(raw).__name__}")
    known = {f.name for f in dataclasses.fields(TinkerConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"remote_backend.tinker has unknown keys {unknown}; known keys: {sorted(known)}")
    raw = dict(raw)
    device = raw.pop("device", None) or {}
    bad_dev = sorted(set(device) - {"type", "peak_flops", "name"})
    if bad_dev:
        raise ConfigError(f"remote_backend.tinker.device has unknown keys {bad_dev}; known: name, peak_flops, type")
    cfg = TinkerConfig(**{k: v for k, v in raw.items() if v is not None or k in ("api_key", "base_model", "loss_fn", "seed", "launch_command")})
    cfg.device = DeviceConfig(**{k: v for k, v in device.items() if v is not None or k != "type"})
    if cfg.loss_fn is not None and cfg.loss_fn not in SUPPORTED_LOSS_FNS:
        raise ConfigError(
            f"remote_backend.tinker.loss_fn={cfg.loss_fn!r} is not supported; supported: null (= ppo), "
            f"{', '.join(SUPPORTED_LOSS_FNS)} (the server's policy losses that train verl's PPO objective)"
        )
    if not str(cfg.base_url).startswith(("http://", "https://")):
        raise ConfigError(f"remote_backend.tinker.base_url={cfg.base_url!r} must be an http:// or https:// URL")
    if int(cfg.max_lora_rank) < 1:
        raise ConfigError(f"remote_backend.tinker.max_lora_rank={cfg.max_lora_rank} must be >= 1")
    if cfg.launch_server and not cfg.launch_command:
        raise ConfigError(
            "remote_backend.tinker.launch_server=true needs remote_backend.tinker.launch_command (the server's argv); "
            "or start the server yourself and set launch_server=false"
        )
    return cfg


def resolved_loss_fn(main_config: "DictConfig", cfg: TinkerConfig) -> str:
    return cfg.loss_fn or "ppo"


def clip_thresholds(actor: Any) -> tuple[float, float]:
    """verl's ratio clip range ``(1 - clip_ratio_low, 1 + clip_ratio_high)`` (each falls back to ``clip_ratio``)."""
    base = float(get_path(actor, "clip_ratio", 0.2))
    low = get_path(actor, "clip_ratio_low", None)
    high = get_path(actor, "clip_ratio_high", None)
    return 1.0 - float(base if low is None else low), 1.0 + float(base if high is None else high)


def lora_settings(main_config: "DictConfig", cfg: TinkerConfig) -> int:
    """The LoRA rank to create, from ``actor_rollout_ref.model.lora_rank``; checks rank and alpha.

    Raises:
        ConfigError: rank unset (0) or outside ``1..max_lora_rank``, or ``lora_alpha`` other than
            the alpha the server applies.
    """
    rank = int(get_path(main_config, "actor_rollout_ref.model.lora.rank", 0) or 0)
    key = "actor_rollout_ref.model.lora.rank"
    if rank <= 0:
        rank = int(get_path(main_config, "actor_rollout_ref.model.lora_rank", 0) or 0)
        key = "actor_rollout_ref.model.lora_rank"
    if not 1 <= rank <= int(cfg.max_lora_rank):
        why = "is unset (0)" if rank <= 0 else f"is outside the server's range 1..{cfg.max_lora_rank}"
        raise ConfigError(
            f"{key}={rank} {why} (supported: 1..{cfg.max_lora_rank}): a Tinker server trains LoRA adapters only (no full fine-tuning). Set "
            f"actor_rollout_ref.model.lora_rank to a value in 1..{cfg.max_lora_rank} "
            "(remote_backend.tinker.max_lora_rank is the server's limit)"
        )
    alpha = float(get_path(main_config, "actor_rollout_ref.model.lora_alpha", 16))
    if not math.isclose(alpha, float(cfg.server_lora_alpha)):
        raise ConfigError(
            f"actor_rollout_ref.model.lora_alpha={alpha:g} is not supported (supported: {float(cfg.server_lora_alpha):g}): the Tinker server applies LoRA alpha "
            f"{float(cfg.server_lora_alpha):g} whatever the client asks (remote_backend.tinker.server_lora_alpha). Set "
            f"actor_rollout_ref.model.lora_alpha={float(cfg.server_lora_alpha):g}"
        )
    return rank


def _refuse(key: str, value: Any, supported: str, why: str) -> str:
    return f"{key}={value!r} (supported: {supported}): {why}"


def objective_problems(main_config: "DictConfig", cfg: TinkerConfig) -> list[str]:
    """verl settings whose objective the server cannot reproduce, one message each (empty: all fine)."""
    a = "actor_rollout_ref.actor"
    actor = get_path(main_config, a, {})
    problems: list[str] = []
    mode = get_path(actor, "policy_loss.loss_mode", "vanilla")
    if mode != "vanilla":
        problems.append(_refuse(f"{a}.policy_loss.loss_mode", mode, "vanilla",
                                "the server's losses are PPO's clipped ratio and plain importance sampling"))
    agg = get_path(actor, "loss_agg_mode", "token-mean")
    if agg not in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        problems.append(_refuse(f"{a}.loss_agg_mode", agg, "token-mean, seq-mean-token-sum, seq-mean-token-mean, "
                                "seq-mean-token-sum-norm", "unknown aggregation"))
    if bool(get_path(actor, "use_kl_loss", False)):
        problems.append(_refuse(f"{a}.use_kl_loss", True, "false (use algorithm.use_kl_in_reward=true instead)",
                                "the server's loss has no reference-KL term"))
    ent = float(get_path(actor, "entropy_coeff", 0.0) or 0.0)
    if ent != 0.0:
        problems.append(_refuse(f"{a}.entropy_coeff", ent, "0", "the server's loss has no entropy bonus"))
    clip = get_path(actor, "grad_clip", None)
    if clip is not None and 0 < float(clip) < _GRAD_CLIP_OFF:
        problems.append(_refuse(f"{a}.grad_clip", float(clip), f"a value <= 0 or >= {_GRAD_CLIP_OFF:g} (= off)",
                                "the server's AdamW does not clip gradients"))
    optim = get_path(actor, "optim", {})
    name = str(get_path(optim, "optimizer", "AdamW"))
    if name.lower() != "adamw":
        problems.append(_refuse(f"{a}.optim.optimizer", name, "AdamW", "the server's optimizer is AdamW"))
    sched = get_path(optim, "lr_scheduler_type", None) or get_path(optim, "warmup_style", None) or "constant"
    if sched != "constant":
        problems.append(_refuse(f"{a}.optim.lr_scheduler_type", sched, "constant",
                                "the adapter sends verl's constant learning rate with every optim_step"))
    warm = int(get_path(optim, "lr_warmup_steps", -1) or -1)
    ratio = float(get_path(optim, "lr_warmup_steps_ratio", 0.0) or 0.0)
    if warm > 0 or (warm <= 0 and ratio > 0):
        problems.append(_refuse(f"{a}.optim.lr_warmup_steps / lr_warmup_steps_ratio", f"{warm} / {ratio}", "-1 / 0.0",
                                "no learning-rate warm-up is implemented for this backend"))
    for key in ("actor_rollout_ref.rollout.temperature",):
        temp = float(get_path(main_config, key, 1.0))
        if temp != 1.0:
            problems.append(_refuse(key, temp, "1.0", "the server's forward returns log-probs at temperature 1 only, "
                                    "so verl's old/reference log-probs could not match the sampling distribution"))
    targets = get_path(main_config, "actor_rollout_ref.model.target_modules", "all-linear")
    if targets != "all-linear":
        problems.append(_refuse("actor_rollout_ref.model.target_modules", _plain(targets), "all-linear",
                                "the server puts LoRA on every attention and MLP projection"))
    if cfg.loss_fn == "importance_sampling":
        train = int(get_path(main_config, "data.train_batch_size", 0) or 0)
        mini = int(get_path(actor, "ppo_mini_batch_size", train) or train)
        epochs = int(get_path(actor, "ppo_epochs", 1) or 1)
        if mini != train or epochs != 1:
            problems.append(_refuse("remote_backend.tinker.loss_fn", "importance_sampling",
                                    "ppo; or importance_sampling with ppo_mini_batch_size == data.train_batch_size and ppo_epochs=1",
                                    f"with {train // max(mini, 1)} mini-batch(es) x {epochs} epoch(s) later mini-batches are "
                                    "off-policy, where verl clips the ratio and importance_sampling does not"))
    return problems


def check_config(main_config: "DictConfig") -> None:
    """All start-up rules: the block's own keys, LoRA rank/alpha, and the objective.

    Raises:
        ConfigError: naming each offending key, its value, what is supported and why.
    """
    cfg = load_tinker_config(main_config)
    lora_settings(main_config, cfg)
    problems = objective_problems(main_config, cfg)
    if problems:
        raise ConfigError(
            "trainer.remote_backend=tinker: the Tinker server cannot reproduce verl's setting(s): " + "; ".join(problems)
        )


def adam_params(actor: Any) -> dict[str, float]:
    """AdamW hyper-parameters of every ``optim_step``, from verl's ``actor.optim`` (torch's eps)."""
    optim = get_path(actor, "optim", {})
    betas = list(_plain(get_path(optim, "betas", [0.9, 0.999])))
    return {
        "learning_rate": float(get_path(optim, "lr", 1e-6)),
        "beta1": float(betas[0]),
        "beta2": float(betas[1]),
        "eps": float(get_path(optim, "eps", 1e-8)),
        "weight_decay": float(get_path(optim, "weight_decay", 0.01)),
    }
