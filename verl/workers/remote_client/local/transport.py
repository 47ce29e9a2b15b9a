"""How the ``local`` engine's log-prob results travel from its Ray actor to its client: as numpy.

``compute_log_prob`` results are megabytes of per-token floats at RL batch sizes; as numpy they
go out-of-band through Ray's object store instead of through ``torch.save`` (the conversions are
those of :mod:`verl.remote_backend.transport.wire`). The client turns them back into writable tensors, so
nothing downstream holds read-only object-store memory. Pure module (torch + numpy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from verl.remote_backend.results import BackendDevice, LogProbResult
from verl.remote_backend.transport.wire import numpy_able, tensor_from_numpy, tensor_to_numpy

__all__ = ["LogProbWire"]


@dataclass
class LogProbWire:
    """A :class:`LogProbResult` whose per-token tensors are numpy arrays (tensors numpy cannot
    hold, bfloat16, stay tensors and are pickled the ordinary way)."""

    log_probs: Any  # np.ndarray [T] or torch.Tensor
    entropy: Any = None
    metrics: dict[str, Any] = field(default_factory=dict)
    device: Optional[BackendDevice] = None
    compute_s: Optional[float] = None

    @classmethod
    def of(cls, result: LogProbResult) -> "LogProbWire":
        """Built in the engine actor, from the engine's result."""
        return cls(_out(result.log_probs), _out(result.entropy), result.metrics, result.device, result.compute_s)

    def to_result(self) -> LogProbResult:
        """Rebuilt in the client: writable tensors (a copy of read-only arrays, i.e. of object-store views)."""
        return LogProbResult(
            log_probs=_in(self.log_probs),
            entropy=_in(self.entropy),
            metrics=self.metrics,
            device=self.device,
            compute_s=self.compute_s,
        )


def _out(value: Any) -> Any:
    return tensor_to_numpy(value) if value is not None and numpy_able(value) else value


def _in(value: Any) -> Any:
    return tensor_from_numpy(value) if isinstance(value, np.ndarray) else value
