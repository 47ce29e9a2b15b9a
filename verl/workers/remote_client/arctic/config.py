"""``remote_backend.arctic.*``: the typed settings of the Arctic backend, with their constraints.

Defaults live in ``verl/remote_backend/config/backend/arctic.yaml`` (every
key documented there). A ``null`` there means "derive it from verl's config"
(:mod:`.derive`). Loaded by :func:`verl.remote_backend.settings.loader.load_settings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.settings.loader import load_settings, setting

__all__ = ["ArcticConfig", "load_arctic_config", "CONFIG_KEY", "PROTOCOLS"]

#: Where the block sits in verl's main config.
CONFIG_KEY = "remote_backend.arctic"
#: Transports of arctic-platform's on-prem client that the adapter runs.
PROTOCOLS = ("http", "ray")


@dataclass
class ZorroConfig:
    train: bool = False
    max_rollouts: Optional[int] = setting(None, ge=1)
    load_balancer: bool = True
    fca: bool = False
    speculative_model: str = ""


@dataclass
class LogitsConfig:
    optimization: str = setting("none", choices=("none", "compute", "memory"))
    peak_mem_gib: float = setting(4.0, gt=0)
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
    max_concurrency: Optional[int] = setting(None, ge=1, fix="set it to >= 1, or null to follow the sampler")


@dataclass
class SamplingConfig:
    tensor_parallel_size: int = setting(1, ge=1)
    gpu_memory_utilization: Optional[float] = setting(None, gt=0)
    max_num_seqs: Optional[int] = setting(None, ge=1)
    enforce_eager: Optional[bool] = None
    enable_chunked_prefill: Optional[bool] = None
    vllm: dict = field(default_factory=dict)


@dataclass
class DeviceConfig:
    type: str = "cuda"
    peak_flops: Optional[float] = setting(None, gt=0)
    name: Optional[str] = None


@dataclass
class ArcticConfig:
    """Typed view of ``remote_backend.arctic``; see arctic.yaml for each key's meaning."""

    protocol: str = "http"
    host: str = "127.0.0.1"
    port: int = setting(8000, ge=1, lt=65536)
    launch_server: bool = False
    launch_command: Optional[list] = None
    startup_timeout_s: float = setting(600.0, gt=0)
    connect_timeout_s: float = setting(10.0, gt=0)
    request_timeout_s: float = setting(1800.0, gt=0)
    job_ready_timeout_s: float = setting(1800.0, gt=0)
    training_gpus: int = setting(1, ge=1)
    sampling_gpus: int = setting(1, ge=1, fix="verl's rollout samples through Arctic: give it at least one GPU")
    log_prob_gpus: Optional[int] = setting(None, ge=0, fix="set it to >= 0, or null to derive it")
    colocate: bool = True
    seed: Optional[int] = None
    full_determinism: bool = False
    checkpoint_dir: Optional[str] = None
    export_hf: bool = False
    loss_fn: str = "verl_grpo"
    strict_loss_check: bool = True
    micro_batch_size: Optional[int] = setting(None, ge=1)
    drop_position_ids: bool = True
    deepspeed: dict = field(default_factory=lambda: {"zero_optimization": {"stage": 1}})  # as arctic.yaml
    ds_worker: dict = field(default_factory=dict)
    zorro: ZorroConfig = field(default_factory=ZorroConfig)
    logits: LogitsConfig = field(default_factory=LogitsConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)

    def __post_init__(self) -> None:
        """Rules that span fields, or whose value needs its own explanation."""
        p = CONFIG_KEY
        if self.protocol not in PROTOCOLS:
            raise ConfigError(
                f"{p}.protocol={self.protocol!r}: must be one of {', '.join(PROTOCOLS)} ('http': an Arctic RL HTTP "
                "server at host:port; 'ray': Arctic's in-process Ray server, started in verl's Ray cluster). "
                f"Fix: set {p}.protocol=http or {p}.protocol=ray"
            )
        if self.protocol == "ray" and self.launch_server:
            raise ConfigError(
                f"{p}.launch_server=true starts an HTTP server, but {p}.protocol=ray starts Arctic's server inside "
                f"verl's Ray cluster itself. Fix: set {p}.launch_server=false, or {p}.protocol=http"
            )
        if self.weight_sync.cuda_ipc and not self.colocate:
            raise ConfigError(
                f"{p}.weight_sync.cuda_ipc=true requires {p}.colocate=true (CUDA IPC shares one GPU). "
                f"Fix: set {p}.colocate=true or {p}.weight_sync.cuda_ipc=false"
            )
        if self.logits.optimization == "memory" and not self.zorro.train:
            raise ConfigError(
                f"{p}.logits.optimization=memory requires {p}.zorro.train=true. "
                f"Fix: set {p}.zorro.train=true or {p}.logits.optimization=compute"
            )


def load_arctic_config(main_config: Any) -> ArcticConfig:
    """``main_config.remote_backend.arctic`` (absent: all defaults), typed and checked.

    Raises:
        ConfigError: an unknown key, a wrong type, a value out of range or an impossible combination.
    """
    return load_settings(ArcticConfig, main_config, CONFIG_KEY)
