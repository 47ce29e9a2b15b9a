"""Configs and metadata as plain JSON data: Arctic's wire carries ``meta`` as JSON inside the
safetensors header, and its job config travels as JSON too."""

from __future__ import annotations

from typing import Any, Mapping

import torch

__all__ = ["to_json_safe"]


def to_json_safe(obj: Any) -> Any:
    """Recursively turn a config (dataclass, OmegaConf, dict) into JSON-safe data.

    The Arctic wire carries ``meta`` as JSON inside the safetensors header, so
    everything sent there must be plain data. Values with no JSON form become
    ``None``.
    """
    import dataclasses
    import enum
    import math

    try:  # OmegaConf containers -> plain python
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            try:
                obj = OmegaConf.to_container(obj, resolve=True)
            except Exception:  # a detached node whose interpolations point outside it
                obj = OmegaConf.to_container(obj, resolve=False)
    except ImportError:  # pragma: no cover - omegaconf ships with verl
        pass
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if not f.name.startswith("_")}
    if isinstance(obj, Mapping):
        return {str(k): to_json_safe(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, (list, tuple)):
        return [to_json_safe(v) for v in obj]
    if isinstance(obj, enum.Enum):
        return to_json_safe(obj.value)
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if torch.is_tensor(obj) and obj.numel() == 1:
        return obj.item()
    return None
