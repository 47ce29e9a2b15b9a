"""Arctic's own ``DeepSpeedWorker``, started on CPU (tests only).

:class:`CpuDeepSpeedWorker` *is* arctic-platform's ``DeepSpeedWorker`` class (the body
behind its ``@ray.remote``): forward / forward-backward (``_forward_maybe_backward`` ->
``run_pipeline`` -> the registered loss), ``step``, ``save_checkpoint``,
``load_checkpoint``, ``gather_and_save_state_dict`` and ``destroy`` are inherited and run
as shipped. Only ``initialize`` is replaced: the real one calls
``deepspeed.init_distributed`` (NCCL), ``build_model`` (flash-attention patches) and
``deepspeed.initialize`` and queries the CUDA device. This one builds the same DeepSpeed
config with the worker's own ``ds_training_config`` / ``ds_inference_config``, loads the
Hugging Face model in float32 and wraps it in :class:`~.cpu_engine.CpuDeepSpeedEngine`.
"""

from __future__ import annotations

import os

import ray
import torch
from arctic_platform.common import deepspeed_worker as arctic_worker
from arctic_platform.common.utils import sp_size_from_job_config

from .cpu_engine import CpuDeepSpeedEngine


class CpuDeepSpeedWorker(arctic_worker.DeepSpeedWorker.__ray_actor_class__):
    """``DeepSpeedWorker`` with a CPU ``initialize``; every other method is Arctic's."""

    def initialize(self, master_addr: str, job_config: dict) -> bool:
        from transformers import AutoModelForCausalLM

        if self.world_size != 1:
            raise ValueError(f"the CPU stand-in runs one DeepSpeed rank per job, got world_size={self.world_size}")
        torch.set_num_threads(int(os.environ.get("ARCTIC_STANDIN_THREADS", "1")))
        self.master_addr = master_addr
        torch.manual_seed(int(job_config.get("seed") or 42))
        self.job_type = job_config.get("job_type")
        ds_worker_config = dict(job_config.get("ds_worker_config") or {})
        ds_worker_config["world_size"] = self.world_size
        self.ds_worker_config = ds_worker_config
        self.sp_size = sp_size_from_job_config(job_config)
        if self.job_type == "log_prob":
            ds_config = self.ds_inference_config(job_config.get("log_prob_config") or {}, ds_worker_config)
            self._has_optimizer = False
        else:
            ds_config = self.ds_training_config(job_config, dict(job_config.get("ds_config") or {}), ds_worker_config)
            self._has_optimizer = True
        model = AutoModelForCausalLM.from_pretrained(job_config["model_name"], dtype=torch.float32, attn_implementation="sdpa")
        self.dedup_actor_model_once_patcher = None
        zorro = ds_worker_config.get("zorro_train_enable", False)
        self.engine = CpuDeepSpeedEngine(
            model,
            ds_config,
            trainable=self._has_optimizer,
            world_size=self.world_size,
            zorro_response_len=int(ds_worker_config["response_len"]) if zorro else None,
        )
        self._device = "cpu"
        self.cpu_device = torch.device("cpu")
        return True


def install() -> None:
    """Make Arctic's server spawn :class:`CpuDeepSpeedWorker` wherever it spawns ``DeepSpeedWorker``."""
    from arctic_platform.common import http_server

    remote_cls = ray.remote(CpuDeepSpeedWorker)
    arctic_worker.DeepSpeedWorker = remote_cls  # used by spawn_and_initialize_workers (training job)
    http_server.DeepSpeedWorker = remote_cls  # used directly by /initialize for a DeepSpeed log-prob job
