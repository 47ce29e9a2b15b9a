"""Typed settings of the ``local`` backend.

:class:`LocalBackendConfig` is the ``remote_backend.local.*`` block (defaults in
``config/backend/local.yaml``; keep both equal). :class:`EngineSettings` is
everything the engine needs, resolved once on the driver from verl's main config: a
plain, picklable dataclass, so the engine never sees verl's config object.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.settings.loader import block, load_settings, select, setting
from verl.remote_backend.settings.verl_config import (
    LrSchedule,
    local_model_dir,
    lr_schedule,
    max_grad_norm,
    model_path,
    needs_reference,
)

from .malloc import KEEP_FREE_BYTES

__all__ = ["LocalBackendConfig", "EngineSettings", "DTYPES", "CONFIG_KEY"]

DTYPES = ("float32", "bfloat16", "float16")
#: Where the block sits in verl's main config.
CONFIG_KEY = "remote_backend.local"


@dataclass(frozen=True)
class LocalBackendConfig:
    """``remote_backend.local.*``: how the engine runs (see local.yaml for the meaning of each key)."""

    device: str = setting("cpu", choices=("cpu", "cuda"))
    dtype: str = setting("float32", choices=DTYPES)
    autocast_dtype: Optional[str] = setting(None, choices=DTYPES, fix="use one of these, or null")
    sampler_dtype: Optional[str] = setting(None, choices=DTYPES, fix="use one of these, or null")
    share_sampler_weights: bool = True
    attn_implementation: str = setting("sdpa", choices=("sdpa", "eager", "flash_attention_2", "flash_attention_3"))
    num_cpus: float = setting(1.0, gt=0)
    threads: Optional[int] = setting(None, ge=1, fix="set it >= 1, or null for every core the engine may run on")
    max_batch_size: int = setting(64, ge=1)
    batch_wait_ms: float = setting(5.0, ge=0)
    max_model_len: Optional[int] = setting(None, ge=2, fix="set it >= 2, or null to use the model's context")
    seed: int = 0
    heap_keep_free_gib: float = setting(KEEP_FREE_BYTES / (1 << 30), ge=0)

    @property
    def heap_keep_free_bytes(self) -> int:
        """``heap_keep_free_gib`` in bytes: what the engine's C heap may keep free between calls."""
        return int(self.heap_keep_free_gib * (1 << 30))

    def __post_init__(self) -> None:
        if self.attn_implementation.startswith("flash") and self.device != "cuda":
            raise ConfigError.for_setting(
                f"{CONFIG_KEY}.attn_implementation",
                self.attn_implementation,
                "flash attention needs device=cuda",
                "use sdpa",
            )

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
            ``FSDPOptimizerConfig`` fields: optimizer, lr, betas, weight_decay).
        grad_clip: max gradient norm applied before every optimizer step.
        lr_schedule: verl's LR schedule (warm-up, constant or cosine, horizon).
        need_ref: build a frozen reference model (KL loss or KL in reward).
        log_prob_micro_batch_size: rows per forward micro-batch in ``log_probs``; ``None`` = whole batch.
        log_prob_use_dynamic_bsz: split forward micro-batches by token budget instead.
        log_prob_max_token_len: token budget per micro-batch when ``log_prob_use_dynamic_bsz``.
        share_prefixes: run a prefix common to consecutive rows once per forward micro-batch
            (verl's ``actor_rollout_ref.actor.use_prefix_grouper``; the update reads it from
            the actor config it is called with).
    """

    model_path: str
    tokenizer_path: Optional[str] = None
    trust_remote_code: bool = False
    backend: LocalBackendConfig = field(default_factory=LocalBackendConfig)
    optim: dict[str, Any] = field(default_factory=lambda: {"lr": 1e-6})
    grad_clip: float = 1.0
    lr_schedule: LrSchedule = field(default_factory=LrSchedule)
    need_ref: bool = False
    log_prob_micro_batch_size: Optional[int] = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len: int = 16384
    share_prefixes: bool = False

    @classmethod
    def from_main_config(cls, main_config: Any) -> "EngineSettings":
        """Resolve the engine settings from verl's composed config (DictConfig or nested dict).

        Reads ``remote_backend.local``, ``actor_rollout_ref.{model,actor,rollout}``,
        ``algorithm.use_kl_in_reward`` and ``trainer.total_training_steps``.

        Raises:
            ConfigError: invalid backend keys, a model path that is not a local model
                directory, or verl settings the shared rules refuse (grad clip, LR schedule).
        """
        rollout = block(main_config, "actor_rollout_ref.rollout")
        backend = load_settings(LocalBackendConfig, main_config, CONFIG_KEY)
        model_path = _local_dir(main_config, "actor_rollout_ref.model.path")
        tokenizer_path = None
        if select(main_config, "actor_rollout_ref.model.tokenizer_path"):
            tokenizer_path = _local_dir(main_config, "actor_rollout_ref.model.tokenizer_path")
        optim = block(main_config, "actor_rollout_ref.actor.optim")
        optim.pop("_target_", None)
        if "lr" not in optim:
            raise ConfigError("actor_rollout_ref.actor.optim.lr is missing; set the actor learning rate")
        return cls(
            model_path=model_path,
            tokenizer_path=tokenizer_path,
            trust_remote_code=bool(select(main_config, "actor_rollout_ref.model.trust_remote_code", False)),
            backend=backend,
            optim=optim,
            grad_clip=max_grad_norm(main_config),
            lr_schedule=lr_schedule(main_config),
            need_ref=needs_reference(main_config),
            log_prob_micro_batch_size=rollout.get("log_prob_micro_batch_size_per_gpu"),
            log_prob_use_dynamic_bsz=bool(rollout.get("log_prob_use_dynamic_bsz", False)),
            log_prob_max_token_len=int(rollout.get("log_prob_max_token_len_per_gpu") or 16384),
            share_prefixes=bool(select(main_config, "actor_rollout_ref.actor.use_prefix_grouper", False)),
        )


def _local_dir(main_config: Any, key: str) -> str:
    """The local directory ``key`` names: this backend loads from disk and fetches nothing."""
    local = local_model_dir(main_config, key, need_config_json=key.endswith("model.path"))
    if local is None:
        raise ConfigError.for_setting(
            key,
            model_path(main_config, key),
            "the local backend loads a local Hugging Face model directory, not a hub id or a remote URI",
            f"download the model first (e.g. `huggingface-cli download <repo> --local-dir <dir>`) and set {key}=<dir>",
        )
    return local
