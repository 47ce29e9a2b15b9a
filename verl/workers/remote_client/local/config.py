"""Typed settings of the ``local`` backend.

Two layers:

* :class:`LocalBackendConfig` - the ``remote_backend.local.*`` keys (defaults in
  ``verl/remote_backend/config/remote_backend/local.yaml``; keep both equal).
* :class:`EngineSettings` - everything the engine needs, resolved once on the
  driver from verl's main config (model path, optimizer block, whether a
  reference model is needed, inference micro-batching). It is a plain,
  picklable dataclass so the engine never sees verl's config object and other
  drivers (the Arctic stand-in server) can build one by hand.

Validation happens here, before any Ray actor starts, and every error names
the config key and the fix.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping, Optional

__all__ = ["LocalBackendConfig", "EngineSettings", "ConfigError", "DTYPES"]

DTYPES = ("float32", "bfloat16", "float16")
_DEVICES = ("cpu", "cuda")
_ATTN = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")
_PREFIX = "remote_backend.local"


class ConfigError(ValueError):
    """A ``remote_backend.local.*`` or verl config value the local backend cannot use."""


@dataclass(frozen=True)
class LocalBackendConfig:
    """``remote_backend.local.*``: how the engine runs (see local.yaml for the meaning of each key)."""

    device: str = "cpu"
    dtype: str = "float32"
    autocast_dtype: Optional[str] = None
    sampler_dtype: Optional[str] = None
    attn_implementation: str = "sdpa"
    num_cpus: float = 1
    max_batch_size: int = 64
    batch_wait_ms: float = 5
    max_model_len: Optional[int] = None
    seed: int = 0

    def __post_init__(self) -> None:
        def bad(key: str, value: Any, fix: str) -> ConfigError:
            return ConfigError(f"{_PREFIX}.{key}={value!r} is invalid: {fix}")

        if self.device not in _DEVICES:
            raise bad("device", self.device, f"use one of {list(_DEVICES)}")
        for key in ("dtype", "autocast_dtype", "sampler_dtype"):
            value = getattr(self, key)
            if (value is not None or key == "dtype") and value not in DTYPES:
                raise bad(key, value, f"use one of {list(DTYPES)}" + ("" if key == "dtype" else " or null"))
        if self.attn_implementation not in _ATTN:
            raise bad("attn_implementation", self.attn_implementation, f"use one of {list(_ATTN)}")
        if self.attn_implementation.startswith("flash") and self.device != "cuda":
            raise bad("attn_implementation", self.attn_implementation, "flash attention needs device=cuda; use sdpa")
        if not self.num_cpus > 0:
            raise bad("num_cpus", self.num_cpus, "must be > 0")
        if int(self.max_batch_size) < 1:
            raise bad("max_batch_size", self.max_batch_size, "must be >= 1")
        if self.batch_wait_ms < 0:
            raise bad("batch_wait_ms", self.batch_wait_ms, "must be >= 0")
        if self.max_model_len is not None and int(self.max_model_len) < 2:
            raise bad("max_model_len", self.max_model_len, "must be >= 2 or null (use the model's context)")

    @classmethod
    def from_mapping(cls, raw: Optional[Mapping[str, Any]]) -> "LocalBackendConfig":
        """Build from the ``remote_backend.local`` block (``None``/missing keys take defaults).

        Raises:
            ConfigError: an unknown key (typo) or an invalid value.
        """
        raw = dict(raw or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"Unknown key(s) {[f'{_PREFIX}.{k}' for k in unknown]}; known keys: {sorted(known)}")
        return cls(**raw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EngineSettings:
    """What :class:`~verl.workers.remote_client.local.engine.LocalEngine` needs to start.

    Attributes:
        model_path: local Hugging Face model directory (``actor_rollout_ref.model.path``).
        tokenizer_path: tokenizer directory; ``None`` = ``model_path``.
        trust_remote_code: passed to transformers.
        backend: the ``remote_backend.local`` block.
        optim: ``actor_rollout_ref.actor.optim`` as a plain dict (verl's
            ``FSDPOptimizerConfig`` fields: lr, betas, weight_decay, warmup, scheduler, clip_grad).
        grad_clip: max gradient norm applied before every optimizer step.
        total_training_steps: optimizer-scheduler horizon (verl's total training steps), -1 if unknown.
        need_ref: build a frozen reference model (KL loss or KL in reward).
        log_prob_micro_batch_size: rows per forward micro-batch in ``log_probs``; ``None`` = whole batch.
        log_prob_use_dynamic_bsz: split forward micro-batches by token budget instead.
        log_prob_max_token_len: token budget per micro-batch when ``log_prob_use_dynamic_bsz``.
    """

    model_path: str
    tokenizer_path: Optional[str] = None
    trust_remote_code: bool = False
    backend: LocalBackendConfig = field(default_factory=LocalBackendConfig)
    optim: dict[str, Any] = field(default_factory=lambda: {"lr": 1e-6})
    grad_clip: float = 1.0
    total_training_steps: int = -1
    need_ref: bool = False
    log_prob_micro_batch_size: Optional[int] = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len: int = 16384

    @classmethod
    def from_main_config(cls, main_config: Any) -> "EngineSettings":
        """Resolve the engine settings from verl's composed config (DictConfig or nested dict).

        Reads ``remote_backend.local``, ``actor_rollout_ref.{model,actor,rollout}``,
        ``algorithm.use_kl_in_reward`` and ``trainer.total_training_steps``.

        Raises:
            ConfigError: invalid backend keys, a missing/invalid model path, or
                inconsistent gradient-clipping keys.
        """
        model = _block(main_config, "actor_rollout_ref.model")
        actor = _block(main_config, "actor_rollout_ref.actor")
        rollout = _block(main_config, "actor_rollout_ref.rollout")
        backend = LocalBackendConfig.from_mapping(_block(main_config, "remote_backend.local"))

        model_path = check_model_path(model.get("path"))
        tokenizer_path = model.get("tokenizer_path")
        if tokenizer_path:
            tokenizer_path = check_model_path(tokenizer_path, key="actor_rollout_ref.model.tokenizer_path")

        optim = dict(actor.get("optim") or {})
        optim.pop("_target_", None)
        if "lr" not in optim:
            raise ConfigError("actor_rollout_ref.actor.optim.lr is missing; set the actor learning rate")
        total_steps = optim.get("total_training_steps", -1)
        if total_steps is None or int(total_steps) <= 0:
            total_steps = _block(main_config, "trainer").get("total_training_steps") or -1

        use_kl_in_reward = bool(_block(main_config, "algorithm").get("use_kl_in_reward", False))
        return cls(
            model_path=model_path,
            tokenizer_path=tokenizer_path,
            trust_remote_code=bool(model.get("trust_remote_code", False)),
            backend=backend,
            optim=optim,
            grad_clip=resolve_grad_clip(actor),
            total_training_steps=int(total_steps),
            need_ref=bool(actor.get("use_kl_loss", False)) or use_kl_in_reward,
            log_prob_micro_batch_size=rollout.get("log_prob_micro_batch_size_per_gpu"),
            log_prob_use_dynamic_bsz=bool(rollout.get("log_prob_use_dynamic_bsz", False)),
            log_prob_max_token_len=int(rollout.get("log_prob_max_token_len_per_gpu") or 16384),
        )


def check_model_path(path: Any, key: str = "actor_rollout_ref.model.path") -> str:
    """Return ``path`` (``~`` expanded) if it is a Hugging Face model directory; else raise ``ConfigError``."""
    if path is None or not str(path).strip():
        raise ConfigError(f"{key} is not set; point it at a local Hugging Face model directory")
    resolved = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isdir(resolved):
        raise ConfigError(
            f"{key}={path!r} is not a directory; the local backend loads a Hugging Face model directory "
            f"(download the model first, e.g. `huggingface-cli download <repo> --local-dir <dir>`)"
        )
    if key.endswith("model.path") and not os.path.isfile(os.path.join(resolved, "config.json")):
        raise ConfigError(f"{key}={path!r} has no config.json; it must be a Hugging Face model directory")
    return resolved


def resolve_grad_clip(actor: Mapping[str, Any]) -> float:
    """Max grad norm from ``actor.grad_clip`` (legacy key) and ``actor.optim.clip_grad`` (new engine key).

    verl defaults both to 1.0 and each of its workers reads only one of them, so
    a user sets whichever they know: when exactly one differs from 1.0 it wins;
    two different non-default values are ambiguous and rejected.
    """
    legacy = actor.get("grad_clip")
    optim = (actor.get("optim") or {}).get("clip_grad")
    values = {float(v) for v in (legacy, optim) if v is not None}
    if not values:
        return 1.0
    if len(values) == 1:
        return values.pop()
    custom = values - {1.0}
    if len(custom) == 1:
        return custom.pop()
    raise ConfigError(
        f"actor_rollout_ref.actor.grad_clip={legacy} and actor_rollout_ref.actor.optim.clip_grad={optim} disagree; "
        "set both to the same max gradient norm"
    )


def _block(cfg: Any, dotted: str) -> dict[str, Any]:
    """``cfg.<dotted>`` as a plain dict (``{}`` when absent), resolving only that block.

    Resolving the whole main config would fail on unrelated interpolations.
    """
    from omegaconf import DictConfig, OmegaConf

    node: Any = cfg
    for part in dotted.split("."):
        if node is None:
            return {}
        if isinstance(node, DictConfig):
            node = node.get(part)
        elif isinstance(node, Mapping):
            node = node.get(part)
        else:
            raise ConfigError(f"Expected verl's main config (DictConfig or dict) at {dotted!r}, got {type(node).__name__}")
    if node is None:
        return {}
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    if isinstance(node, Mapping):
        return dict(node)
    raise ConfigError(f"{dotted} must be a mapping, got {type(node).__name__}")
