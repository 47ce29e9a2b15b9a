"""Build Arctic RL request bodies from verl's batches (pure; no network).

Arctic's training endpoints take ``{"batch": {dense [B, S] tensors}, "meta":
{JSON scalars}, "processing": {"post": [...], "loss_fn": ...}}``. This module
assembles those bodies with the mapping functions of :mod:`.payload`; the
adapter sends them. See :mod:`.payload` for the layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch

from verl.remote_backend.update_schedule import UpdateSchedule, optimizer_step_rows
from verl.workers.remote_client.arctic.errors import PayloadError
from verl.workers.remote_client.arctic.json_data import to_json_safe
from verl.workers.remote_client.arctic.payload import njt_to_dense, response_to_full

if TYPE_CHECKING:
    from tensordict import TensorDict

    from verl.workers.remote_client.arctic.config import ArcticConfig

__all__ = [
    "FORWARD_PROCESSING",
    "forward_processing",
    "update_processing",
    "base_meta",
    "dense_batch",
    "update_minibatches",
]

# Temperature first (verl divides logits by it before the softmax), then
# log-probs/entropy with the server's predict-next labels.
FORWARD_PROCESSING = {"post": ["apply_temperature", "compute_entropy_and_logprobs"], "loss_fn": None}

# Per-token response tensors the server's loss reads, sent full-width [B, S].
_RESPONSE_KEYS = ("response_mask", "old_log_probs", "advantages", "ref_log_prob", "rollout_is_weights")


def forward_processing() -> dict:
    return {"post": list(FORWARD_PROCESSING["post"]), "loss_fn": None}


def update_processing(loss_fn: str) -> dict:
    return {"post": list(FORWARD_PROCESSING["post"]), "loss_fn": loss_fn}


def _dense_field(data: "TensorDict", key: str) -> torch.Tensor:
    if key not in data.keys():
        raise PayloadError(f"the batch verl sent lacks {key!r} (keys: {sorted(data.keys())})")
    value = data[key]
    if getattr(value, "is_nested", False):
        raise PayloadError(f"{key}: expected a dense padded tensor, got a nested-jagged one")
    return value


def base_meta(
    arctic: "ArcticConfig",
    *,
    rollout_n: int,
    temperature: float,
    calculate_entropy: bool,
    pad_token_id: int,
    max_prompt_len: int,
    max_response_len: int,
    max_token_len_per_gpu: int,
) -> dict:
    """``meta`` scalars shared by every forward / forward-backward call."""
    return {
        "rollout_n": int(rollout_n),
        "temperature": float(temperature),
        "calculate_entropy": bool(calculate_entropy),
        "pad_token_id": int(pad_token_id),
        "max_prompt_len": int(max_prompt_len),
        "max_response_len": int(max_response_len),
        "max_token_len_per_gpu": int(max_token_len_per_gpu),
        "drop_position_ids": bool(arctic.drop_position_ids),
        "zorro_train_enable": bool(arctic.zorro.train),
        "zorro_train_max_rollouts": int(arctic.zorro.max_rollouts or rollout_n),
        "load_balancer": bool(arctic.zorro.load_balancer),
        "logits_optimization": arctic.logits.optimization,
        "logits_optimization_peak_mem_size_in_gib": float(arctic.logits.peak_mem_gib),
        "logits_compute_in_fp32": bool(arctic.logits.compute_in_fp32),
    }


def dense_batch(data: "TensorDict", *, pad_token_id: int, drop_position_ids: bool) -> dict[str, torch.Tensor]:
    """The model inputs of a forward call: ``input_ids``/``attention_mask``/``prompts`` ``[B, S]``/``[B, P]``.

    ``position_ids`` are included only when ``drop_position_ids`` is false (the
    server otherwise rebuilds them as ``cumsum(attention_mask) - 1``, which is
    what verl uses for text models).
    """
    mask = _dense_field(data, "attention_mask")
    prompts = _dense_field(data, "prompts")
    if "input_ids" not in data.keys():
        raise PayloadError("the batch verl sent lacks 'input_ids'")
    if mask.dim() != 2 or prompts.dim() != 2 or mask.shape[0] != prompts.shape[0] or mask.shape[1] < prompts.shape[1]:
        raise PayloadError(
            f"attention_mask {tuple(mask.shape)} and prompts {tuple(prompts.shape)} are not [B, P + R] and [B, P]"
        )
    batch = {
        "input_ids": njt_to_dense(data["input_ids"], mask, pad_token_id, name="input_ids"),
        "attention_mask": mask,
        "prompts": prompts,
    }
    if not drop_position_ids:
        batch["position_ids"] = njt_to_dense(data["position_ids"], mask, 0, name="position_ids")
    return batch


def row_chunks(total: int, rows_per_request: Optional[int], *, min_rows: int = 1) -> list[slice]:
    """Consecutive row ranges of ``total`` rows, ``rows_per_request`` each (``None``: one range).

    A last range shorter than ``min_rows`` (the fewest rows the server can split across its ranks and
    accumulation steps) is merged into the one before it. Rows keep their order.
    """
    size = max(int(rows_per_request or total), int(min_rows), 1)
    starts = list(range(0, total, size))
    if len(starts) > 1 and total - starts[-1] < min_rows:
        starts.pop()
    return [slice(a, b) for a, b in zip(starts, starts[1:] + [total])]


@dataclass
class MiniBatch:
    """One PPO mini-batch ready to send: ``rows`` index the global batch."""

    rows: torch.Tensor
    body: dict


def update_minibatches(
    data: "TensorDict",
    *,
    arctic: "ArcticConfig",
    actor_config: Any,
    meta: dict,
    pad_token_id: int,
    use_kl_loss: bool,
    schedule: UpdateSchedule,
) -> Iterator[MiniBatch]:
    """Split verl's update batch into Arctic ``fwd_bwd`` bodies, one per optimizer step.

    Order and membership of the mini-batches follow verl's actor
    (:func:`~verl.remote_backend.update_schedule.optimizer_step_rows` of ``schedule``). The batch
    is checked when this is called (``ConfigError``/``PayloadError`` before anything is sent); each
    body is built when the iterator reaches it. Per-token response tensors go
    full-width (:func:`.payload.response_to_full`), ``loss_mask`` =
    ``response_mask``. ``meta`` gains ``global_batch_size`` (samples per
    mini-batch), ``batch_num_tokens`` (response tokens in this mini-batch),
    ``actor_config`` and ``policy_loss_config`` (JSON) for the server's loss.
    """
    full = dense_batch(data, pad_token_id=pad_token_id, drop_position_ids=arctic.drop_position_ids)
    steps = optimizer_step_rows(schedule, full["input_ids"].shape[0])
    prompt_width = full["prompts"].shape[1]
    full["responses"] = _dense_field(data, "responses")
    for key in _RESPONSE_KEYS:
        if key == "ref_log_prob" and not use_kl_loss:
            continue
        if key == "rollout_is_weights" and key not in data.keys():
            continue
        value = _dense_field(data, key)
        if value.dim() != 2 or tuple(value.shape) != tuple(full["responses"].shape):
            raise PayloadError(
                f"{key}: expected shape {tuple(full['responses'].shape)} (= responses), got {tuple(value.shape)}"
            )
        full[key] = response_to_full(value, prompt_width, name=key)
    full["loss_mask"] = full["response_mask"]

    actor_json = to_json_safe(actor_config) or {}
    policy_loss_json = actor_json.get("policy_loss") or {}

    def body(rows: torch.Tensor) -> MiniBatch:
        chunk = {k: v.index_select(0, rows) for k, v in full.items()}
        mb_meta = dict(meta)
        mb_meta.update(
            global_batch_size=int(rows.numel()),
            batch_num_tokens=int(chunk["response_mask"].sum()),
            actor_config=actor_json,
            policy_loss_config=policy_loss_json,
        )
        return MiniBatch(rows=rows, body={"batch": chunk, "meta": mb_meta})

    # one body in memory at a time: each is a copy of its rows of the whole batch
    return (body(rows) for rows in steps)
