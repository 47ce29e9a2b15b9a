"""Tensor and metric helpers for a backend's own forwarder worker (the seed contract's module path).

A backend that registers its own worker (``RemoteBackendRegistry.register_worker``) converts
its engine's dense outputs back to verl's packed layout and its metrics to verl's ``Metric``
with these; each is a thin, documented face of the code the generic forwarder itself uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

import torch

from verl.remote_backend.forwarder.metrics import normalise_metrics
from verl.remote_backend.transport.layout import contiguous_rows, packed_to_nested, padded_to_packed

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = ["make_njt", "normalize_backend_metrics", "shift_nested_response_aligned_to_predict_next"]


def make_njt(data: "TensorDict", dense: torch.Tensor) -> torch.Tensor:
    """A dense per-token output laid out like ``data["attention_mask"]`` -> verl's jagged layout.

    Args:
        data: the batch the output belongs to: nested ``input_ids`` (row ``i`` = its ``L_i``
            real tokens) and ``attention_mask [B, W]`` (row ``i``'s tokens one run of ones:
            left-padded prompt then right-padded response).
        dense: ``[B, W]`` values, row ``i``'s at the columns where its attention mask is 1.

    Returns:
        A float32 jagged tensor with ``input_ids``' offsets (``values()`` of shape ``[sum(L_i)]``).

    Raises:
        ValueError: ``dense`` is not ``[B, W]``, a mask row is not one run, or its length
            differs from the row's ``input_ids``.
    """
    mask = data["attention_mask"]
    if dense.shape[:2] != mask.shape:
        raise ValueError(f"make_njt: dense output {list(dense.shape)} does not match attention_mask {list(mask.shape)}")
    starts, lengths, contiguous = contiguous_rows(mask)
    like = data["input_ids"]
    offsets = like.offsets().to(torch.int64)
    if not contiguous or not torch.equal(lengths, offsets.diff()):
        raise ValueError(
            "make_njt: each attention_mask row must be one run of ones as long as the row's input_ids "
            f"(mask lengths {lengths.tolist()}, input_ids lengths {offsets.diff().tolist()})"
        )
    return packed_to_nested(padded_to_packed(dense, offsets, starts=starts), like, key="make_njt")


def shift_nested_response_aligned_to_predict_next(nested: torch.Tensor) -> torch.Tensor:
    """Response-aligned jagged values (slot ``t`` scores token ``t``) -> verl's predict-next
    convention (slot ``t`` scores token ``t + 1``): every row moves one slot left and its last
    slot becomes 0, the contract's value for the slot that predicts past the row's end.

    Args:
        nested: jagged ``[B, L_i]`` tensor (e.g. from :func:`make_njt`).

    Returns:
        A jagged tensor with the same offsets and dtype.
    """
    values = nested.values()
    offsets = nested.offsets().to(torch.int64)
    shifted = torch.zeros_like(values)
    shifted[:-1] = values[1:]
    ends = offsets[1:] - 1
    shifted[ends[offsets.diff() > 0]] = 0  # else a row's last slot would hold the next row's first value
    return torch.nested.nested_tensor_from_jagged(shifted, offsets=offsets.clone())


def normalize_backend_metrics(metrics: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """A backend's metrics (numbers, lists of numbers, tensors or verl ``Metric`` objects) ->
    ``{name: verl Metric}``, aggregated by verl's name rule, as verl's own workers return them;
    a leading ``actor/`` is dropped because the trainer adds it."""
    return normalise_metrics(metrics)
