"""Model FLOPs utilisation of a backend's accelerators (never the forwarder's own CPU).

The denominator is the device's peak (reported by the backend, e.g. measured by
:func:`measure_matmul_flops`, else verl's table); the numerator is verl's FLOP count
without the input-embedding lookup (:func:`model_tflops`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from verl.remote_backend.results import BackendDevice

__all__ = ["resolve_peak_flops", "compute_mfu", "model_tflops", "measure_matmul_flops"]

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
    mfu = model_tflops(flops_counter, seqlens) / seconds * 1e12 / (peak * device.count)
    return mfu / 3.0 if forward_only else mfu


def model_tflops(flops_counter: Any, seqlens: Sequence[int]) -> float:
    """Forward+backward TFLOPs of one pass over sequences of lengths ``seqlens`` (tokens).

    verl's ``FlopsCounter`` formula minus the input-embedding lookup, which it counts as a
    matmul but is a gather (0 FLOPs). For a dense decoder with ``T = sum(s_i)`` tokens::

        6 * T * (L * (attn_linear + mlp) + V * H)  +  6 * sum(s_i^2) * head_dim * heads * L

    (``attn_linear``/``mlp`` = weight counts of one layer, ``V * H`` = the output head; the
    second term is causal attention: scores and values over the lower triangle). A forward
    alone is a third of it.
    Called by :func:`compute_mfu` (the forwarder) and by benchmarks.
    """
    seqlens = [int(s) for s in seqlens]
    tflops = _verl_formula_tflops(flops_counter, seqlens)
    config = getattr(flops_counter, "config", None)
    config = getattr(config, "text_config", None) or config
    vocab, hidden = getattr(config, "vocab_size", None), getattr(config, "hidden_size", None)
    if not tflops or not vocab or not hidden:
        return float(tflops or 0.0)
    return max(0.0, float(tflops) - 6.0 * vocab * hidden * sum(seqlens) / 1e12)


def _verl_formula_tflops(flops_counter: Any, seqlens: list[int]) -> float:
    """TFLOPs of one pass by verl's per-architecture formula (``ESTIMATE_FUNC``, as
    ``FlopsCounter.estimate_flops`` over 1 s), without that method's device-peak lookup: on verl
    0.9.1 the lookup asks CUDA for the device name even in a CPU-only process, and fails there."""
    from verl.utils.flops_counter import ESTIMATE_FUNC

    config = flops_counter.config
    formula = ESTIMATE_FUNC.get(getattr(config, "model_type", None))
    return float(formula(config, sum(seqlens), seqlens, 1.0)) if formula is not None else 0.0


def measure_matmul_flops(device: Any, dtype: Any, *, size: int = 0, seconds: float = 0.3) -> float:
    """Achievable dense matmul FLOP/s of ``device`` in ``dtype``: the best of square matmuls
    repeated for about ``seconds`` (after one warm-up), with the calling process's threads.

    ``size`` 0 picks 1024 on CPU and 4096 on an accelerator. The local engine calls it at start
    and again before its first training call, and reports the larger as ``BackendDevice.peak_flops``.
    """
    import time

    import torch

    device = torch.device(device)
    n = size or (1024 if device.type == "cpu" else 4096)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    best, spent = 0.0, 0.0
    with torch.no_grad():
        torch.mm(a, b)
        sync()
        while spent < seconds:
            start = time.perf_counter()
            for _ in range(1 if device.type == "cpu" else 10):
                out = torch.mm(a, b)
            sync()
            took = time.perf_counter() - start
            spent += took
            best = max(best, (2.0 * n**3 * (1 if device.type == "cpu" else 10)) / took)
    del out
    return best
