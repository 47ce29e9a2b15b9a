"""Arctic RL payloads <-> the ``local`` engine's public primitives (CPU).

The stand-in server (``server.py``) receives exactly what a real Arctic RL
server receives and answers in the same shapes; this module does the
translation to and from :class:`verl.workers.remote_client.local.engine.LocalEngine`:

* ``/initialize`` (training job): a ``LocalEngine`` from the job's ``model_name``,
  DeepSpeed ``ds_config`` (AdamW params, gradient clipping, WarmupLR /
  WarmupCosineLR in optimizer steps) and ``seed``; a reference model when a
  log-prob job exists.
* ``/forward``: dense ``[B, S]`` rows -> NJT -> ``LocalEngine.log_probs`` -> dense
  ``[B, S]`` predict-next ``logprobs`` / ``entropy``, pads filled with the pad id
  like the real server's unpad/re-pad.
* ``/forward-backward``: full-width per-token tensors -> verl's ``[B, R]`` layout ->
  ``LocalEngine.forward_backward`` (verl's PPO loss); metrics under Arctic's names.
* ``/step``: ``LocalEngine.optimizer_step`` with the LR schedule advanced each
  step (DeepSpeed semantics); ``{"grad_norm", "last_lr"}``.

Processing steps are honoured as the server would: temperature is applied only
when ``apply_temperature`` is listed, log-probs only when
``compute_entropy_and_logprobs`` is.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from verl.workers.remote_client.local.config import EngineSettings, LocalBackendConfig
from verl.workers.remote_client.local.engine import LocalEngine

LOGPROB_POSTS = {"compute_entropy_and_logprobs", "ap_compute_logprobs"}
SUPPORTED_LOSSES = {"verl_grpo"}

# Actor keys the stand-in's loss reads from meta.actor_config (the real server's
# verl_grpo reads a similar subset).
_ACTOR_KEYS = (
    "loss_agg_mode",
    "loss_scale_factor",
    "clip_ratio",
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "entropy_coeff",
    "use_kl_loss",
    "kl_loss_coef",
    "kl_loss_type",
    "ppo_micro_batch_size_per_gpu",
    "use_dynamic_bsz",
    "ppo_max_token_len_per_gpu",
    "ppo_mini_batch_size",
    "ppo_epochs",
    "rollout_n",
)
_POLICY_KEYS = ("loss_mode", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")


class BridgeError(ValueError):
    """The request cannot be served (the server turns it into HTTP 400 with this text)."""


def optim_from_ds(ds_config: dict) -> tuple[dict, float]:
    """verl-style optim dict + gradient-clip value from a DeepSpeed config (optimizer-step units)."""
    opt = (ds_config or {}).get("optimizer") or {"type": "AdamW", "params": {}}
    if str(opt.get("type", "AdamW")).lower() != "adamw":
        raise BridgeError(f"stand-in supports DeepSpeed optimizer AdamW only, got {opt.get('type')!r}")
    params = opt.get("params") or {}
    optim: dict[str, Any] = {
        "lr": float(params.get("lr", 1e-5)),
        "betas": list(params.get("betas", [0.9, 0.999])),
        "weight_decay": float(params.get("weight_decay", 0.0)),
        "lr_scheduler_type": "constant",
        "lr_warmup_steps": -1,
        "lr_warmup_steps_ratio": 0.0,
        "total_training_steps": -1,
    }
    sched = (ds_config or {}).get("scheduler")
    if sched:
        sp = sched.get("params") or {}
        if sched.get("type") == "WarmupLR":
            optim["lr_warmup_steps"] = int(sp.get("warmup_num_steps", 0))
        elif sched.get("type") == "WarmupCosineLR":
            optim.update(
                lr_scheduler_type="cosine",
                lr_warmup_steps=int(sp.get("warmup_num_steps", 0)),
                total_training_steps=int(sp["total_num_steps"]),
                min_lr_ratio=float(sp.get("cos_min_ratio", 0.0)),
            )
        else:
            raise BridgeError(f"stand-in does not emulate DeepSpeed scheduler {sched.get('type')!r}")
    clip = (ds_config or {}).get("gradient_clipping")
    return optim, (float(clip) if clip else math.inf)


def build_engine(job_config: dict, *, need_ref: bool) -> LocalEngine:
    """A CPU ``LocalEngine`` for an Arctic training job config (``JobConfig.model_dump()``)."""
    optim, clip = optim_from_ds(job_config.get("ds_config") or {})
    settings = EngineSettings(
        model_path=job_config["model_name"],
        backend=LocalBackendConfig(seed=int(job_config.get("seed") or 42)),
        optim=optim,
        grad_clip=clip,
        total_training_steps=int(optim["total_training_steps"]),
        need_ref=need_ref,
    )
    return LocalEngine(settings)


def _njt(dense: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    lengths = mask.sum(dim=1, dtype=torch.int64)
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    return torch.nested.nested_tensor_from_jagged(dense[mask].contiguous(), offsets)


def _positions(batch: dict, mask: torch.Tensor) -> torch.Tensor:
    if "position_ids" in batch:
        return batch["position_ids"]
    # What the real server does when the client drops position ids.
    return (mask.long().cumsum(-1) - 1).clamp(min=0) * mask.long()


def forward(engine: LocalEngine, batch: dict, meta: dict, processing: dict, *, ref: bool) -> dict:
    """``/forward`` for one job: ``{"batch": {"logprobs", "entropy"?}, "metrics": {}, "avg_loss": 0.0}``."""
    posts = set(processing.get("post") or [])
    mask = batch["attention_mask"].to(torch.bool)
    temperature = float(meta.get("temperature", 1.0)) if "apply_temperature" in posts else 1.0
    out_batch: dict[str, torch.Tensor] = {}
    if posts & LOGPROB_POSTS:
        entropy = bool(meta.get("calculate_entropy", False))
        data = {"input_ids": _njt(batch["input_ids"], mask), "position_ids": _njt(_positions(batch, mask), mask)}
        out = engine.log_probs(data, ref=ref, temperature=temperature, calculate_entropy=entropy)
        pad = float(meta.get("pad_token_id", 0))
        for src, dst in (("log_probs", "logprobs"), ("entropy", "entropy")):
            if src in out:
                dense = torch.full(mask.shape, pad, dtype=torch.float32)
                dense[mask] = out[src]
                out_batch[dst] = dense
    return {"batch": out_batch, "metrics": {}, "avg_loss": 0.0}


def actor_config_from_meta(meta: dict) -> Any:
    """verl's ``FSDPActorConfig`` from the loss-relevant keys of ``meta.actor_config``."""
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    raw = meta.get("actor_config") or {}
    kwargs = {k: raw[k] for k in _ACTOR_KEYS if raw.get(k) is not None}
    policy = meta.get("policy_loss_config") or raw.get("policy_loss") or {}
    kwargs["policy_loss"] = PolicyLossConfig(**{k: policy[k] for k in _POLICY_KEYS if policy.get(k) is not None})
    kwargs.setdefault("ppo_mini_batch_size", max(int(meta.get("global_batch_size", 1)), 1))
    kwargs.setdefault("rollout_n", int(meta.get("rollout_n", 1)))
    try:
        return FSDPActorConfig(strategy="fsdp", **kwargs)
    except Exception as exc:
        raise BridgeError(f"meta.actor_config is not a valid verl actor config: {exc}") from exc


def forward_backward(engine: LocalEngine, batch: dict, meta: dict, processing: dict) -> dict:
    """``/forward-backward``: verl's loss on the local engine; Arctic-named metrics."""
    from verl.utils import tensordict_utils as tu

    loss_fn = processing.get("loss_fn")
    if loss_fn not in SUPPORTED_LOSSES:
        raise BridgeError(f"unknown loss_fn {loss_fn!r}; the stand-in implements {sorted(SUPPORTED_LOSSES)}")
    posts = set(processing.get("post") or [])
    mask = batch["attention_mask"].to(torch.bool)
    width = batch["prompts"].shape[1]
    tensors = {
        "input_ids": _njt(batch["input_ids"], mask),
        "position_ids": _njt(_positions(batch, mask), mask),
        "prompts": batch["prompts"],
        "responses": batch["responses"],
        "attention_mask": batch["attention_mask"],
    }
    for key in ("response_mask", "loss_mask", "old_log_probs", "advantages", "ref_log_prob", "rollout_is_weights"):
        if key in batch:
            tensors[key] = batch[key][:, width:]
    for key in ("response_mask", "old_log_probs", "advantages"):
        if key not in tensors:
            raise BridgeError(f"forward-backward batch lacks {key!r}")
    temperature = float(meta.get("temperature", 1.0)) if "apply_temperature" in posts else 1.0
    td = tu.get_tensordict(
        tensors,
        non_tensor_dict={
            "temperature": temperature,
            "calculate_entropy": bool(meta.get("calculate_entropy", False)),
            "global_batch_size": int(meta.get("global_batch_size", mask.shape[0])),
        },
    )
    out = engine.forward_backward(td, actor_config_from_meta(meta), temperature=temperature)
    metrics = {}
    for name, value in out["metrics"].items():
        arctic = name if name in ("kl_loss", "kl_coef") else f"actor/{name}"
        metrics[arctic] = _scalar(value)
    metrics["loss"] = float(out["loss"])
    return {"metrics": metrics, "avg_loss": float(out["loss"])}


def step(engine: LocalEngine) -> dict:
    out = engine.optimizer_step(step_scheduler=True)
    return {"metrics": {"last_lr": float(out["lr"]), "grad_norm": float(out["grad_norm"])}, "batch": {}}


def generate(engine: LocalEngine, prompts: list[str], params: Optional[dict]) -> list[dict]:
    """Text prompts in (tokenized as vLLM does: special tokens added), vLLM-like results out."""
    params = dict(params or {})
    want = params.get("logprobs") is not None
    params["logprobs"] = want
    requests = []
    for text in prompts:
        ids = engine.tokenizer(text, add_special_tokens=True)["input_ids"]
        requests.append(engine.make_request(ids, params))
    results = []
    for text, res in zip(prompts, engine.sample(requests)):
        finish = "stop" if res.token_ids and res.token_ids[-1] in engine.eos_token_ids else "length"
        item = {
            "text": engine.tokenizer.decode(res.token_ids, skip_special_tokens=True),
            "token_ids": list(res.token_ids),
            "finish_reason": finish,
        }
        if want:
            item["logprobs"] = list(res.log_probs or [])
        results.append(item)
    return results


def _scalar(value: Any) -> float:
    for attr in ("value", "values"):
        if hasattr(value, attr) and not torch.is_tensor(value):
            value = getattr(value, attr)
            break
    if isinstance(value, (list, tuple)):
        vals = [_scalar(v) for v in value]
        return sum(vals) / max(len(vals), 1)
    if torch.is_tensor(value):
        return float(value.detach().float().mean())
    return float(value)
