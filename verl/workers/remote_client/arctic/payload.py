"""Pure tensor mapping between verl's batch layout and Arctic RL's dense layout.

No network, no Arctic import: every function here is a vectorised torch
transform with a stated shape contract, unit-tested on its own
(``tests/test_arctic_payload.py``). The adapter (``arctic_rl_client.py``) calls
them; the CPU stand-in server in ``tests/arctic_standin`` uses the inverse ones.

Layouts
-------
verl (see ``verl/remote_backend/base.py``): ``input_ids`` / ``position_ids`` are
nested-jagged tensors whose row ``i`` holds the ``L_i`` real tokens of sample
``i``; ``T = sum(L_i)``. Dense companions: ``prompts [B, P]`` left-padded,
``responses`` / ``response_mask [B, R]`` right-padded, ``attention_mask
[B, P + R]`` marking the real tokens. The NJT is exactly
``cat(prompts, responses)[attention_mask]`` (verl builds it that way with
``unpad_input``), so the dense Arctic row is recovered by scattering the NJT
values back to the ``attention_mask`` positions.

Arctic RL: ``input_ids [B, S]`` with ``S = P + R``; prompt left-padded, response
right-padded (the same columns as verl's ``attention_mask``). Per-token inputs to
the loss (``old_log_probs``, ``advantages``, ``response_mask``, ``ref_log_prob``)
are sent full-width ``[B, S]``: response token ``j`` sits in column ``P + j``
(token-aligned) and the prompt columns are zero. The server's loss applies the
predict-next shift itself. Outputs (``logprobs``, ``entropy``) come back
``[B, S]`` *predict-next aligned*: column ``t`` holds ``log p(x[t + 1] | x[:t + 1])``
for the real token in column ``t``; padding columns hold filler.

The shift is therefore handled exactly once, by the server: this module never
rolls a tensor. Going back to verl's packed layout is a mask-select plus zeroing
the last slot of every row (it has no next token; the server's value there is
whatever its packed buffer held).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional, Sequence

import torch

from verl.remote_backend.layout import contiguous_rows, offsets_from_lengths, packed_to_padded, padded_to_packed
from verl.workers.remote_client.arctic.errors import PayloadError

__all__ = [
    "row_lengths",
    "njt_to_dense",
    "dense_to_packed",
    "token_aligned_to_predict_next",
    "response_to_full",
    "full_to_response",
    "minibatch_indices",
    "to_json_safe",
    "reduce_metric",
    "map_step_metrics",
    "aggregate_update_metrics",
]


def row_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """Real tokens per row: ``attention_mask [B, S]`` -> ``int64 [B]``."""
    if attention_mask.dim() != 2:
        raise PayloadError(f"attention_mask must be 2-D [B, S], got shape {tuple(attention_mask.shape)}")
    return attention_mask.to(torch.bool).sum(dim=-1, dtype=torch.int64)


def _values(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.values() if getattr(tensor, "is_nested", False) else tensor


def njt_to_dense(
    tensor: torch.Tensor,
    attention_mask: torch.Tensor,
    pad_value: float | int,
    *,
    name: str = "input_ids",
) -> torch.Tensor:
    """Scatter verl's packed tokens into Arctic's dense ``[B, S]`` row layout.

    Args:
        tensor: an NJT ``[B, j]`` (verl's ``input_ids`` / ``position_ids``) or its
            packed values ``[T]``, in row order.
        attention_mask: ``[B, S]``; its ones mark where the real tokens go
            (left-padded prompt, right-padded response).
        pad_value: filler for the padding columns (the pad token id for
            ``input_ids``, 0 for ``position_ids``).
        name: field name used in error messages.

    Returns:
        ``[B, S]`` tensor with ``tensor``'s dtype.

    Raises:
        PayloadError: the NJT row lengths disagree with ``attention_mask``.
    """
    values = _values(tensor)
    if values.dim() != 1:
        raise PayloadError(
            f"{name}: expected 1-D packed values (one id per token), got shape {tuple(values.shape)}; "
            "multi-dimensional position ids (mrope) are not supported by the Arctic adapter"
        )
    if attention_mask.dim() != 2:
        raise PayloadError(f"attention_mask must be 2-D [B, S], got shape {tuple(attention_mask.shape)}")
    mask = attention_mask.to(torch.bool)
    starts, lengths, contiguous = contiguous_rows(mask)
    if getattr(tensor, "is_nested", False):
        njt_lengths = tensor.offsets().diff().to(torch.int64)
        if njt_lengths.shape != lengths.shape or not torch.equal(njt_lengths, lengths):
            raise PayloadError(
                f"{name}: row lengths {njt_lengths.tolist()} differ from attention_mask row sums {lengths.tolist()}"
            )
    total = int(lengths.sum())
    if values.shape[0] != total:
        raise PayloadError(f"{name}: {values.shape[0]} packed tokens, but attention_mask marks {total}")
    if contiguous:  # verl's layout: each row's real tokens are one run (row-wise copy, no nonzero())
        return packed_to_padded(
            values, offsets_from_lengths(lengths), mask.shape[1], starts=starts, pad_value=pad_value, inside=mask
        )
    dense = values.new_full(mask.shape, pad_value)
    dense[mask] = values
    return dense


def dense_to_packed(dense: torch.Tensor, attention_mask: torch.Tensor, *, name: str = "logprobs") -> torch.Tensor:
    """Arctic's predict-next aligned ``[B, S]`` output -> verl's packed ``[T]``.

    Selects the real-token columns in row order (the order of
    ``input_ids.values()``) and writes 0 into the last slot of every row, which
    has no next token. No shift: slot ``t`` keeps ``log p(token[t + 1])``.

    Returns:
        float32 ``[T]``.

    Raises:
        PayloadError: ``dense`` is not ``[B, S]`` like ``attention_mask``, or holds
            NaN/Inf at a real-token position other than a row's last.
    """
    mask = attention_mask.to(torch.bool)
    if not torch.is_tensor(dense) or tuple(dense.shape) != tuple(mask.shape):
        actual = tuple(dense.shape) if torch.is_tensor(dense) else type(dense).__name__
        raise PayloadError(f"{name}: expected shape {tuple(mask.shape)} (= attention_mask), got {actual}")
    starts, lengths, contiguous = contiguous_rows(mask)
    if contiguous:  # one flat gather of the real tokens, converted after selection (T values, not B*S)
        packed = padded_to_packed(dense, offsets_from_lengths(lengths), starts=starts).to(torch.float32)
    else:
        packed = dense.to(torch.float32)[mask]
    ends = lengths.cumsum(0) - 1
    ends = ends[lengths > 0]
    packed[ends] = 0.0
    # a finite sum proves every value finite (any NaN/Inf would propagate); only a
    # non-finite sum (or an overflow of huge finite values) needs the element-wise check
    if not torch.isfinite(packed.sum()) and not torch.isfinite(packed).all():
        bad = int((~torch.isfinite(packed)).sum())
        raise PayloadError(f"{name}: {bad} non-finite value(s) at real-token positions")
    return packed


def token_aligned_to_predict_next(dense: torch.Tensor) -> torch.Tensor:
    """ZoRRo's token-aligned ``[B, S]`` output -> the predict-next layout :func:`dense_to_packed` reads.

    With ``zorro.train`` the server answers ``logprobs`` / ``entropy`` with column ``t`` holding the
    value *of* token ``t`` (``log p(x[t] | x[:t])``, response columns only). Predict-next column
    ``t`` holds the value of token ``t + 1``, so every row moves one column left; the last column
    (never a real token's slot once :func:`dense_to_packed` zeroes each row's last slot) gets 0.
    """
    if not torch.is_tensor(dense) or dense.dim() != 2:
        return dense  # the shape check of dense_to_packed names the problem
    shifted = torch.zeros_like(dense)
    shifted[:, :-1] = dense[:, 1:]
    return shifted


def response_to_full(response: torch.Tensor, prompt_width: int, *, name: str = "tensor") -> torch.Tensor:
    """``[B, R]`` response-aligned tensor -> ``[B, P + R]`` with zeros over the prompt.

    Response token ``j`` lands in column ``P + j``, matching ``input_ids`` where the
    prompt is left-padded to width ``P``.
    """
    if response.dim() != 2:
        raise PayloadError(f"{name}: expected [B, R], got shape {tuple(response.shape)}")
    pad = response.new_zeros((response.shape[0], prompt_width))
    return torch.cat([pad, response], dim=1)


def full_to_response(full: torch.Tensor, prompt_width: int, *, name: str = "tensor") -> torch.Tensor:
    """Inverse of :func:`response_to_full`: ``[B, P + R]`` -> ``[B, R]``."""
    if full.dim() != 2 or full.shape[1] < prompt_width:
        raise PayloadError(f"{name}: expected [B, P + R] with P={prompt_width}, got shape {tuple(full.shape)}")
    return full[:, prompt_width:]


def minibatch_indices(
    batch_size: int,
    mini_batch_size: int,
    epochs: int = 1,
    seed: Optional[int] = 42,
    dataloader_kwargs: Optional[Mapping[str, Any]] = None,
) -> Iterator[torch.Tensor]:
    """Row indices of each PPO mini-batch, in the order verl's actor visits them.

    Mirrors ``verl.utils.tensordict_utils.make_iterator`` (which the verl actor
    uses through ``train_mini_batch``): a ``DataLoader`` over ``arange(B)`` with a
    generator seeded with ``seed`` and ``dataloader_kwargs`` (``shuffle``), run
    ``epochs`` times. Same construction => same permutation as verl's own actor.

    Yields:
        int64 ``[mini_batch_size]`` index tensors, ``epochs * B // mini_batch_size`` of them.
    """
    from torch.utils.data import DataLoader

    if mini_batch_size <= 0 or batch_size % mini_batch_size != 0:
        raise PayloadError(
            f"batch size {batch_size} is not divisible by the PPO mini-batch size {mini_batch_size} "
            "(actor_rollout_ref.actor.ppo_mini_batch_size x rollout.n)"
        )
    if epochs < 1:
        raise PayloadError(f"epochs must be >= 1 (actor_rollout_ref.actor.ppo_epochs), got {epochs}")
    generator = None
    if seed is not None:
        generator = torch.Generator()
        generator.manual_seed(int(seed))
    loader = DataLoader(
        dataset=torch.arange(batch_size),
        batch_size=mini_batch_size,
        collate_fn=lambda rows: rows,
        generator=generator,
        **dict(dataloader_kwargs or {}),
    )
    for _ in range(epochs):
        for rows in loader:
            yield torch.stack(list(rows)).to(torch.int64)


def to_json_safe(obj: Any) -> Any:
    """Recursively turn a config (dataclass, OmegaConf, dict) into JSON-safe data.

    The Arctic wire carries ``meta`` as JSON inside the safetensors header, so
    everything sent there must be plain data. Values with no JSON form become
    ``None``.
    """
    import dataclasses
    import enum
    import math

    try:  # OmegaConf containers -> plain python
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            try:
                obj = OmegaConf.to_container(obj, resolve=True)
            except Exception:  # a detached node whose interpolations point outside it
                obj = OmegaConf.to_container(obj, resolve=False)
    except ImportError:  # pragma: no cover - omegaconf ships with verl
        pass
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if not f.name.startswith("_")}
    if isinstance(obj, Mapping):
        return {str(k): to_json_safe(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, (list, tuple)):
        return [to_json_safe(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return to_json_safe(obj.value)
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if torch.is_tensor(obj) and obj.numel() == 1:
        return obj.item()
    return None


def reduce_metric(value: Any) -> Optional[float]:
    """One float from a server metric: a scalar, a 0-d tensor, or a per-rank list (averaged)."""
    if torch.is_tensor(value):
        value = value.detach().to(torch.float64).reshape(-1).tolist()
    if isinstance(value, (list, tuple)):
        flat = [reduce_metric(v) for v in value]
        flat = [v for v in flat if v is not None]
        return sum(flat) / len(flat) if flat else None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


# Arctic metric name -> verl metric name (verl's actor metrics without the
# ``actor/`` prefix; see base.py). Unlisted names pass through with any
# ``actor/`` prefix stripped.
_RENAMES = {"last_lr": "lr", "avg_loss": "loss"}
_DROP = {"job_id"}


def _verl_name(name: str) -> str:
    name = _RENAMES.get(name, name)
    return name[len("actor/") :] if name.startswith("actor/") else name


def map_step_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Rename one Arctic ``fwd_bwd`` / ``step`` metrics dict to verl's names.

    ``actor/pg_loss`` -> ``pg_loss``, ``last_lr`` -> ``lr``; paired
    ``*.sum`` / ``*.tokens`` partials (already collapsed by the server) and
    private ``_*`` entries are dropped; per-rank lists are averaged.
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if key in _DROP or key.startswith("_") or key.endswith((".sum", ".tokens")):
            continue
        reduced = reduce_metric(value)
        if reduced is not None:
            out[_verl_name(key)] = reduced
    return out


def aggregate_update_metrics(per_minibatch: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Collect per-mini-batch metrics into verl's ``update_actor`` shape.

    Every metric becomes a list with one value per mini-batch (what verl's
    actor returns; the trainer averages them), except ``lr``, which verl reports
    once per update: the last mini-batch's value.
    """
    out: dict[str, Any] = {}
    for metrics in per_minibatch:
        for key, value in metrics.items():
            out.setdefault(key, []).append(value)
    if "lr" in out:
        out["lr"] = out["lr"][-1]
    return out
