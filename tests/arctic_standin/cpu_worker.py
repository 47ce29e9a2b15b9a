"""Arctic's own ``DeepSpeedWorker`` with its real ``initialize`` and the real DeepSpeed engine, on CPU (tests only).

:class:`CpuDeepSpeedWorker` *is* arctic-platform's ``DeepSpeedWorker`` class (the body behind its
``@ray.remote``). Every method runs as shipped, ``initialize`` included: ``deepspeed.init_distributed``,
Arctic's ``ds_training_config`` / ``ds_inference_config``, ``ModelSpec.from_ds_worker_config``,
``build_model`` and ``deepspeed.initialize`` build a real ``DeepSpeedEngine`` (DeepSpeed's CPU accelerator,
``DS_ACCELERATOR=cpu``, one rank over gloo). Around ``initialize`` only what cannot run on a CPU changes, each
scoped to the call (:func:`_cpu_initialize_patches`):

* ``MASTER_PORT``: a free port per job (Arctic uses 29500/29501 for every server on a node).
* ``attn_implementation``: flash-attention cannot load on CPU, so the model is loaded with SDPA. When the job
  asked for a flash-attention kind, a forward pre-hook drops the all-ones ``attention_mask`` Arctic's pipeline
  passes with ``position_ids``, so transformers isolates the packed sequences from the position-id resets, as
  flash-attention's varlen kernel does on a GPU. For any other kind the mask is kept, as the real server
  keeps it: packed sequences then attend to each other there and here.
* ``torch.cuda.current_device`` / ``get_device_properties``: answered during ``initialize`` only (Arctic logs
  the GPU's uuid).
* Number format: ``ARCTIC_STANDIN_DTYPE=float32`` (the default) loads the model in float32 and turns off
  bf16 / bf16 autocast in the DeepSpeed configs Arctic built, so parity tests compare objectives, not number
  formats; ``bfloat16`` keeps Arctic's own choice (bf16 model, fp32 gradient accumulation) untouched.
* ``"torch_adam": true`` in the optimizer params and no shared-memory comm op at world size 1, so nothing is
  compiled (FusedAdam's CPU op and DeepSpeed's shm op are built on first use, minutes).
* ZoRRo's model patch: :mod:`.zorro_double` (its real forward needs flash-attention kernels).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from types import SimpleNamespace
from typing import Any, Iterator

import ray
import torch
from arctic_platform.common import deepspeed_worker as arctic_worker

from . import zorro_double
from .harness import free_port

#: attn_implementation values that isolate packed sequences on a GPU (flash-attention's varlen path).
FLASH_ATTENTION_KINDS = (
    "flash_attention_2",
    "flash_attention_3",
    "kernels-community/flash-attn",
    "kernels-community/flash-attn3",
)


def standin_dtype() -> str:
    """``float32`` (default, parity) or ``bfloat16`` (Arctic's own number format)."""
    value = os.environ.get("ARCTIC_STANDIN_DTYPE", "float32")
    if value not in ("float32", "bfloat16"):
        raise ValueError(f"ARCTIC_STANDIN_DTYPE={value!r}: expected float32 or bfloat16")
    return value


def _drop_all_ones_mask(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: what flash-attention varlen does with a packed row (sequences split at position 0)."""
    mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")
    if mask is not None and positions is not None and bool(mask.bool().all()):
        # transformers builds the block-diagonal mask from position ids only without a mask and a KV cache
        kwargs = {**kwargs, "attention_mask": None, "use_cache": False}
    return args, kwargs


@contextlib.contextmanager
def _cpu_initialize_patches(worker: Any, requested_attn: str) -> Iterator[None]:
    from arctic_platform.model.config import ModelSpec

    # ``import deepspeed.comm.torch as m`` would bind the ``torch`` attribute of ``deepspeed.comm``
    ds_comm_torch = importlib.import_module("deepspeed.comm.torch")

    saved_spec = ModelSpec.__dict__["from_ds_worker_config"]
    saved_build = arctic_worker.build_model
    saved_cuda = (torch.cuda.current_device, torch.cuda.get_device_properties)
    saved_shm = ds_comm_torch.build_shm_op
    original_from_ds = saved_spec.__func__

    def from_ds_worker_config(cls: type, model_name: str, ds_worker_config: dict) -> Any:
        spec = original_from_ds(cls, model_name, ds_worker_config)
        update: dict[str, Any] = {"attn_implementation": "sdpa"}
        if standin_dtype() == "float32":
            update["dtype"] = "float32"
        return spec.model_copy(update=update)

    def build_model(spec: Any, *args: Any, **kwargs: Any) -> Any:
        loaded = saved_build(spec, *args, **kwargs)
        if requested_attn in FLASH_ATTENTION_KINDS:
            loaded.model.register_forward_pre_hook(_drop_all_ones_mask, with_kwargs=True)
        return loaded

    ModelSpec.from_ds_worker_config = classmethod(from_ds_worker_config)
    arctic_worker.build_model = build_model
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_properties = lambda _device=None: SimpleNamespace(uuid="cpu-standin", name="cpu")
    if worker.world_size == 1:
        ds_comm_torch.build_shm_op = lambda: None
    try:
        yield
    finally:
        ModelSpec.from_ds_worker_config = saved_spec
        arctic_worker.build_model = saved_build
        torch.cuda.current_device, torch.cuda.get_device_properties = saved_cuda
        ds_comm_torch.build_shm_op = saved_shm


def _float32_ds_config(ds_config: dict) -> dict:
    """Arctic's DeepSpeed config with its bf16 choices turned off (``ARCTIC_STANDIN_DTYPE=float32`` only)."""
    out = dict(ds_config)
    out["bf16"] = {"enabled": False}
    out.pop("torch_autocast", None)
    if "data_types" in out:
        out["data_types"] = {**out["data_types"], "grad_accum_dtype": "fp32"}
    return out


class CpuDeepSpeedWorker(arctic_worker.DeepSpeedWorker.__ray_actor_class__):
    """``DeepSpeedWorker`` whose real ``initialize`` runs on DeepSpeed's CPU accelerator."""

    def initialize(self, master_addr: str, job_config: dict) -> bool:
        if self.world_size != 1:
            raise ValueError(f"the CPU stand-in runs one DeepSpeed rank per job, got world_size={self.world_size}")
        torch.set_num_threads(int(os.environ.get("ARCTIC_STANDIN_THREADS", "1")))
        self.master_port = free_port()
        requested = str((job_config.get("ds_worker_config") or {}).get("attn_implementation"))
        zorro_double.install()  # in this worker process, where Arctic's build_model applies its patches
        with _cpu_initialize_patches(self, requested):
            return super().initialize(master_addr, job_config)

    # ---- test-only additions (outside Arctic's methods): counts and an armed hang
    def empty_cache(self) -> dict:
        self._standin_calls = getattr(self, "_standin_calls", {})
        self._standin_calls["empty_cache"] = self._standin_calls.get("empty_cache", 0) + 1
        return super().empty_cache()

    def forward_no_grad(self, batch: dict) -> dict:
        seconds = getattr(self, "_standin_hang", {}).pop("forward_no_grad", None)
        if seconds:
            time.sleep(seconds)
        return super().forward_no_grad(batch)

    def standin_calls(self) -> dict:
        """Calls counted per method (``empty_cache``) since the worker started."""
        return dict(getattr(self, "_standin_calls", {}))

    def standin_arm_hang(self, method: str, seconds: float) -> None:
        """The next call of ``method`` (``forward_no_grad``) sleeps ``seconds`` before running."""
        self._standin_hang = {**getattr(self, "_standin_hang", {}), method: float(seconds)}

    def ds_training_config(self, job_config: dict, ds_config: dict, ds_worker_config: dict) -> dict:
        cfg = super().ds_training_config(job_config, ds_config, ds_worker_config)
        optimizer = dict(cfg.get("optimizer") or {})
        optimizer["params"] = {**(optimizer.get("params") or {}), "torch_adam": True}
        cfg["optimizer"] = optimizer
        return _float32_ds_config(cfg) if standin_dtype() == "float32" else cfg

    def ds_inference_config(self, log_prob_config: dict, ds_worker_config: dict) -> dict:
        cfg = super().ds_inference_config(log_prob_config, ds_worker_config)
        return _float32_ds_config(cfg) if standin_dtype() == "float32" else cfg


def install(server_module: Any = None) -> None:
    """Make Arctic's server spawn :class:`CpuDeepSpeedWorker` wherever it spawns ``DeepSpeedWorker``.

    ``server_module``: the module whose ``DeepSpeedWorker`` global a log-prob job uses - Arctic's
    ``common.http_server`` (default) or, in the Ray server's state actor, ``common.ray_server``.
    """
    if server_module is None:
        from arctic_platform.common import http_server as server_module

    remote_cls = ray.remote(CpuDeepSpeedWorker)
    arctic_worker.DeepSpeedWorker = remote_cls  # used by spawn_and_initialize_workers (training job)
    server_module.DeepSpeedWorker = remote_cls  # used directly by /initialize for a DeepSpeed log-prob job
