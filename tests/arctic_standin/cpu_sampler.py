"""CPU double of arctic_inference's vLLM ``ReplicaPool`` (tests only).

Arctic's server (``/initialize`` sampling job, ``/generate``, ``/sleep-inference``,
``/wake-inference``, ``/reset-prefix-cache``, and the colocated weight sync
``sync_weights_cpu_file``) talks to ``app.state.sampling_pool``. vLLM needs GPUs, so the
pool here hosts each replica in a Ray actor around the local engine's continuous-batching
sampler (``verl.workers.remote_client.local.actor.EngineActor``): concurrent ``generate``
calls decode together, as in vLLM.

Preserved: text prompts are tokenized with special tokens added (vLLM's default);
``max_tokens`` (vLLM's default 16 when absent) / ``temperature`` / ``top_p`` / ``top_k`` /
``repetition_penalty`` / ``seed`` and ``logprobs`` (vLLM int or None) are honoured, any other
vLLM sampling parameter with a non-default value is refused and an unknown one is a
``TypeError`` (as ``vllm.SamplingParams(**params)`` raises); results carry ``text``,
``token_ids``, ``finish_reason`` (``stop`` / ``length``), the worker's metric fields and,
when asked, ``logprobs`` in the worker's shape: one dict per generated token mapping token id
to ``{"logprob": float, "rank": int}`` (the sampled token, plus the top ``logprobs`` ones; the
server's JSON wire turns the ids into strings). The values follow the engine's
``logprobs_mode`` (vLLM's default ``raw_logprobs``: log-softmax of the model's logits, before
penalties, temperature and top-k/top-p; ``processed_logprobs``: after all of them, i.e. of
the distribution sampled from; and the two ``*_logits`` modes); an unknown mode fails the
pool's ``initialize``. Ranks are vLLM's: how many tokens score at least the sampled one's.
Weights arrive through ``load_weights_from_shm_path`` on each replica actor (the file the
training worker's ``gather_and_save_state_dict`` wrote).

Sleep / wake follow ``ReplicaPool`` and its ``InferenceWorker``: ``sleep`` refuses new
requests at once ("Scheduler is paused"), waits for the ones in flight to finish (they
complete normally), then puts every replica to sleep; ``generate`` fails while the pool
sleeps ("Model is sleeping"), including after a weights-only wake. Wake stages are the
worker's state machine (ready -> sleeping -> weights_ready -> ready): from ``sleeping``,
``tags=["kv_cache"]`` is refused ("wake weights first"), ``["weights"]`` leaves the pool
asleep, a full wake (``None`` or both tags) makes it ready; a failed final stage raises and
the pool stays asleep. Like the real pool, ``shutdown`` does not clear the sleeping flag, and
a failed ``initialize`` leaves the pool configured (the server then answers 409).
Stricter than vLLM where vLLM would silently compute garbage: loading weights into a
sleeping replica (its weights are released), generating after a ``level=2`` sleep without a
weight load, and wake tags other than ``weights`` / ``kv_cache`` are refused.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any, Optional, Sequence

import ray
import torch

logger = logging.getLogger(__name__)

LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
DEFAULT_LOGPROBS_MODE = "raw_logprobs"  # vLLM's ModelConfig.logprobs_mode default
DEFAULT_MAX_LOGPROBS = 20  # vLLM's ModelConfig.max_logprobs default
DEFAULT_MAX_TOKENS = 16  # vllm.SamplingParams.max_tokens default
SAMPLING_EPS = 1e-5  # vLLM: a temperature below this decodes greedily
WAKE_TAGS = frozenset({"weights", "kv_cache"})

READY, SLEEPING, WEIGHTS_READY = "ready", "sleeping", "weights_ready"

# Sampling parameters the double honours, and vLLM's other ones with the value that means "off".
HONOURED_PARAMS = ("max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "logprobs")
_OFF_VALUES: dict[str, Any] = {
    "n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0, "stop": None, "stop_token_ids": None,
    "ignore_eos": False, "min_tokens": 0, "prompt_logprobs": None, "flat_logprobs": False, "detokenize": True,
    "skip_special_tokens": True, "spaces_between_special_tokens": True, "logits_processors": None,
    "include_stop_str_in_output": False, "truncate_prompt_tokens": None, "output_kind": None,
    "structured_outputs": None, "guided_decoding": None, "logit_bias": None, "allowed_token_ids": None,
    "extra_args": None, "bad_words": None,
}  # fmt: skip


def check_sampling_params(params: Optional[dict], *, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> dict:
    """The honoured parameters of a ``/generate`` request, validated as vLLM would.

    Returns a dict with every key of :data:`HONOURED_PARAMS`; ``logprobs`` is ``None`` or the
    number of top log-probs besides the sampled token's.

    Raises:
        TypeError: a key that is not a vLLM sampling parameter.
        ValueError: a vLLM parameter the double does not implement, set to a non-default value;
            a ``logprobs`` vLLM refuses (below -1, above ``max_logprobs``) or -1 (all, not implemented).
    """
    params = dict(params or {})
    for key, value in params.items():
        if key in HONOURED_PARAMS:
            continue
        if key not in _OFF_VALUES:
            raise TypeError(f"Unexpected keyword argument {key!r} (not a vllm.SamplingParams field)")
        if value is not None and value != _OFF_VALUES[key] and value not in ([], ()):
            raise ValueError(
                f"sampling_params.{key}={value!r}: the CPU stand-in of vLLM does not implement it (it honours "
                f"{', '.join(HONOURED_PARAMS)})"
            )
    out = {k: params.get(k) for k in HONOURED_PARAMS}
    if "max_tokens" not in params:
        out["max_tokens"] = DEFAULT_MAX_TOKENS
    k = out["logprobs"]
    if k is not None:
        k = int(k)  # vLLM takes a bool as 0 / 1 (False still returns the sampled token's log-prob)
        if k == -1:
            raise ValueError(
                "sampling_params.logprobs=-1 (the whole vocabulary) is not implemented by the CPU stand-in"
            )
        if k < 0:
            raise ValueError(f"logprobs must be non-negative or -1, got {k}.")
        if k > max_logprobs:
            raise ValueError(f"Requested sample logprobs of {k}, which is greater than max allowed: {max_logprobs}")
        out["logprobs"] = k
    return out


def _top_k_top_p_mask(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``[V]`` bool: the tokens vLLM keeps under top-k, then top-p (the most likely one always)."""
    vocab = scores.shape[-1]
    keep = torch.ones(vocab, dtype=torch.bool, device=scores.device)
    order = scores.argsort(descending=True)
    if 0 < top_k < vocab:
        keep[order[top_k:]] = False
    if top_p < 1.0:
        probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)[order]
        mass_above = probs.cumsum(-1) - probs  # mass of the strictly more likely tokens
        drop = mass_above >= top_p
        drop[0] = False
        keep[order[drop]] = False
    return keep


def token_scores(
    logits: torch.Tensor,
    prompt_ids: Sequence[int],
    token_ids: Sequence[int],
    params: dict,
    mode: str,
) -> list[dict[int, dict[str, Any]]]:
    """vLLM's per-position sample log-probs of ``token_ids`` from their next-token ``logits``.

    Args:
        logits: ``[len(token_ids), V]`` float32; row ``j`` is the model's next-token logits before
            ``token_ids[j]`` (after the prompt and ``token_ids[:j]``).
        params: from :func:`check_sampling_params`.
        mode: one of :data:`LOGPROBS_MODES`. ``raw_*``: the logits as the model produced them;
            ``processed_*``: after the repetition penalty (on prompt and output tokens so far),
            temperature (none when greedy) and top-k / top-p (removed tokens at -inf).

    Returns:
        One dict per position, ``{token_id: {"logprob": value, "rank": rank}}``: the sampled
        token (rank = number of tokens scoring >= it) and the top ``params["logprobs"]`` tokens
        (ranks 1..k; they take precedence when the sampled one is among them), as
        ``InferenceWorker.generate`` serializes vLLM's ``Logprob`` objects.
    """
    if mode not in LOGPROBS_MODES:
        raise ValueError(f"unknown logprobs_mode {mode!r}")
    num = int(params.get("logprobs") or 0)
    temperature = float(1.0 if params.get("temperature") is None else params["temperature"])
    top_k = int(-1 if params.get("top_k") is None else params["top_k"])
    top_p = float(1.0 if params.get("top_p") is None else params["top_p"])
    penalty = float(1.0 if params.get("repetition_penalty") is None else params["repetition_penalty"])
    greedy = temperature < SAMPLING_EPS
    seen = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    seen[torch.tensor(list(prompt_ids), dtype=torch.long, device=logits.device)] = True
    out: list[dict[int, dict[str, Any]]] = []
    for j, tok in enumerate(token_ids):
        row = logits[j].float()
        if mode.startswith("processed"):
            if penalty != 1.0:
                row = torch.where(seen, torch.where(row > 0, row / penalty, row * penalty), row)
            if not greedy:
                row = row / temperature
                if top_k > 0 or top_p < 1.0:
                    row = row.masked_fill(~_top_k_top_p_mask(row, top_k, top_p), float("-inf"))
        values = torch.log_softmax(row, dim=-1) if mode.endswith("logprobs") else row
        value = values[tok]
        if not torch.isfinite(value):
            raise RuntimeError(
                f"CPU sampler: the sampled token {tok} at position {j} scores {float(value)} under {mode} (it was "
                "sampled, so top-k/top-p must keep it): the recomputed logits disagree with the decode's"
            )
        entry = {int(tok): {"logprob": float(value), "rank": int((values >= value).sum())}}
        if num > 0:
            top_vals, top_ids = values.topk(num)
            for r, (i, v) in enumerate(zip(top_ids.tolist(), top_vals.tolist()), start=1):
                entry[int(i)] = {"logprob": float(v), "rank": r}
        out.append(entry)
        seen[tok] = True
    return out


def _local_sampler_logprobs(
    logits: torch.Tensor, prompt_ids: Sequence[int], token_ids: Sequence[int], params: dict
) -> list:
    """What the local sampler reports per token: ``log_softmax(penalized / T)`` (``T = 1`` when ``T <= 0``)."""
    t = float(1.0 if params.get("temperature") is None else params["temperature"])
    t = t if t > 0 else 1.0
    penalty = float(1.0 if params.get("repetition_penalty") is None else params["repetition_penalty"])
    seen = set(int(i) for i in prompt_ids)
    out = []
    for j, tok in enumerate(token_ids):
        row = logits[j].float()
        if penalty != 1.0 and seen:
            mask = torch.zeros_like(row, dtype=torch.bool)
            mask[torch.tensor(sorted(seen), dtype=torch.long)] = True
            row = torch.where(mask, torch.where(row > 0, row / penalty, row * penalty), row)
        out.append(float(torch.log_softmax(row / t, dim=-1)[tok]))
        seen.add(int(tok))
    return out


class SamplerReplica:
    """One "vLLM replica" (arctic_inference's ``InferenceWorker``): a local-engine sampler behind an async Ray actor."""

    def __init__(self, model: str, max_num_seqs: int, seed: int, logprobs_mode: str = DEFAULT_LOGPROBS_MODE,
                 torch_threads: Optional[int] = 1) -> None:  # fmt: skip
        from verl.workers.remote_client.local.actor import EngineActor
        from verl.workers.remote_client.local.config import EngineSettings, LocalBackendConfig

        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode={logprobs_mode!r}: vLLM accepts {', '.join(LOGPROBS_MODES)}")
        if torch_threads is not None:
            torch.set_num_threads(int(torch_threads))
        settings = EngineSettings(
            model_path=model, backend=LocalBackendConfig(seed=seed, max_batch_size=max_num_seqs), optim={"lr": 0.0}
        )
        self.actor = EngineActor(settings)
        if self.actor.init_error is not None:
            raise self.actor.init_error
        self.tokenizer = self.actor.engine.tokenizer
        self.eos = set(self.actor.engine.eos_token_ids)
        self.logprobs_mode = logprobs_mode
        self.state = READY
        self.weights_discarded = False  # a level-2 sleep forgot the weights; a weight load restores them
        self._weights_epoch = 0  # bumped by every weight load (a request spanning one is not self-checked)

    async def generate(self, prompt: str, params: dict) -> dict:
        """``params`` from :func:`check_sampling_params`."""
        if self.state != READY:
            raise RuntimeError(f"Worker not ready: state={self.state}")
        if self.weights_discarded:
            raise RuntimeError(
                "the replica's weights were discarded by sleep(level=2) and not reloaded (vLLM would sample from "
                "garbage): load weights before generating"
            )
        ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        want = params.get("logprobs") is not None
        keys = ("max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed")
        local = {k: params[k] for k in keys if params.get(k) is not None}
        epoch = self._weights_epoch
        out = await self.actor.generate(ids, {**local, "logprobs": want})
        tokens = list(out.token_ids)
        result: dict[str, Any] = {
            "text": self.tokenizer.decode(tokens, skip_special_tokens=True),
            "token_ids": tokens,
            "finish_reason": "stop" if tokens and tokens[-1] in self.eos else "length",
            "prompt_len": len(ids),
            "generation_len": len(tokens),
            "prefix_cache_len": 0,
        }
        if want:
            check = out.log_probs if epoch == self._weights_epoch else None
            result["logprobs"] = await asyncio.to_thread(self._logprobs, ids, tokens, params, check)
        return result

    def _logprobs(self, prompt: list[int], tokens: list[int], params: dict, sampler_logps: Optional[list]) -> list:
        """The model's logits over ``prompt + tokens`` (one forward), scored per :func:`token_scores`.

        ``sampler_logps`` (the local sampler's ``log_softmax(penalized / T)`` of each token,
        ``T = 1`` when greedy) is checked against the same quantity from this forward, so a
        misaligned or stale recomputation cannot pass silently.
        """
        if not tokens:
            return []
        engine = self.actor.engine
        with engine._sample_lock, torch.no_grad():
            ids = torch.tensor([list(prompt) + tokens[:-1]], dtype=torch.long, device=engine.device)
            logits = engine.sampler_model(input_ids=ids).logits[0, len(prompt) - 1 :].float().cpu()
        if sampler_logps is not None:
            mine = _local_sampler_logprobs(logits, prompt, tokens, params)
            worst = max(abs(a - float(b)) for a, b in zip(mine, sampler_logps))
            if worst > 1e-3:
                raise RuntimeError(f"CPU sampler: recomputed log-probs differ from the decode's by {worst:.3g}")
        return token_scores(logits, prompt, tokens, params, self.logprobs_mode)

    async def sleep(self, level: int = 1) -> dict:
        if self.state not in (READY, WEIGHTS_READY):
            raise RuntimeError(f"Cannot sleep: worker state is {self.state}")
        self.state = SLEEPING
        if int(level) >= 2:
            self.weights_discarded = True
        return {"status": "sleeping", "level": level}

    async def wake_up(self, tags: Optional[list] = None) -> dict:
        tag_set = None if tags is None else set(tags)
        full = tag_set is None or tag_set >= WAKE_TAGS
        if self.state == READY:
            return {"status": "already_ready"}
        if self.state == WEIGHTS_READY:
            if tag_set == {"weights"}:
                return {"status": "already_weights_ready"}
            if not (tag_set == {"kv_cache"} or full):
                raise RuntimeError(
                    f"Cannot wake up from weights_ready with tags={tags!r}; use tags=['kv_cache'] or a full wake"
                )
            self.state = READY
            return {"status": "ready"}
        if tag_set == {"kv_cache"}:
            raise RuntimeError("Cannot wake kv_cache only from sleeping; wake weights first (tags=['weights'])")
        self.state = READY if full else WEIGHTS_READY
        return {"status": self.state}

    async def reset_prefix_cache(self) -> dict:
        return {"status": "prefix_cache_reset"}

    async def load_weights_from_shm_path(self, path: str) -> dict:
        if self.state == SLEEPING:
            raise RuntimeError(
                "cannot load weights into a sleeping replica (vLLM has released its weight memory): wake it with "
                "tags=['weights'] first"
            )
        self._weights_epoch += 1
        weights = dict(torch.load(path, map_location="cpu", weights_only=True))
        engine = self.actor.engine
        with torch.no_grad():
            for name, param in engine.model.named_parameters():
                param.copy_(weights[name])
        await self.actor.update_weights()
        self.weights_discarded = False
        return {"num_params": len(weights)}

    async def get_state(self) -> str:
        return self.state

    async def ping(self) -> bool:
        return True


class CpuReplicaPool:
    """The attributes and coroutines of ``ReplicaPool`` that Arctic's server uses, with its semantics."""

    def __init__(self) -> None:
        self._config: Any = None
        self._workers: list = []
        self._sleeping = False
        self._paused = False  # the scheduler's pause: set by sleep() until a final wake
        self._inflight = 0  # prompts accepted and not answered yet
        self._lock: Optional[asyncio.Lock] = None

    def __getstate__(self) -> dict:
        # Arctic's Ray server hands the pool out by value (ArcticRLRayServer fetches it from the state
        # actor with ray.get); an asyncio.Lock that was used is bound to its loop and does not pickle.
        state = dict(self.__dict__)
        state["_lock"] = None
        return state

    @property
    def num_replicas(self) -> int:
        return len(self._workers)

    @property
    def tp_size(self) -> int:
        return int(self._config.tensor_parallel_size) if self._config is not None else 1

    @property
    def sleeping(self) -> bool:
        return self._sleeping

    def _locked(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _require_initialized(self) -> None:
        if self._config is None:
            raise RuntimeError("ReplicaPool not initialized")

    async def initialize(self, model_cfg: Any, num_replicas: Optional[int] = None, **_: Any) -> int:
        if self._config is not None:
            raise RuntimeError("Already initialized. Call shutdown() first.")
        self._config = model_cfg  # as ReplicaPool: recorded before the engines start, kept when they fail
        if int(model_cfg.tensor_parallel_size) != 1:
            raise ValueError(f"the CPU sampler runs tensor_parallel_size=1 only, got {model_cfg.tensor_parallel_size}")
        mode = model_cfg.logprobs_mode
        if mode not in LOGPROBS_MODES:  # vLLM's engine config refuses it when the engines start
            raise ValueError(
                f"logprobs_mode={mode!r} is not a vLLM logprobs mode; it accepts {', '.join(LOGPROBS_MODES)}"
            )
        cls = ray.remote(num_cpus=0)(SamplerReplica)
        self._workers = [
            cls.options(max_concurrency=1024).remote(
                model_cfg.model, int(model_cfg.max_num_seqs), int(model_cfg.seed), mode
            )
            for _ in range(max(1, int(num_replicas or 1)))
        ]
        await asyncio.gather(*[w.ping.remote() for w in self._workers])
        return len(self._workers)

    async def generate(
        self, prompts: Any, sampling_params: Optional[dict] = None, strict: bool = False, **_: Any
    ) -> list:
        self._require_initialized()
        if self._sleeping:
            raise RuntimeError("Model is sleeping; call /wake_up first")
        if self._paused:
            raise RuntimeError("Scheduler is paused")
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        params = check_sampling_params(sampling_params, max_logprobs=int(self._config.max_logprobs))
        self._inflight += len(prompts)
        try:
            calls = [self._workers[i % self.num_replicas].generate.remote(p, params) for i, p in enumerate(prompts)]
            return list(await asyncio.gather(*calls))
        finally:
            self._inflight -= len(prompts)

    async def sleep(self, level: int = 1, offload_weights: bool = False, **_: Any) -> dict:
        """Refuse new requests, wait for the ones in flight, then sleep every replica."""
        self._require_initialized()
        if int(level) not in (1, 2):
            raise ValueError(
                f"sleep level must be 1 (free the KV cache, offload weights) or 2 (discard both), got {level}"
            )
        if self._sleeping:
            return {"status": "already_sleeping", "level": level}
        async with self._locked():
            self._paused = True
            while self._inflight:
                await asyncio.sleep(0.01)
            results = await asyncio.gather(
                *[w.sleep.remote(level=level) for w in self._workers], return_exceptions=True
            )
            self._sleeping = True
            return {"status": "sleeping", "level": level, "workers": _per_worker(results)}

    async def wake_up(self, tags: Any = None, restore_weights: bool = False, **_: Any) -> dict:
        """A wake stage; the pool serves again only after one restoring the KV cache."""
        self._require_initialized()
        if tags is not None and (not isinstance(tags, (list, tuple)) or not tags or not set(tags) <= WAKE_TAGS):
            raise ValueError(
                f"wake_up tags={tags!r}: use None (everything) or a non-empty subset of {sorted(WAKE_TAGS)}"
            )
        finalize = tags is None or "kv_cache" in tags
        if not self._sleeping:
            return {"status": "already_ready"}
        async with self._locked():
            tag_list = None if tags is None else list(tags)
            results = await asyncio.gather(
                *[w.wake_up.remote(tags=tag_list) for w in self._workers], return_exceptions=True
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                message = f"wake_up failed on {len(errors)} worker(s): {errors[0]}"
                if finalize:
                    raise RuntimeError(message)
                logger.error(message)
            if finalize:
                self._sleeping = self._paused = False
                return {"status": "ready", "tags": tags, "workers": _per_worker(results)}
            return {"status": "weights_ready", "tags": tags, "workers": _per_worker(results)}

    async def reset_prefix_cache(self) -> dict:
        self._require_initialized()
        await asyncio.gather(*[w.reset_prefix_cache.remote() for w in self._workers])
        return {"status": "prefix_cache_reset"}

    async def close_weight_sync(self) -> dict:
        return {"status": "ok", "workers": [{} for _ in self._workers]}

    async def shutdown(self) -> None:
        for w in self._workers:
            ray.kill(w)
        # ReplicaPool.shutdown leaves ``_sleeping`` as it was: a pool destroyed asleep stays asleep.
        self._workers, self._config, self._paused, self._inflight = [], None, False, 0


def _per_worker(results: list) -> list:
    return [{"status": "error", "message": str(r)} if isinstance(r, BaseException) else r for r in results]


def build_model_config(
    model_name: str, vllm_config: Optional[dict], arctic_inference_config: Optional[dict] = None
) -> Any:
    """Stand-in for ``server_models.build_model_config`` (arctic_inference's ``ModelConfig`` needs vLLM).

    Like the real one it does not validate engine arguments (vLLM does, when the pool starts its
    engines); ``logprobs_mode`` / ``max_logprobs`` default to vLLM's.
    """
    cfg = dict(vllm_config or {})
    return SimpleNamespace(
        model=model_name,
        tensor_parallel_size=int(cfg.get("tensor_parallel_size", 1)),
        max_num_seqs=int(cfg.get("max_num_seqs", 256)),
        seed=int(cfg.get("seed", 0)),
        logprobs_mode=cfg.get("logprobs_mode", DEFAULT_LOGPROBS_MODE),
        max_logprobs=int(cfg.get("max_logprobs", DEFAULT_MAX_LOGPROBS)),
        vllm=cfg,
        arctic_inference_config=arctic_inference_config,
        extra_env={},
    )
