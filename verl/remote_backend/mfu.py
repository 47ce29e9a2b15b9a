"""Model FLOPs utilisation of a backend's accelerators (never the forwarder's own CPU)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from verl.remote_backend.results import BackendDevice

__all__ = ["resolve_peak_flops", "compute_mfu"]

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


