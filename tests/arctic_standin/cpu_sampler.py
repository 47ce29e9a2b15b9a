"""CPU double of arctic_inference's vLLM ``ReplicaPool`` (tests only).

Arctic's server (``/initialize`` sampling job, ``/generate``, ``/sleep-inference``,
``/wake-inference``, ``/reset-prefix-cache``, and the colocated weight sync
``sync_weights_cpu_file``) talks to ``app.state.sampling_pool``. vLLM needs GPUs, so the
pool here hosts each replica in a Ray actor around the local engine's continuous-batching
sampler (``verl.workers.remote_client.local.actor.EngineActor``): concurrent ``generate``
calls decode together, as in vLLM.

Preserved: text prompts are tokenized with special tokens added (vLLM's default);
``max_tokens`` / ``temperature`` / ``top_p`` / ``top_k`` / ``repetition_penalty`` /
``seed`` and ``logprobs`` (vLLM int or None) are honoured; results carry ``text``, ``token_ids``,
``finish_reason`` (``stop`` / ``length``) and, when asked, one log-prob per token; weights
arrive through ``load_weights_from_shm_path`` on each replica actor (the file the training
worker's ``gather_and_save_state_dict`` wrote). Generating while the pool sleeps fails
(vLLM's KV cache and weights are released then).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, Optional

import ray
import torch


class SamplerReplica:
    """One "vLLM replica": a local-engine sampler behind an async Ray actor."""

    def __init__(self, model: str, max_num_seqs: int, seed: int) -> None:
        from verl.workers.remote_client.local.actor import EngineActor
        from verl.workers.remote_client.local.config import EngineSettings, LocalBackendConfig

        torch.set_num_threads(1)
        settings = EngineSettings(
            model_path=model, backend=LocalBackendConfig(seed=seed, max_batch_size=max_num_seqs), optim={"lr": 0.0}
        )
        self.actor = EngineActor(settings)
        if self.actor.init_error is not None:
            raise self.actor.init_error
        self.tokenizer = self.actor.engine.tokenizer
        self.eos = set(self.actor.engine.eos_token_ids)

    async def generate(self, prompt: str, params: dict) -> dict:
        ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        want = params.get("logprobs") is not None
        keys = ("max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed")
        local = {k: params[k] for k in keys if params.get(k) is not None}
        out = await self.actor.generate(ids, {**local, "logprobs": want})
        tokens = list(out["token_ids"])
        result = {
            "text": self.tokenizer.decode(tokens, skip_special_tokens=True),
            "token_ids": tokens,
            "finish_reason": "stop" if tokens and tokens[-1] in self.eos else "length",
        }
        if want:
            result["logprobs"] = list(out.get("log_probs") or [])
        return result

    async def load_weights_from_shm_path(self, path: str) -> dict:
        weights = dict(torch.load(path, map_location="cpu", weights_only=True))
        engine = self.actor.engine
        with torch.no_grad():
            for name, param in engine.model.named_parameters():
                param.copy_(weights[name])
        await self.actor.update_weights()
        return {"num_params": len(weights)}

    async def ping(self) -> bool:
        return True


class CpuReplicaPool:
    """The attributes and coroutines of ``ReplicaPool`` that Arctic's server uses."""

    def __init__(self) -> None:
        self._config: Any = None
        self._workers: list = []
        self.num_replicas = 0
        self.tp_size = 1
        self.sleeping = False

    async def initialize(self, model_cfg: Any, num_replicas: int = 1, **_: Any) -> None:
        if int(model_cfg.tensor_parallel_size) != 1:
            raise ValueError(f"the CPU sampler runs tensor_parallel_size=1 only, got {model_cfg.tensor_parallel_size}")
        cls = ray.remote(num_cpus=0)(SamplerReplica)
        self._workers = [
            cls.options(max_concurrency=1024).remote(model_cfg.model, int(model_cfg.max_num_seqs), int(model_cfg.seed))
            for _ in range(max(1, int(num_replicas)))
        ]
        await asyncio.gather(*[w.ping.remote() for w in self._workers])
        self._config, self.num_replicas = model_cfg, len(self._workers)

    async def generate(self, prompts: list, sampling_params: Optional[dict] = None, strict: bool = False, **_: Any) -> list:
        if self._config is None:
            raise RuntimeError("sampling pool is not initialized")
        if self.sleeping:
            raise RuntimeError("sampling engines are asleep (sleep-inference); wake them before generating")
        params = dict(sampling_params or {})
        calls = [self._workers[i % self.num_replicas].generate.remote(p, params) for i, p in enumerate(prompts)]
        return list(await asyncio.gather(*calls))

    async def sleep(self, level: int = 1, offload_weights: bool = False) -> dict:
        self.sleeping = True
        return {"level": level}

    async def wake_up(self, tags: Any = None, restore_weights: bool = False) -> dict:
        if tags is None or "kv_cache" in tags:
            self.sleeping = False
        return {"tags": tags}

    async def reset_prefix_cache(self) -> bool:
        return True

    async def close_weight_sync(self) -> None:
        return None

    async def shutdown(self) -> None:
        for w in self._workers:
            ray.kill(w)
        self._workers, self._config, self.num_replicas, self.sleeping = [], None, 0, False


def build_model_config(model_name: str, vllm_config: Optional[dict], arctic_inference_config: Optional[dict] = None) -> Any:
    """Stand-in for ``server_models.build_model_config`` (arctic_inference's ``ModelConfig`` needs vLLM)."""
    cfg = dict(vllm_config or {})
    return SimpleNamespace(
        model=model_name,
        tensor_parallel_size=int(cfg.get("tensor_parallel_size", 1)),
        max_num_seqs=int(cfg.get("max_num_seqs", 256)),
        seed=int(cfg.get("seed", 0)),
        vllm=cfg,
        arctic_inference_config=arctic_inference_config,
        extra_env={},
    )
