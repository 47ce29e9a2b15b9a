"""How per-token outputs travel from the ``local`` engine actor to its client: as numpy arrays.

``compute_log_prob`` results are megabytes of per-token floats at RL batch sizes; as numpy they
go out-of-band through Ray's object store instead of through ``torch.save`` (the conversions are
those of :mod:`verl.remote_backend.wire`). The client turns them back into writable tensors, so
nothing downstream holds read-only object-store memory. Pure module (torch + numpy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from verl.remote_backend.wire import numpy_able, tensor_from_numpy, tensor_to_numpy

__all__ = ["outputs_to_numpy", "outputs_to_torch"]

_KEY = "model_output"


def outputs_to_numpy(result: dict[str, Any]) -> dict[str, Any]:
    """Replace the CPU tensors of ``result["model_output"]`` by numpy views (in place; returned).

    Tensors numpy cannot hold (bfloat16) stay tensors and are pickled the ordinary way.
    """
    outputs = result.get(_KEY)
    if isinstance(outputs, dict):
        for key, value in outputs.items():
            if numpy_able(value):
                outputs[key] = tensor_to_numpy(value)
    return result


def outputs_to_torch(result: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`outputs_to_numpy`: numpy arrays of ``result["model_output"]`` back to
    writable tensors (a copy of read-only arrays, i.e. views of Ray's object store)."""
    outputs = result.get(_KEY) if isinstance(result, dict) else None
    if isinstance(outputs, dict):
        for key, value in outputs.items():
            if isinstance(value, np.ndarray):
                outputs[key] = tensor_from_numpy(value)
    return result
