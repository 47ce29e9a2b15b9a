"""How per-token outputs travel from the engine actor to its client: as numpy arrays.

Ray pickles a CPU ``torch.Tensor`` through ``torch.save`` into the message
(copies in and out, ~2x slower than the data size warrants), while a numpy
array goes out-of-band through the object store (pickle protocol 5). For
``compute_log_prob`` results - two float32 ``[T]`` arrays, megabytes at RL batch
sizes - the engine therefore sends numpy (:func:`outputs_to_numpy`) and the
client turns them back into tensors (:func:`outputs_to_torch`), owning a
private copy so nothing downstream holds read-only object-store memory.

Pure module (torch + numpy; the conversions are :mod:`verl.remote_backend.wire`'s).
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
