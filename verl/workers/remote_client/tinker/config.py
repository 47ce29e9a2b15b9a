"""``remote_backend.tinker.*``: the typed config, and the start-up rules of the tinker backend.

Defaults live in ``verl/remote_backend/config/backend/tinker.yaml`` (each key documented
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

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.settings.loader import load_settings, select, setting
from verl.remote_backend.settings.verl_config import lr_schedule, max_grad_norm

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = [
    "TinkerConfig",
    "CONFIG_KEY",
    "SECRET_SETTINGS",
    "load_tinker_config",
    "check_config",
    "SUPPORTED_LOSS_FNS",
    "adam_params",
]

SUPPORTED_LOSS_FNS = ("ppo", "importance_sampling")
#: Where the block sits in verl's main config.
CONFIG_KEY = "remote_backend.tinker"
_LOCAL_API_KEY = "tml-verl-remote-backend"
#: Where the API key is read when ``api_key`` is null (the entry point moves a value set there).
API_KEY_ENV = "TINKER_API_KEY"
#: The credential settings (``RemoteBackend.secret_settings``): kept out of everything verl prints or writes.
SECRET_SETTINGS = {f"{CONFIG_KEY}.api_key": API_KEY_ENV}
#: a max gradient norm at or above this never clips: what "no clipping" means for this server
_GRAD_CLIP_OFF = 1e6


@dataclass(frozen=True)
class DeviceConfig:
    """What the server computes on, for MFU."""

    type: str = "cpu"
    peak_flops: Optional[float] = setting(None, gt=0, fix="set it > 0 (FLOP/s of one device), or null")
    name: Optional[str] = None


@dataclass(frozen=True)
class TinkerConfig:
    """``remote_backend.tinker.*`` (see tinker.yaml for each key's meaning)."""

    base_url: str = "http://127.0.0.1:8000"
    api_key: Optional[str] = field(default=None, repr=False)  # a credential: never in a repr or an error
    base_model: Optional[str] = None
    max_lora_rank: int = setting(32, ge=1)
    server_lora_alpha: float = setting(32.0, gt=0)
    loss_fn: Optional[str] = setting(
        None, choices=SUPPORTED_LOSS_FNS, fix="use null (= ppo), ppo or importance_sampling"
    )
    seed: Optional[int] = None
    launch_server: bool = False
    launch_command: Optional[list] = None
    startup_timeout_s: float = setting(900.0, gt=0)
    connect_timeout_s: float = setting(10.0, gt=0)
    device: DeviceConfig = field(default_factory=DeviceConfig)

    def __post_init__(self) -> None:
        if not str(self.base_url).startswith(("http://", "https://")):
            raise ConfigError.for_setting(
                f"{CONFIG_KEY}.base_url", self.base_url, "not an HTTP URL", "use http://host:port"
            )
        if self.launch_server and not self.launch_command:
            raise ConfigError.for_setting(
                f"{CONFIG_KEY}.launch_command", self.launch_command, "launch_server=true needs the server's argv",
                "set launch_command, or start the server yourself and set launch_server=false",
            )  # fmt: skip

    def resolved_api_key(self) -> str:
        return self.api_key or os.environ.get(API_KEY_ENV) or _LOCAL_API_KEY


def load_tinker_config(main_config: "DictConfig") -> TinkerConfig:
    """``remote_backend.tinker`` as a :class:`TinkerConfig` (unknown keys and bad values: :class:`ConfigError`)."""
    return load_settings(TinkerConfig, main_config, CONFIG_KEY)


def resolved_loss_fn(main_config: "DictConfig", cfg: TinkerConfig) -> str:
    return cfg.loss_fn or "ppo"


def clip_thresholds(actor: Any) -> tuple[float, float]:
    """verl's ratio clip range ``(1 - clip_ratio_low, 1 + clip_ratio_high)`` (each falls back to ``clip_ratio``)."""
    base = float(select(actor, "clip_ratio", 0.2))
    low = select(actor, "clip_ratio_low", None)
    high = select(actor, "clip_ratio_high", None)
    return 1.0 - float(base if low is None else low), 1.0 + float(base if high is None else high)


def lora_settings(main_config: "DictConfig", cfg: TinkerConfig) -> int:
    """The LoRA rank to create, from ``actor_rollout_ref.model.lora_rank``; checks rank and alpha.

    Raises:
        ConfigError: rank unset (0) or outside ``1..max_lora_rank``, or ``lora_alpha`` other than
            the alpha the server applies.
    """
    rank = int(select(main_config, "actor_rollout_ref.model.lora.rank", 0) or 0)
    key = "actor_rollout_ref.model.lora.rank"
    if rank <= 0:
        rank = int(select(main_config, "actor_rollout_ref.model.lora_rank", 0) or 0)
        key = "actor_rollout_ref.model.lora_rank"
    if not 1 <= rank <= int(cfg.max_lora_rank):
        why = "is unset (0)" if rank <= 0 else f"is outside the server's range 1..{cfg.max_lora_rank}"
        raise ConfigError(
            f"{key}={rank} {why} (supported: 1..{cfg.max_lora_rank}): "
            "a Tinker server trains LoRA adapters only (no full fine-tuning). Set "
            f"actor_rollout_ref.model.lora_rank to a value in 1..{cfg.max_lora_rank} "
            "(remote_backend.tinker.max_lora_rank is the server's limit)"
        )
    alpha = float(select(main_config, "actor_rollout_ref.model.lora_alpha", 16))
    if not math.isclose(alpha, float(cfg.server_lora_alpha)):
        raise ConfigError(
            f"actor_rollout_ref.model.lora_alpha={alpha:g} is not supported "
            f"(supported: {float(cfg.server_lora_alpha):g}): the Tinker server applies LoRA alpha "
            f"{float(cfg.server_lora_alpha):g} whatever the client asks (remote_backend.tinker.server_lora_alpha). Set "
            f"actor_rollout_ref.model.lora_alpha={float(cfg.server_lora_alpha):g}"
        )
    return rank


def _refuse(key: str, value: Any, supported: str, why: str) -> str:
    return f"{key}={value!r} (supported: {supported}): {why}"


def objective_problems(main_config: "DictConfig", cfg: TinkerConfig) -> list[str]:
    """verl settings whose objective the server cannot reproduce, one message each (empty: all fine)."""
    a = "actor_rollout_ref.actor"
    actor = select(main_config, a, {})
    problems: list[str] = []
    mode = select(actor, "policy_loss.loss_mode", "vanilla")
    if mode != "vanilla":
        problems.append(
            _refuse(
                f"{a}.policy_loss.loss_mode",
                mode,
                "vanilla",
                "the server's losses are PPO's clipped ratio and plain importance sampling",
            )
        )
    agg = select(actor, "loss_agg_mode", "token-mean")
    if agg not in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        problems.append(
            _refuse(
                f"{a}.loss_agg_mode",
                agg,
                "token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm",
                "unknown aggregation",
            )
        )
    if bool(select(actor, "use_kl_loss", False)):
        problems.append(
            _refuse(
                f"{a}.use_kl_loss",
                True,
                "false (use algorithm.use_kl_in_reward=true instead)",
                "the server's loss has no reference-KL term",
            )
        )
    ent = float(select(actor, "entropy_coeff", 0.0) or 0.0)
    if ent != 0.0:
        problems.append(_refuse(f"{a}.entropy_coeff", ent, "0", "the server's loss has no entropy bonus"))
    clip = max_grad_norm(main_config)  # the shared rule: actor.grad_clip / optim.clip_grad, whichever is set
    if clip < _GRAD_CLIP_OFF:
        problems.append(
            _refuse(
                f"{a}.grad_clip",
                clip,
                f">= {_GRAD_CLIP_OFF:g} (= no clipping), e.g. 1e9",
                "the server's AdamW does not clip gradients",
            )
        )
    optim = select(actor, "optim", {})
    name = str(select(optim, "optimizer", "AdamW"))
    if name.lower() != "adamw":
        problems.append(_refuse(f"{a}.optim.optimizer", name, "AdamW", "the server's optimizer is AdamW"))
    schedule = lr_schedule(main_config)  # the shared rule: style, warm-up, horizon
    if schedule.style != "constant" or schedule.warmup_steps > 0:
        problems.append(
            _refuse(
                f"{a}.optim.lr_scheduler_type / lr_warmup_steps(_ratio)",
                f"{schedule.style} / {schedule.warmup_steps} warm-up steps",
                "constant / no warm-up",
                "the adapter sends one constant learning rate with every optim_step",
            )
        )
    for key in ("actor_rollout_ref.rollout.temperature",):
        temp = float(select(main_config, key, 1.0))
        if temp != 1.0:
            problems.append(
                _refuse(
                    key,
                    temp,
                    "1.0",
                    "the server's forward returns log-probs at temperature 1 only, "
                    "so verl's old/reference log-probs could not match the sampling distribution",
                )
            )
    targets = select(main_config, "actor_rollout_ref.model.target_modules", "all-linear")
    if targets != "all-linear":
        problems.append(
            _refuse(
                "actor_rollout_ref.model.target_modules",
                str(targets),
                "all-linear",
                "the server puts LoRA on every attention and MLP projection",
            )
        )
    if cfg.loss_fn == "importance_sampling":
        train = int(select(main_config, "data.train_batch_size", 0) or 0)
        mini = int(select(actor, "ppo_mini_batch_size", train) or train)
        epochs = int(select(actor, "ppo_epochs", 1) or 1)
        if mini != train or epochs != 1:
            problems.append(
                _refuse(
                    "remote_backend.tinker.loss_fn",
                    "importance_sampling",
                    "ppo; or importance_sampling with ppo_mini_batch_size == data.train_batch_size and ppo_epochs=1",
                    f"with {train // max(mini, 1)} mini-batch(es) x {epochs} epoch(s) later mini-batches are "
                    "off-policy, where verl clips the ratio and importance_sampling does not",
                )
            )
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
            "trainer.remote_backend=tinker: the Tinker server cannot reproduce verl's setting(s): "
            + "; ".join(problems)
        )


def adam_params(actor: Any) -> dict[str, float]:
    """AdamW hyper-parameters of every ``optim_step``, from verl's ``actor.optim`` (torch's eps)."""
    optim = select(actor, "optim", {})
    betas = list(select(optim, "betas", [0.9, 0.999]))
    return {
        "learning_rate": float(select(optim, "lr", 1e-6)),
        "beta1": float(betas[0]),
        "beta2": float(betas[1]),
        "eps": float(select(optim, "eps", 1e-8)),
        "weight_decay": float(select(optim, "weight_decay", 0.01)),
    }
