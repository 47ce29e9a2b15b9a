"""How per-token outputs travel from the engine actor to its client: as numpy arrays.

Ray pickles a CPU ``torch.Tensor`` through ``torch.save`` into the message
(copies in and out, ~2x slower than the data size warrants), while a numpy
array goes out-of-band through the object store (pickle protocol 5). For
``compute_log_prob`` results - two float32 ``[T]`` arrays, megabytes at RL batch
sizes - the engine therefore sends numpy (:func:`outputs_to_numpy`) and the
client turns them back into tensors (:func:`outputs_to_torch`), owning a
private copy so nothing downstream holds read-only object-store memory.

Pure module (torch + numpy only).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["outputs_to_numpy", "outputs_to_torch"]

_KEY = "model_output"


def outputs_to_numpy(result: dict[str, Any]) -> dict[str, Any]:
    """Replace the CPU tensors of ``result["model_output"]`` by numpy views (in place; returned)."""
    outputs = result.get(_KEY)
    if isinstance(outputs, dict):
        for key, value in outputs.items():
            # bfloat16 has no numpy dtype: such tensors stay tensors (pickled the slow way)
            if (
                isinstance(value, torch.Tensor)
                and not value.is_nested
                and value.device.type == "cpu"
                and value.dtype != torch.bfloat16
            ):
                outputs[key] = value.detach().contiguous().numpy()
    return result


def outputs_to_torch(result: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`outputs_to_numpy`: numpy arrays of ``result["model_output"]`` back to
    tensors (a copy: received arrays are read-only views of Ray's object store)."""
    outputs = result.get(_KEY) if isinstance(result, dict) else None
    if isinstance(outputs, dict):
        for key, value in outputs.items():
            if isinstance(value, np.ndarray):
                outputs[key] = torch.from_numpy(np.array(value, copy=True))
    return result
