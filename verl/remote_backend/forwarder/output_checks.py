"""Checks of a backend's results against the request they answer (no Ray, no I/O).

Structure is checked where a result is built (:mod:`.results`); here what needs the batch:
packed shapes vs the batch's rows, NaN/Inf located by row and token, token ids inside the
vocabulary. A failure is a :class:`BackendOutputError` naming the key, expected and actual.
An update's NaN metric is reported, not rejected: verl itself skips a non-finite-norm step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch

from verl.remote_backend.errors import BackendOutputError
from verl.remote_backend.results import LogProbResult, UpdateResult

__all__ = ["check_log_prob_output", "check_update_output", "check_token_ids", "check_finite_floats"]


def check_log_prob_output(
    result: LogProbResult, input_ids: torch.Tensor, *, calculate_entropy: bool, op: str = "compute_log_prob"
) -> None:
    """Check ``result``'s per-token tensors against the batch's nested ``input_ids``.

    Raises:
        BackendOutputError: ``entropy`` missing although asked for; a tensor whose shape is
            not ``[T]`` (or a nested tensor with the batch's row lengths); NaN/Inf values.
    """
    lengths = input_ids.offsets().diff().tolist()
    total = int(sum(lengths))
    outputs = {"log_probs": result.log_probs}
    if calculate_entropy:
        if result.entropy is None:
            raise BackendOutputError(f"{op}: entropy was asked for (calculate_entropy=True) but the result has none")
        outputs["entropy"] = result.entropy
    for key, value in outputs.items():
        where = f"{op}: {key}"
        if value.is_nested:
            got = value.offsets().diff().tolist()
            if got != lengths:
                raise BackendOutputError(f"{where}: expected nested row lengths {lengths} (the batch's), got {got}")
            flat = value.values()
        else:
            flat = value
            if flat.dim() != 1 or int(flat.shape[0]) != total:
                raise BackendOutputError(
                    f"{where}: expected shape [{total}] (one value per packed token; rows {lengths}), "
                    f"got {list(flat.shape)}"
                )
        _check_finite_tensor(flat, where, lengths)


def _check_finite_tensor(flat: torch.Tensor, where: str, lengths: Sequence[int]) -> None:
    # Fast path: one reduction, no [T] mask. A finite sum means every value is finite; a
    # non-finite one (a NaN/Inf, or finite values overflowing) gets the exact scan below.
    if bool(torch.isfinite(flat.detach().sum())):
        return
    bad = ~torch.isfinite(flat.detach())
    count = int(bad.sum())
    if count:
        first = int(bad.nonzero()[0, 0])
        row, start = 0, 0
        for row, n in enumerate(lengths):
            if first < start + n:
                break
            start += n
        raise BackendOutputError(
            f"{where}: expected finite values, got {count} NaN/Inf (first at packed index {first}: "
            f"row {row}, token {first - start}, value {float(flat[first])})"
        )


def check_finite_floats(values: Sequence[float], where: str) -> None:
    """Raise :class:`BackendOutputError` if any of ``values`` is NaN or infinite."""
    for i, v in enumerate(values):
        if v != v or v in (float("inf"), float("-inf")):
            raise BackendOutputError(f"{where}: expected finite values, got {v} at position {i}")


def check_update_output(result: UpdateResult, *, batch_size: int, op: str = "update_actor") -> None:
    """``global_token_num``, when reported, must hold one count per sample of the batch."""
    tokens = result.global_token_num
    if tokens is not None and len(tokens) != batch_size:
        raise BackendOutputError(
            f"{op}: global_token_num must hold one count per sample: expected {batch_size}, got {len(tokens)}"
        )


def check_token_ids(token_ids: Sequence[int], *, vocab_size: Optional[int], where: str = "generate") -> None:
    """Every id must be an int in ``[0, vocab_size)`` (only ``>= 0`` when the size is unknown)."""
    for i, t in enumerate(token_ids):
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise BackendOutputError(
                f"{where}: token_ids[{i}]={t} is outside the model's vocabulary: expected an id in {bound}"
            )
