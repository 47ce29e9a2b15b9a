"""Pure tensor, metric and MFU helpers of the forwarder worker (no Ray, no I/O).

The forwarder (``worker.py``) turns what a backend returns into what verl's
trainer reads back; everything it computes lives here so it can be tested
directly:

* :func:`packed_to_nested` - packed per-token outputs ``[T]`` back into a
  nested-jagged tensor with the batch's offsets (one vectorised call).
* :func:`normalise_metrics` - backend metrics into verl's ``Metric`` form.
* :func:`resolve_peak_flops` / :func:`compute_mfu` - MFU against the backend's
  accelerators, with the model FLOPs from verl's ``FlopsCounter``.
* :class:`StepTiming` - wall vs backend-reported compute seconds of a step's calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np
import torch

from verl.remote_backend.base import BackendDevice, backend_compute_seconds

__all__ = [
    "sequence_lengths",
    "packed_to_nested",
    "normalise_metrics",
    "aggregation_for",
    "resolve_peak_flops",
    "compute_mfu",
    "StepTiming",
    "remote_overhead_metrics",
]

# verl's trainer prefixes actor metrics itself; backends should not, but some will.
_ACTOR_PREFIX = "actor/"


# ---------------------------------------------------------------- tensors
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


# ---------------------------------------------------------------- metrics
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


# ---------------------------------------------------------------- MFU
_TYPE_TO_TABLE_NAME = {"cpu": "CPU"}


def resolve_peak_flops(device: BackendDevice) -> float:
    """Peak dense FLOP/s of *one* of the backend's devices.

    The backend's own ``peak_flops`` wins; otherwise verl's device table is
    looked up by the device name (e.g. ``"NVIDIA H100 80GB HBM3"``) and, if the
    name is not in it, by the type (``cpu`` has an entry). Unknown devices give
    ``inf`` (MFU 0), exactly as verl treats an unknown GPU.
    """
    if device.peak_flops is not None:
        if not device.peak_flops > 0:
            raise ValueError(f"backend device peak_flops={device.peak_flops!r} must be > 0")
        return float(device.peak_flops)
    from verl.utils.flops_counter import get_device_flops

    for name in (device.name, _TYPE_TO_TABLE_NAME.get(device.type.lower())):
        if name:
            # unit "B" = plain FLOP/s in verl's converter
            peak = float(get_device_flops(unit="B", device_name=name))
            if math.isfinite(peak):
                return peak
    return math.inf


def compute_mfu(
    flops_counter: Any,
    seqlens: Sequence[int],
    seconds: float,
    device: BackendDevice,
    *,
    forward_only: bool,
) -> float:
    """Model FLOPs utilisation of the backend's devices for one op.

    ``flops_counter.estimate_flops(seqlens, seconds)`` (verl's ``FlopsCounter``)
    gives the achieved forward+backward TFLOP/s of the model for these
    sequence lengths; it is divided by ``count * peak`` of the backend's
    devices (never the forwarder's CPU) and, for forward-only passes, by 3 as
    verl's workers do (a forward is a third of forward+backward).

    Returns 0.0 for an empty batch, a non-positive duration or an unknown peak.
    """
    seqlens = [int(s) for s in seqlens]
    if not seqlens or seconds <= 0:
        return 0.0
    peak = resolve_peak_flops(device)
    if not math.isfinite(peak):
        return 0.0
    achieved_tflops, _local_peak = flops_counter.estimate_flops(seqlens, seconds)
    mfu = float(achieved_tflops) * 1e12 / (peak * device.count)
    return mfu / 3.0 if forward_only else mfu


# ---------------------------------------------------------------- timing
class StepTiming:
    """Seconds of one training step's backend calls, as the forwarder saw them.

    The forwarder records every data-path call (``compute_log_prob``,
    ``compute_ref_log_prob``, ``update_actor``) with its wall time and the
    result's optional ``timing.compute_s`` (see ``base.py``), and hands the
    totals to the trainer with the step's ``update_actor`` metrics
    (:meth:`pop_metrics`, which also starts the next step).
    """

    #: metric names, without verl's ``actor/`` prefix
    CALL_S = "remote/call_s"
    COMPUTE_S = "remote/compute_s"

    def __init__(self) -> None:
        self.calls = 0
        self.call_s = 0.0
        self.compute_s = 0.0
        self.compute_known = True

    def record(self, seconds: float, result: Any) -> None:
        """Add one call: its wall ``seconds`` and the backend's reported compute (if any)."""
        self.calls += 1
        self.call_s += float(seconds)
        compute = backend_compute_seconds(result)
        if compute is None:
            self.compute_known = False
        else:
            self.compute_s += compute

    def pop_metrics(self) -> dict[str, float]:
        """``{"remote/call_s", "remote/compute_s"}`` of the calls since the last pop (compute only
        when every call reported it), then reset."""
        out: dict[str, float] = {}
        if self.calls:
            out[self.CALL_S] = self.call_s
            if self.compute_known:
                out[self.COMPUTE_S] = self.compute_s
        self.__init__()
        return out


def _scalar(value: Any) -> float:
    aggregate = getattr(value, "aggregate", None)  # a verl Metric
    return float(aggregate()) if callable(aggregate) else float(np.mean(value))


def remote_overhead_metrics(actor_metrics: dict[str, Any], wall_s: float, *, prefix: str = "actor/") -> dict[str, float]:
    """The step's ``perf/remote/*`` metrics from the driver's wall time of the forwarded calls.

    Pops the forwarder's :class:`StepTiming` entries (``<prefix>remote/call_s``,
    ``<prefix>remote/compute_s``) out of ``actor_metrics`` (the trainer's
    ``update_actor`` metrics, already prefixed) and returns:

    * ``perf/remote/wall_s`` - ``wall_s``: driver-side seconds of the step's
      ``compute_log_prob`` / ``compute_ref_log_prob`` / ``update_actor`` calls,
      including verl's pad/unpad around them;
    * ``perf/remote/forwarder_s`` - of which the forwarder waited on the backend;
    * ``perf/remote/compute_s`` - of which the backend reported computing;
    * ``perf/remote/overhead_s`` = wall - compute: dispatch, serialisation,
      the forwarder and backend hops, layout conversion - what the plugin adds;
    * ``perf/remote/overhead_frac`` = overhead / wall.

    Without a backend-reported compute time only ``wall_s`` and ``forwarder_s`` are returned.
    """
    call = actor_metrics.pop(prefix + StepTiming.CALL_S, None)
    compute = actor_metrics.pop(prefix + StepTiming.COMPUTE_S, None)
    out = {"perf/remote/wall_s": float(wall_s)}
    if call is not None:
        out["perf/remote/forwarder_s"] = _scalar(call)
    if compute is not None and wall_s > 0:
        compute_s = _scalar(compute)
        overhead = max(0.0, float(wall_s) - compute_s)
        out.update(
            {
                "perf/remote/compute_s": compute_s,
                "perf/remote/overhead_s": overhead,
                "perf/remote/overhead_frac": overhead / float(wall_s),
            }
        )
    return out
