"""Arctic RL's step metrics under verl's actor metric names, reduced and aggregated per update."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch

__all__ = ["reduce_metric", "map_step_metrics", "aggregate_update_metrics"]


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
