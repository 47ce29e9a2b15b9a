"""``remote_backend.arctic.*``: the typed config (dataclasses) and its loading/validation.

Defaults live in ``verl/remote_backend/config/remote_backend/arctic.yaml`` (every
key documented there). A ``null`` there means "derive it from verl's config";
the derivations are in :mod:`.derive`. Nothing here imports ``arctic_platform``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["ArcticConfig", "ConfigError", "load_arctic_config"]

class ConfigError(ValueError):
    """A ``remote_backend.arctic`` setting (or the verl setting it derives from) is invalid."""


@dataclass
class ZorroConfig:
    train: bool = False
    max_rollouts: Optional[int] = None
    load_balancer: bool = True
    fca: bool = False
    speculative_model: str = ""


@dataclass
class LogitsConfig:
    optimization: str = "none"
    peak_mem_gib: float = 4.0
    compute_in_fp32: bool = False
    compute_from_fp32_inputs: bool = False


@dataclass
class WeightSyncConfig:
    cuda_ipc: bool = False
    low_memory: bool = False
    sleep_sampler_during_training: bool = True


@dataclass
class GenerateConfig:
    add_special_tokens: bool = True
    max_concurrency: Optional[int] = None


@dataclass
class SamplingConfig:
    tensor_parallel_size: int = 1
    gpu_memory_utilization: Optional[float] = None
    max_num_seqs: Optional[int] = None
    enforce_eager: Optional[bool] = None
    enable_chunked_prefill: Optional[bool] = None
    vllm: dict = field(default_factory=dict)


@dataclass
class DeviceConfig:
    type: str = "cuda"
    peak_flops: Optional[float] = None
    name: Optional[str] = None


@dataclass
class ArcticConfig:
    """Typed view of ``remote_backend.arctic``; see arctic.yaml for each key's meaning."""

    protocol: str = "http"
    host: str = "127.0.0.1"
    port: int = 8000
    launch_server: bool = False
    launch_command: Optional[list] = None
    startup_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 1800.0
    job_ready_timeout_s: float = 1800.0
    training_gpus: int = 1
    sampling_gpus: int = 1
    log_prob_gpus: Optional[int] = None
    colocate: bool = True
    seed: Optional[int] = None
    full_determinism: bool = False
    checkpoint_dir: Optional[str] = None
    export_hf: bool = False
    loss_fn: str = "verl_grpo"
    strict_loss_check: bool = True
    micro_batch_size: Optional[int] = None
    drop_position_ids: bool = True
    deepspeed: dict = field(default_factory=dict)
    ds_worker: dict = field(default_factory=dict)
    zorro: ZorroConfig = field(default_factory=ZorroConfig)
    logits: LogitsConfig = field(default_factory=LogitsConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)

    def validate(self) -> None:
        """Reject impossible settings early, naming the key and the fix."""
        p = "remote_backend.arctic"
        if self.protocol == "ray":
            raise ConfigError(
                f"{p}.protocol='ray' is not supported: this adapter is tested end to end only over HTTP against "
                "Arctic's own server code, and Arctic's Ray transport starts a server in-process that cannot be "
                f"checked here. Fix: set {p}.protocol=http (and {p}.launch_server=true to have the backend start "
                "`python -m arctic_platform.common.http_server` itself)"
            )
        if self.protocol != "http":
            raise ConfigError(f"{p}.protocol must be 'http', got {self.protocol!r}")
        if self.training_gpus < 1:
            raise ConfigError(f"{p}.training_gpus must be >= 1, got {self.training_gpus}")
        if self.sampling_gpus < 1:
            raise ConfigError(f"{p}.sampling_gpus must be >= 1 (verl's rollout samples through Arctic), got {self.sampling_gpus}")
        if self.log_prob_gpus is not None and self.log_prob_gpus < 0:
            raise ConfigError(f"{p}.log_prob_gpus must be >= 0 or null, got {self.log_prob_gpus}")
        if self.weight_sync.cuda_ipc and not self.colocate:
            raise ConfigError(f"{p}.weight_sync.cuda_ipc=true requires {p}.colocate=true (CUDA IPC shares one GPU)")
        if self.logits.optimization not in ("none", "compute", "memory"):
            raise ConfigError(f"{p}.logits.optimization must be none|compute|memory, got {self.logits.optimization!r}")
        if self.logits.optimization == "memory" and not self.zorro.train:
            raise ConfigError(f"{p}.logits.optimization=memory requires {p}.zorro.train=true")
        for name in ("connect_timeout_s", "request_timeout_s", "startup_timeout_s", "job_ready_timeout_s"):
            if float(getattr(self, name)) <= 0:
                raise ConfigError(f"{p}.{name} must be > 0, got {getattr(self, name)}")
        if self.generate.max_concurrency is not None and self.generate.max_concurrency < 1:
            raise ConfigError(f"{p}.generate.max_concurrency must be >= 1, got {self.generate.max_concurrency}")


def _from_dict(cls: type, raw: dict, prefix: str) -> Any:
    """Build dataclass ``cls`` from ``raw``, refusing unknown keys (typos fail loudly)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"Unknown key(s) {[f'{prefix}.{k}' for k in unknown]}; known: {sorted(fields)}")
    kwargs = {}
    for name, value in raw.items():
        ftype = fields[name].type
        nested = {
            "ZorroConfig": ZorroConfig,
            "LogitsConfig": LogitsConfig,
            "WeightSyncConfig": WeightSyncConfig,
            "GenerateConfig": GenerateConfig,
            "SamplingConfig": SamplingConfig,
            "DeviceConfig": DeviceConfig,
        }.get(ftype if isinstance(ftype, str) else getattr(ftype, "__name__", ""))
        if nested is not None and isinstance(value, dict):
            value = _from_dict(nested, value, f"{prefix}.{name}")
        kwargs[name] = value
    return cls(**kwargs)


def _select(cfg: Any, path: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    value = OmegaConf.select(cfg, path, default=default)
    return default if value is None else value


def load_arctic_config(main_config: "DictConfig") -> ArcticConfig:
    """Read ``main_config.remote_backend.arctic`` (absent -> all defaults), typed and validated."""
    from omegaconf import OmegaConf

    block = OmegaConf.select(main_config, "remote_backend.arctic", default=None)
    raw = {} if block is None else OmegaConf.to_container(block, resolve=True)
    cfg = _from_dict(ArcticConfig, raw or {}, "remote_backend.arctic")
    cfg.validate()
    return cfg
