"""Validation of an Arctic server's answers: the key is there, with the type and shape expected.

Every failure is an :class:`~.errors.ArcticResponseError` naming the op, where in the
answer the value was and what was found.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.workers.remote_client.arctic.errors import ArcticResponseError

__all__ = ["require", "require_tensor"]


def require(container: Any, key: str, *, op: str, where: str = "response", kind: type | tuple = object) -> Any:
    """``container[key]``, or :class:`ArcticResponseError` naming ``where.key`` and what was found."""
    if not isinstance(container, dict):
        raise ArcticResponseError(f"Arctic {op}: {where} should be a dict, got {type(container).__name__}")
    if key not in container:
        raise ArcticResponseError(f"Arctic {op}: {where} lacks key {key!r} (keys: {sorted(map(str, container))})")
    value = container[key]
    if not isinstance(value, kind):
        expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ArcticResponseError(f"Arctic {op}: {where}.{key} should be {expected}, got {type(value).__name__}")
    return value


def require_tensor(
    container: Any, key: str, shape: tuple[int, ...], *, op: str, where: str = "response.batch"
) -> torch.Tensor:
    """A floating tensor ``container[key]`` of exactly ``shape``, else :class:`ArcticResponseError`."""
    value = require(container, key, op=op, where=where)
    if isinstance(value, list):  # a server that detensorized its output
        try:
            value = torch.tensor(value, dtype=torch.float32)
        except (TypeError, ValueError) as exc:
            raise ArcticResponseError(f"Arctic {op}: {where}.{key} is a list that is not a rectangular array: {exc}")
    if not torch.is_tensor(value):
        raise ArcticResponseError(f"Arctic {op}: {where}.{key} should be a tensor, got {type(value).__name__}")
    if tuple(value.shape) != tuple(shape):
        raise ArcticResponseError(
            f"Arctic {op}: {where}.{key} has shape {tuple(value.shape)}, expected {tuple(shape)} (batch x sequence)"
        )
    if not (value.is_floating_point()):
        raise ArcticResponseError(f"Arctic {op}: {where}.{key} has dtype {value.dtype}, expected a floating dtype")
    return value
