"""Token layouts: packed (nested-jagged) <-> padded dense, without per-row Python loops.

Packed = a batch's ``T = sum(L_i)`` tokens back to back (an NJT's ``values()``); padded = a
dense ``[B, W]`` tensor where row ``i``'s tokens are one contiguous run of columns starting
at ``starts[i]`` (0 for right padding; verl's left-padded prompt + right-padded response
otherwise). Conversions use one windowed copy or one flat gather instead of boolean-mask
indexing, which materialises an index per token and scatters element by element.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = [
    "offsets_from_lengths",
    "contiguous_rows",
    "packed_to_padded",
    "padded_to_packed",
    "packed_index",
    "sequence_lengths",
    "packed_to_nested",
]


def offsets_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """``[B]`` row lengths -> int64 ``[B + 1]`` offsets (``0, L_0, L_0 + L_1, ...``)."""
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths.to(torch.int64), 0, out=out[1:])
    return out


def contiguous_rows(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(starts, lengths, contiguous)`` of a ``[B, W]`` 0/1 mask.

    ``starts[i]`` is the first set column of row ``i`` (0 for an empty row),
    ``lengths[i]`` the number of set columns; ``contiguous`` is True when every
    row's set columns form one run ``[starts[i], starts[i] + lengths[i])``.
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be 2-D [B, W], got shape {tuple(mask.shape)}")
    bits = mask if mask.dtype == torch.bool else mask != 0
    width = bits.shape[1]
    lengths = bits.sum(dim=1, dtype=torch.int64)
    if width == 0:
        return lengths.clone(), lengths, True
    as_bytes = bits.view(torch.uint8)
    # max(dim).indices is the first maximal column, like argmax, and ~2x faster on CPU
    starts = as_bytes.max(dim=1).indices
    last = (width - 1) - as_bytes.flip(1).max(dim=1).indices
    nonempty = lengths > 0
    # one run <=> the span from the first to the last set column holds exactly `length` ones
    contiguous = bool(torch.equal((last - starts + 1)[nonempty], lengths[nonempty]))
    return torch.where(nonempty, starts, 0), lengths, contiguous


def _check_runs(offsets: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
    lengths = offsets.diff()
    if starts.shape != lengths.shape:
        raise ValueError(f"starts has shape {tuple(starts.shape)}, expected {tuple(lengths.shape)} (one per row)")
    if lengths.numel() and (bool((starts < 0).any()) or bool((starts + lengths > width).any())):
        raise ValueError(f"row runs [starts, starts + lengths) must lie within the padded width {width}")
    return lengths


def packed_index(offsets: torch.Tensor, starts: Optional[torch.Tensor], width: int) -> torch.Tensor:
    """Flat position ``row * width + column`` (int64 ``[T]``) of every packed token."""
    offsets = offsets.to(torch.int64)
    batch = offsets.numel() - 1
    total = int(offsets[-1])
    starts = torch.zeros(batch, dtype=torch.int64) if starts is None else starts.to(torch.int64)
    lengths = _check_runs(offsets, starts, width)
    if total == 0:
        return torch.zeros(0, dtype=torch.int64)
    # index[k] = k + shift[row of k]: a running sum of 1s that jumps by the change of shift at
    # each row's first token (one cumsum over T; cheaper than arange + repeat_interleave)
    nonempty = lengths > 0
    shift = (torch.arange(batch, dtype=torch.int64) * width + starts - offsets[:-1])[nonempty]
    steps = torch.ones(total, dtype=torch.int64)
    steps[offsets[:-1][nonempty][1:]] += shift[1:] - shift[:-1]
    steps[0] = shift[0]
    return steps.cumsum_(0)


def packed_to_padded(
    values: torch.Tensor,
    offsets: torch.Tensor,
    width: int,
    *,
    starts: Optional[torch.Tensor] = None,
    pad_value: float | int = 0,
    inside: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Packed ``[T, *rest]`` -> padded ``[B, width, *rest]``.

    Args:
        values: packed tokens (an NJT's ``values()``), row ``i`` at ``offsets[i]:offsets[i + 1]``.
        offsets: int64 ``[B + 1]`` row offsets.
        width: padded width ``W`` (>= ``starts[i] + L_i`` for every row).
        starts: first column of each row's run (int ``[B]``); ``None`` = right padding.
        pad_value: filler of the columns outside the runs.
        inside: optional bool ``[B, W]`` that is True exactly on the runs (a
            caller holding the attention mask passes it and saves building it).

    Returns:
        ``[B, width, *rest]`` tensor with ``values``' dtype and device.
    """
    offsets = offsets.to(torch.int64)
    batch, total = offsets.numel() - 1, int(offsets[-1])
    if values.shape[0] != total:
        raise ValueError(f"values has {values.shape[0]} tokens, offsets describe {total}")
    starts = torch.zeros(batch, dtype=torch.int64) if starts is None else starts.to(torch.int64)
    lengths = _check_runs(offsets, starts, width)
    if values.dim() != 1 or batch == 0 or width == 0:
        out = values.new_full((batch * width, *values.shape[1:]), pad_value)
        out.index_copy_(0, packed_index(offsets, starts, width), values)
        return out.view(batch, width, *values.shape[1:])
    # one copy of the values with `width` pads on both sides; row i is the window that puts
    # token offsets[i] at column starts[i] (its other columns hold neighbours, blanked below)
    ext = values.new_full((total + 2 * width,), pad_value)
    ext[width : width + total] = values
    rows = ext.unfold(0, width, 1).index_select(0, offsets[:-1] - starts + width)
    if inside is None:
        cols = torch.arange(width, dtype=torch.int32)
        ends = (starts + lengths).to(torch.int32)
        inside = (cols >= starts.to(torch.int32)[:, None]) & (cols < ends[:, None])
    # where() writes each element once (masked_fill_ is ~3x slower on CPU); the 0-d pad keeps the dtype
    return torch.where(inside, rows, torch.tensor(pad_value, dtype=rows.dtype))


def padded_to_packed(
    dense: torch.Tensor, offsets: torch.Tensor, *, starts: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Padded ``[B, W, *rest]`` -> packed ``[T, *rest]`` (row ``i``'s run, rows back to back).

    Args:
        dense: padded tensor; row ``i``'s tokens at columns ``[starts[i], starts[i] + L_i)``.
        offsets: int64 ``[B + 1]`` offsets of the packed result (``L_i = offsets.diff()``).
        starts: first column of each row's run; ``None`` = right padding.
    """
    if dense.dim() < 2 or dense.shape[0] != offsets.numel() - 1:
        raise ValueError(f"dense must be [B, W, ...] with B={offsets.numel() - 1}, got shape {tuple(dense.shape)}")
    batch, width = dense.shape[:2]
    index = packed_index(offsets, starts, width)
    return dense.reshape(batch * width, *dense.shape[2:]).index_select(0, index)


def sequence_lengths(nested: torch.Tensor) -> torch.Tensor:
    """Per-row lengths ``[B]`` (int64) of a jagged nested tensor."""
    if not (isinstance(nested, torch.Tensor) and nested.is_nested and nested.layout == torch.jagged):
        raise TypeError(f"expected a nested tensor with layout=torch.jagged, got {_describe(nested)}")
    return nested.offsets().diff().to(torch.int64)


def packed_to_nested(values: torch.Tensor, like: torch.Tensor, *, key: str = "output") -> torch.Tensor:
    """Rebuild a per-token output as a jagged tensor shaped like ``like``.

    Args:
        values: packed ``[T]`` tensor in the order of ``like.values()``, or a
            jagged tensor with the same row lengths as ``like``.
        like: the batch's nested ``input_ids`` (``T = like.values().shape[0]``).
        key: name used in error messages.

    Returns:
        A float32 jagged tensor sharing ``like``'s offsets (no per-row loop).

    Raises:
        ValueError / TypeError: wrong type, rank or token count.
    """
    offsets = like.offsets()
    total = int(like.values().shape[0])
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{key}: expected a torch.Tensor of shape [{total}], got {_describe(values)}")
    if values.is_nested:
        got = values.offsets().diff().to(torch.int64)
        want = offsets.diff().to(torch.int64)
        if got.shape != want.shape or not torch.equal(got.cpu(), want.cpu()):
            raise ValueError(f"{key}: nested output row lengths {got.tolist()} differ from the batch's {want.tolist()}")
        values = values.values()
    if values.dim() != 1 or int(values.shape[0]) != total:
        raise ValueError(
            f"{key}: expected packed shape [{total}] (one value per token of the batch), got {list(values.shape)}"
        )
    if not values.is_floating_point():
        raise TypeError(f"{key}: expected a floating-point tensor, got dtype {values.dtype}")
    # Own copy of the offsets: ``like``'s are often a view into the whole received batch's
    # storage, which pickling the output would otherwise ship back to the driver.
    return torch.nested.nested_tensor_from_jagged(
        values.detach().to(torch.float32).contiguous().cpu(), offsets=offsets.to(torch.int64).clone()
    )


def _describe(obj: Any) -> str:
    if isinstance(obj, torch.Tensor):
        return f"Tensor(shape={list(obj.shape) if not obj.is_nested else 'nested'}, dtype={obj.dtype})"
    return type(obj).__name__
