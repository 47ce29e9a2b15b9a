"""Backend metrics -> verl ``Metric`` objects, with verl's aggregation-by-name rule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np
import torch

__all__ = ["normalise_metrics", "aggregation_for", "metric_scalar"]

# verl's trainer prefixes actor metrics itself; backends should not, but some will.
_ACTOR_PREFIX = "actor/"


def aggregation_for(name: str) -> str:
    """verl's reduction rule by name: ``max``/``min`` in the name, otherwise mean."""
    if "max" in name:
        return "max"
    if "min" in name:
        return "min"
    return "mean"


def _as_floats(key: str, value: Any) -> list[float]:
    if isinstance(value, torch.Tensor):
        return [float(v) for v in value.detach().reshape(-1).cpu().tolist()]
    if isinstance(value, np.ndarray):
        return [float(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, (bool, int, float, np.number)):
        return [float(value)]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        out: list[float] = []
        for item in value:
            out.extend(_as_floats(key, item))
        return out
    raise TypeError(f"metric {key!r}: expected a number, a list of numbers or a tensor, got {type(value).__name__}")


def normalise_metrics(raw: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """Backend metrics -> ``{name: verl Metric}`` as verl's own workers return them.

    Scalars become one-value metrics, lists/tensors keep every value (one per
    mini-batch or micro-batch); the aggregation follows verl's name rule
    (:func:`aggregation_for`). Existing ``Metric`` objects pass through, and a
    leading ``actor/`` is dropped because the trainer adds it.
    """
    from verl.utils.metric.utils import Metric

    out: dict[str, Any] = {}
    for key, value in (raw or {}).items():
        name = key[len(_ACTOR_PREFIX) :] if key.startswith(_ACTOR_PREFIX) else key
        if isinstance(value, Metric):
            out[name] = value
            continue
        values = _as_floats(name, value)
        if not values:
            continue
        metric = Metric(aggregation_for(name))
        metric.extend(values)
        out[name] = metric
    return out


def metric_scalar(value: Any) -> float:
    """One float from a verl ``Metric`` (its aggregate) or a number / list of numbers (mean)."""
    aggregate = getattr(value, "aggregate", None)
    return float(aggregate()) if callable(aggregate) else float(np.mean(value))
