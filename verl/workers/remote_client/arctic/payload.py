"""Pure tensor mapping between verl's batch layout and Arctic RL's dense one.

verl holds packed (nested-jagged) tokens with left-padded prompts and right-padded responses;
Arctic RL takes and returns dense ``[B, P + R]`` rows with the real tokens where verl's
``attention_mask`` marks them. This module owns those conversions, as torch transforms with no
network and no Arctic import, so each shape contract (stated on its function) is unit-tested on
its own.
"""

from __future__ import annotations

import torch

from verl.remote_backend.transport.layout import (
    contiguous_rows,
    offsets_from_lengths,
    packed_to_padded,
    padded_to_packed,
)
from verl.workers.remote_client.arctic.errors import PayloadError

__all__ = [
    "njt_to_dense",
    "dense_to_packed",
    "token_aligned_to_predict_next",
    "response_to_full",
    "full_to_response",
]


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

    Column ``t`` of ``dense`` holds ``log p(x[t + 1] | x[:t + 1])`` for the real token in
    column ``t`` (the server applied the shift); padding columns hold filler. Selects the
    real-token columns in row order (the order of ``input_ids.values()``) and writes 0 into
    the last slot of every row, which has no next token. No shift: slot ``t`` keeps
    ``log p(token[t + 1])``.

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
    prompt is left-padded to width ``P``. This is how per-token loss inputs go to Arctic
    (token-aligned; the server's loss applies the predict-next shift itself).
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
