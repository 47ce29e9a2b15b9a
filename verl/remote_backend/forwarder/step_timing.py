"""Wall time vs backend-reported compute time of a step's forwarded calls (``perf/remote/*``)."""

from __future__ import annotations

from typing import Any, Optional

from verl.remote_backend.forwarder.metrics import metric_scalar

__all__ = ["StepTiming", "remote_overhead_metrics"]


class StepTiming:
    """Seconds of one training step's backend calls, as the forwarder saw them.

    The forwarder records every data-path call (``compute_log_prob``,
    ``compute_ref_log_prob``, ``update_actor``) with its wall time and the
    result's optional ``compute_s`` (see :mod:`.results`), and hands the
    totals to the trainer with the step's ``update_actor`` metrics
    (:meth:`pop_metrics`, which also starts the next step).
    """

    #: metric names, without verl's ``actor/`` prefix
    CALL_S = "remote/call_s"
    COMPUTE_S = "remote/compute_s"
    INFER_MFU = "remote/infer_mfu"

    def __init__(self) -> None:
        self.calls = 0
        self.call_s = 0.0
        self.compute_s = 0.0
        self.compute_known = True
        self.infer_mfu: list[float] = []

    def record_infer_mfu(self, mfu: float) -> None:
        """Keep the MFU of an old-log-prob call for the update's metrics: verl 0.9.1's V1 trainer
        drops the metrics a log-prob call returns (its legacy trainer logs them as
        ``perf/mfu/actor_infer``)."""
        self.infer_mfu.append(float(mfu))

    def record(self, seconds: float, compute_s: Optional[float]) -> None:
        """Add one call: its wall ``seconds`` and the backend's reported compute (``None``: unknown)."""
        self.calls += 1
        self.call_s += float(seconds)
        compute = compute_s
        if compute is None:
            self.compute_known = False
        else:
            self.compute_s += compute

    def pop_metrics(self) -> dict[str, float]:
        """``{"remote/call_s", "remote/compute_s"}`` of the calls since the last pop (compute only
        when every call reported it), ``"remote/infer_mfu"`` when recorded, then reset."""
        out: dict[str, float] = {}
        if self.calls:
            out[self.CALL_S] = self.call_s
            if self.compute_known:
                out[self.COMPUTE_S] = self.compute_s
        if self.infer_mfu:
            out[self.INFER_MFU] = sum(self.infer_mfu) / len(self.infer_mfu)
        self.__init__()
        return out


def remote_overhead_metrics(
    actor_metrics: dict[str, Any], wall_s: float, *, prefix: str = "actor/"
) -> dict[str, float]:
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
    The old-log-prob MFU the forwarder kept for verl's V1 trainer (:meth:`StepTiming.record_infer_mfu`)
    comes back as ``perf/mfu/actor_infer``, the name verl's legacy trainer logs it under.
    """
    call = actor_metrics.pop(prefix + StepTiming.CALL_S, None)
    compute = actor_metrics.pop(prefix + StepTiming.COMPUTE_S, None)
    infer_mfu = actor_metrics.pop(prefix + StepTiming.INFER_MFU, None)
    out = {"perf/remote/wall_s": float(wall_s)}
    if infer_mfu is not None:
        out["perf/mfu/actor_infer"] = metric_scalar(infer_mfu)
    if call is not None:
        out["perf/remote/forwarder_s"] = metric_scalar(call)
    if compute is not None and wall_s > 0:
        compute_s = metric_scalar(compute)
        overhead = max(0.0, float(wall_s) - compute_s)
        out.update(
            {
                "perf/remote/compute_s": compute_s,
                "perf/remote/overhead_s": overhead,
                "perf/remote/overhead_frac": overhead / float(wall_s),
            }
        )
    return out
