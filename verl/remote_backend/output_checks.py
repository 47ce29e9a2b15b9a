"""Pure checks of what a backend returns, before verl sees it (no Ray, no I/O).

The forwarder runs :func:`check_log_prob_output` / :func:`check_update_output`
and the rollout server :func:`check_token_ids` (through
``sampling.check_generate_result``). A malformed answer fails the step at once
with :class:`~verl.remote_backend.reliability.BackendOutputError` whose message
names the key, the expected and the actual value - instead of a shape error deep
inside verl's advantage code, or NaNs silently entering the policy loss.

Why the update check is looser: verl's own actor skips an optimizer step whose
gradient norm is not finite and logs it, so a NaN/Inf *metric* of an update is
reported, not rejected; only the structure is checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch

from verl.remote_backend.errors import BackendOutputError

__all__ = ["check_log_prob_output", "check_update_output", "check_token_ids", "check_finite_floats"]


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        shape = "nested" if value.is_nested else list(value.shape)
        return f"a tensor of shape {shape} and dtype {value.dtype}"
    return f"a {type(value).__name__}"


def check_log_prob_output(
    model_output: Any, input_ids: torch.Tensor, *, calculate_entropy: bool, op: str = "compute_log_prob"
) -> None:
    """Validate ``result["model_output"]`` of ``compute_log_prob`` against the batch.

    Args:
        model_output: the backend's ``model_output`` mapping.
        input_ids: the batch's nested-jagged ``input_ids`` (the token layout).
        calculate_entropy: whether ``entropy`` was asked for (then it is required).
        op: op name for messages.

    Raises:
        BackendOutputError: ``model_output`` not a mapping; a required key
            missing; a value that is not a floating tensor, whose shape is not
            ``[T]`` (or a nested tensor with the batch's row lengths), or that
            holds NaN/Inf.
    """
    if not isinstance(model_output, Mapping):
        raise BackendOutputError(f"{op}: result['model_output'] must be a mapping, got {_describe(model_output)}")
    lengths = input_ids.offsets().diff().tolist()
    total = int(sum(lengths))
    keys = ["log_probs"] + (["entropy"] if calculate_entropy else [])
    for key in keys:
        where = f"{op}: model_output[{key!r}]"
        value = model_output.get(key)
        if value is None:
            raise BackendOutputError(
                f"{where} is missing; expected a float tensor of shape [{total}] (keys present: {sorted(model_output)})"
            )
        if not isinstance(value, torch.Tensor):
            raise BackendOutputError(f"{where}: expected a float tensor of shape [{total}], got {_describe(value)}")
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
        if not flat.is_floating_point():
            raise BackendOutputError(f"{where}: expected a floating dtype, got {flat.dtype}")
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


def check_update_output(result: Any, *, batch_size: int, op: str = "update_actor") -> None:
    """Validate the structure of ``update_actor``'s result.

    Requires a mapping with ``metrics`` (a mapping of numbers / lists of numbers
    / tensors); ``loss``, when present, a number or list of numbers;
    ``global_token_num``, when present, ``batch_size`` non-negative integers.
    """
    if not isinstance(result, Mapping):
        raise BackendOutputError(f"{op}: the result must be a mapping with 'metrics', got {_describe(result)}")
    metrics = result.get("metrics")
    if not isinstance(metrics, Mapping):
        raise BackendOutputError(
            f"{op}: result['metrics'] must be a mapping of metric name -> number(s); got "
            f"{'nothing' if metrics is None else _describe(metrics)} (keys present: {sorted(result)})"
        )
    for name, value in metrics.items():
        if not _numeric(value):
            raise BackendOutputError(
                f"{op}: result['metrics'][{name!r}] must be a number, a list of numbers or a tensor, got {_describe(value)}"
            )
    loss = result.get("loss")
    if loss is not None and not _numeric(loss):
        raise BackendOutputError(f"{op}: result['loss'] must be a number or a list of numbers, got {_describe(loss)}")
    tokens = result.get("global_token_num")
    if tokens is not None:
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.tolist()
        if not isinstance(tokens, Sequence) or isinstance(tokens, (str, bytes)):
            raise BackendOutputError(f"{op}: result['global_token_num'] must be a list of ints, got {_describe(tokens)}")
        if len(tokens) != batch_size:
            raise BackendOutputError(
                f"{op}: result['global_token_num'] must hold one count per sample: expected {batch_size}, "
                f"got {len(tokens)}"
            )
        bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or t < 0]
        if bad:
            raise BackendOutputError(f"{op}: result['global_token_num'] must be non-negative ints, got {bad[:5]}")


def _numeric(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return not value.is_nested
    if isinstance(value, bool):
        return True
    if isinstance(value, (int, float)) or type(value).__module__ == "numpy":
        return True
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return all(_numeric(v) for v in value)
    return hasattr(value, "aggregate")  # a verl Metric passes through normalise_metrics unchanged


def check_token_ids(token_ids: Sequence[int], *, vocab_size: Optional[int], where: str = "generate") -> None:
    """Every id must be an int in ``[0, vocab_size)`` (only ``>= 0`` when the size is unknown)."""
    for i, t in enumerate(token_ids):
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise BackendOutputError(
                f"{where}: token_ids[{i}]={t} is outside the model's vocabulary: expected an id in {bound}"
            )
