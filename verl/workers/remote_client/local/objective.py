"""The ``local`` engine's policy update: verl's own PPO objective, mini-batches and micro-batches.

It mirrors what verl 0.7.1's engine worker does for ``update_actor`` on one data-parallel rank:
mini-batches in the shared update schedule's order (verl's iterator order), then verl's own
micro-batching and ``ppo_loss`` rather than re-deriving them, so the local backend trains
exactly as verl would. Pure functions over a model and an optimizer; the
engine owns both.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Optional

import torch
from tensordict import TensorDict

from verl.remote_backend.update_schedule import SCHEDULE_FIELDS, optimizer_step_rows, read_update_schedule
from verl.utils import tensordict_utils as tu
from verl.utils.metric import Metric

from .forward import packed_forward, response_slots

__all__ = ["to_actor_config", "forward_backward", "optimizer_step", "train_batch", "merge_metrics"]

_PREFIX = "actor/"


def to_actor_config(actor_config: Any) -> Any:
    """Return verl's ``ActorConfig`` dataclass for ``actor_rollout_ref.actor``.

    Accepts the dataclass itself (returned as a copy: ``ppo_loss`` writes into
    ``global_batch_info``), an OmegaConf ``DictConfig`` or a plain dict; a block
    without ``_target_`` is read as ``FSDPActorConfig``.
    """
    from omegaconf import DictConfig, OmegaConf

    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import ActorConfig, FSDPActorConfig

    if isinstance(actor_config, ActorConfig):
        return copy.deepcopy(actor_config)
    if isinstance(actor_config, (DictConfig, dict)):
        cfg = OmegaConf.create(actor_config) if isinstance(actor_config, dict) else actor_config
        try:
            if "_target_" in cfg:
                return omega_conf_to_dataclass(cfg)
            return omega_conf_to_dataclass(cfg, FSDPActorConfig)
        except Exception as exc:  # hydra wraps the dataclass' own assertion; keep its text
            raise ValueError(f"actor_rollout_ref.actor is not a valid verl actor config: {exc}") from exc
    raise TypeError(f"actor_config must be verl's ActorConfig or a DictConfig/dict, got {type(actor_config).__name__}")


def forward_backward(
    model: torch.nn.Module,
    mini_batch: TensorDict,
    actor_config: Any,
    *,
    temperature: float = 1.0,
    pad_token_id: int = 0,
    autocast_dtype: Optional[torch.dtype] = None,
) -> dict[str, Any]:
    """Accumulate the gradient of verl's PPO loss over one mini-batch (no optimizer step).

    Args:
        model: the trained causal LM (gradients are *added* to ``.grad``).
        mini_batch: TensorDict of ``b`` rows in verl's no-padding layout:
            NJT ``input_ids``/``position_ids``; dense ``prompts``, ``responses``,
            ``attention_mask``, ``response_mask`` (and ``loss_mask``),
            ``old_log_probs``, ``advantages`` (``[b, R]``), ``ref_log_prob``
            when ``use_kl_loss``. Optional non-tensor fields: ``temperature``,
            ``calculate_entropy``, ``global_batch_size`` (default ``b``).
        actor_config: verl's ``ActorConfig`` (see :func:`to_actor_config`).
        temperature: used when the batch carries no ``temperature``.

    Returns:
        ``{"loss": float (sum of the micro-batch losses = the mini-batch loss),
        "metrics": {name: float}}`` with verl's names without ``actor/``
        (``pg_loss``, ``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower``,
        ``entropy``, ``entropy_loss`` when the entropy bonus is on, ``kl_loss``
        and ``kl_coef`` with the KL loss), aggregated over micro-batches the way
        verl declares them (sums for the loss terms, means for ratios).
    """
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.workers.engine.utils import prepare_micro_batches
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    cfg = actor_config
    data = mini_batch.copy()  # shallow: we add non-tensor fields, the caller's batch stays as sent
    rows = data.batch_size[0]
    calculate_entropy = bool(tu.get(data, "calculate_entropy", default=cfg.entropy_coeff != 0))
    temp = tu.get(data, "temperature", default=None)
    temp = temperature if temp is None else temp

    loss_mask = data["loss_mask"] if "loss_mask" in data.keys() else data["response_mask"]
    defaults = {
        "use_dynamic_bsz": cfg.use_dynamic_bsz,
        "max_token_len_per_gpu": cfg.ppo_max_token_len_per_gpu,
        "micro_batch_size_per_gpu": cfg.ppo_micro_batch_size_per_gpu or rows,
        "global_batch_size": rows,
    }
    for key, val in defaults.items():
        if key not in data.keys() or tu.get(data, key) is None:
            tu.assign_non_tensor(data, **{key: val})
    if "loss_mask" not in data.keys():
        data["loss_mask"] = loss_mask
    tu.assign_non_tensor(data, batch_num_tokens=int(loss_mask.sum().item()), dp_size=1)
    if not cfg.use_dynamic_bsz and rows % tu.get(data, "micro_batch_size_per_gpu") != 0:
        raise ValueError(
            f"mini-batch of {rows} rows is not divisible by actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="
            f"{tu.get(data, 'micro_batch_size_per_gpu')}; pick a divisor of the mini-batch size"
        )

    micro_batches, _ = prepare_micro_batches(data=data, dp_group=None, same_micro_num_in_dp=True)
    losses, metric_dicts = [], []
    for micro in micro_batches:
        out = packed_forward(
            model,
            micro["input_ids"],
            micro["position_ids"] if "position_ids" in micro.keys() else None,
            temperature=temp,
            calculate_entropy=True,
            entropy_requires_grad=calculate_entropy,
            pad_token_id=pad_token_id,
            autocast_dtype=autocast_dtype,
            slots=response_slots(micro),  # the loss and the entropy metric read only these
            share_prefixes=bool(getattr(cfg, "use_prefix_grouper", False)),
        )
        model_output = {"log_probs": out["log_probs"]}
        if calculate_entropy:
            model_output["entropy"] = out["entropy"]
        loss, metrics = ppo_loss(cfg, model_output, micro)
        loss.backward()
        losses.append(float(loss.detach().item()))
        metrics = dict(metrics)
        if calculate_entropy:
            metrics["entropy"] = metrics["actor/entropy_loss"]
        else:  # verl only reports entropy when it is in the loss; we always report it
            with torch.no_grad():
                ent = no_padding_2_padding(out["entropy"], micro)
                ent = agg_loss(ent, micro["response_mask"].to(bool), cfg.loss_agg_mode, **cfg.global_batch_info)
            metrics["entropy"] = Metric(metrics["actor/pg_loss"].aggregation, ent)
        metric_dicts.append(metrics)
    return {"loss": sum(losses), "metrics": merge_metrics(metric_dicts)}


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Clip the accumulated gradient to ``grad_clip`` (L2 norm), step, and zero the gradients.

    The step is skipped (gradients dropped) when the norm is not finite, as verl does.

    Returns:
        the gradient norm *before* clipping.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=grad_clip)
    if torch.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm.item())


def train_batch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: Any,
    data: TensorDict,
    actor_config: Any,
    *,
    grad_clip: float,
    temperature: float = 1.0,
    pad_token_id: int = 0,
    autocast_dtype: Optional[torch.dtype] = None,
    on_step: Optional[Callable[[], None]] = None,
) -> dict[str, Any]:
    """One ``update_actor``: every mini-batch of every epoch, one optimizer step each.

    Mini-batches and their order come from the shared update schedule
    (:mod:`verl.remote_backend.update_schedule`: verl's ``make_iterator`` order); the LR
    scheduler steps once per call, after the last optimizer step.

    Args:
        data: the global batch (layout of :func:`forward_backward`) with the
            non-tensor fields the trainer sets: ``mini_batch_size`` (or
            ``num_mini_batch``), ``epochs``, ``seed``, ``dataloader_kwargs``
            (absent ones fall back to the actor config, see
            :func:`~verl.remote_backend.update_schedule.read_update_schedule`).
        on_step: called after each optimizer step (e.g. to count steps).

    Returns:
        ``{"loss": float (sum over mini-batches of the mini-batch loss),
        "metrics": {name: list[float] (one per optimizer step), "lr": float},
        "global_token_num": list[int] (tokens of each sample of ``data``, in batch
        order, counted once; the caller multiplies by ``epochs`` for MFU)}``.
    """
    cfg = to_actor_config(actor_config)
    data = data.copy()
    schedule = read_update_schedule(data, actor_config=cfg, rollout_n=cfg.rollout_n)
    steps = optimizer_step_rows(schedule, data.batch_size[0])
    for key in SCHEDULE_FIELDS:  # as verl's worker: the mini-batches do not carry the schedule
        tu.pop(data, key, default=None)

    model.train()
    optimizer.zero_grad(set_to_none=True)
    per_step: list[dict[str, float]] = []
    token_num = data["input_ids"].offsets().diff().tolist()
    loss_total, lr = 0.0, None
    for idx, rows in enumerate(steps):
        mini_batch = tu.index_select_tensor_dict(data, rows)
        out = forward_backward(
            model, mini_batch, cfg, temperature=temperature, pad_token_id=pad_token_id, autocast_dtype=autocast_dtype
        )
        step_metrics = dict(out["metrics"])
        step_metrics["grad_norm"] = optimizer_step(model, optimizer, grad_clip)
        step_metrics["loss"] = out["loss"]
        if on_step is not None:
            on_step()
        if idx == len(steps) - 1 and lr_scheduler is not None:
            lr_scheduler.step()
            lr = float(lr_scheduler.get_last_lr()[0])
        loss_total += out["loss"]
        per_step.append(step_metrics)

    metrics: dict[str, Any] = {}
    for step_metrics in per_step:
        for key, val in step_metrics.items():
            metrics.setdefault(key, []).append(float(val))
    if lr is None:
        lr = float(optimizer.param_groups[0]["lr"])
    metrics["lr"] = lr
    return {"loss": loss_total, "metrics": metrics, "global_token_num": token_num}


def merge_metrics(per_micro: list[dict[str, Any]]) -> dict[str, float]:
    """Combine per-micro-batch metric dicts into plain floats without the ``actor/`` prefix.

    verl ``Metric`` values aggregate by their declared type (``SUM`` for loss
    terms already normalised by the whole mini-batch, ``MEAN`` for ratios);
    plain numbers are averaged.
    """
    out: dict[str, float] = {}
    keys = dict.fromkeys(k for m in per_micro for k in m)
    for key in keys:
        vals = [m[key] for m in per_micro if key in m]
        name = key[len(_PREFIX) :] if key.startswith(_PREFIX) else key
        if isinstance(vals[0], Metric):
            merged = Metric(vals[0].aggregation)
            for v in vals:
                merged.extend(v)
            value = float(merged.aggregate())
        else:
            value = float(sum(float(v) for v in vals) / len(vals))
        if not math.isfinite(value):
            value = float("nan")
        out[name] = value
    return out
