"""How a verl batch (``TensorDict``) crosses a Ray process hop: its tensors as numpy buffers.

Ray pickles a CPU ``torch.Tensor`` in-band through ``torch.save`` (a copy each way), while a
numpy array goes out-of-band (pickle protocol 5): one copy into the object store, read back as
a view. This module owns that conversion so that a batch sent between Ray processes costs one
copy per hop, and the receiver still gets an ordinary ``TensorDict``. Pure: torch, numpy, tensordict.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData

__all__ = ["WireBatch", "to_wire", "numpy_able", "tensor_to_numpy", "tensor_from_numpy"]

#: (key, kind, arrays, extra) per packed entry; kind is "dense", "jagged" or "non_tensor"
_Leaf = tuple[str, str, tuple[np.ndarray, ...], Optional[dict[str, int]]]


def numpy_able(tensor: Any) -> bool:
    """True for a tensor that can travel as a numpy buffer: CPU, strided, no grad, not bfloat16."""
    return (
        isinstance(tensor, torch.Tensor)
        and tensor.device.type == "cpu"
        and tensor.dtype != torch.bfloat16  # no numpy dtype
        and not tensor.requires_grad
        and tensor.layout == torch.strided
    )


def tensor_to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """The sending side: a (contiguous) numpy view of a :func:`numpy_able` tensor."""
    return tensor.detach().contiguous().numpy()


def tensor_from_numpy(array: np.ndarray) -> torch.Tensor:
    """The receiving side: a writable tensor (a private copy if ``array`` is read-only)."""
    # a received buffer is a read-only view of Ray's object store
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _pack(key: str, value: Any) -> Optional[_Leaf]:
    """The wire form of one top-level entry, or None to send it the ordinary way."""
    if isinstance(value, NonTensorData):
        inner = value.data
        return (key, "non_tensor", (tensor_to_numpy(inner),), None) if numpy_able(inner) else None
    if not isinstance(value, torch.Tensor):
        return None
    if value.is_nested:
        if value.layout != torch.jagged or value._lengths is not None or value._ragged_idx != 1:
            return None
        values = value.values()
        if not numpy_able(values):
            return None
        # the cached sequence-length bounds, if known, so the receiver need not recompute them
        seqlens = {name: getattr(value, f"_{name}", None) for name in ("min_seqlen", "max_seqlen")}
        seqlens = {name: int(v) for name, v in seqlens.items() if v is not None}
        return (key, "jagged", (tensor_to_numpy(values), tensor_to_numpy(value.offsets())), seqlens)
    return (key, "dense", (tensor_to_numpy(value),), None) if numpy_able(value) else None


def _unpack(kind: str, arrays: tuple[np.ndarray, ...], extra: Optional[dict[str, int]]) -> torch.Tensor:
    if kind == "jagged":
        values, offsets = (tensor_from_numpy(a) for a in arrays)
        return torch.nested.nested_tensor_from_jagged(values, offsets=offsets, **(extra or {}))
    return tensor_from_numpy(arrays[0])  # "dense", or the tensor of a "non_tensor" entry


def _rebuild(batch_size: torch.Size, order: list[str], leaves: list[_Leaf], rest: TensorDict) -> TensorDict:
    """Unpickling side: the ``TensorDict`` again, entries in their original order."""
    packed = {key: (kind, _unpack(kind, arrays, extra)) for key, kind, arrays, extra in leaves}
    out = TensorDict({}, batch_size=batch_size)
    for key in order:
        if key not in packed:
            out.set(key, rest.get(key))
        elif packed[key][0] == "non_tensor":
            out.set_non_tensor(key, packed[key][1])
        else:
            out.set(key, packed[key][1])
    return out


class WireBatch:
    """A ``TensorDict`` that pickles its CPU tensors as numpy buffers; unpickles as the ``TensorDict``.

    Attributes:
        data: the wrapped ``TensorDict`` (not copied).
    """

    __slots__ = ("data",)

    def __init__(self, data: TensorDict) -> None:
        self.data = data

    def __reduce__(self) -> tuple:
        data = self.data
        order = list(data.keys())
        leaves = [leaf for leaf in (_pack(key, data.get(key)) for key in order) if leaf is not None]
        rest = data.exclude(*[leaf[0] for leaf in leaves])
        return _rebuild, (data.batch_size, order, leaves, rest)


def to_wire(data: TensorDict) -> WireBatch:
    """Wrap ``data`` for a process hop; unpickling yields the ``TensorDict`` itself.

    Plain and nested-jagged CPU tensors, and tensor-valued non-tensor entries (verl's unpad
    ``indices``), travel as numpy buffers and arrive as private writable tensors. Everything
    else (scalar non-tensor fields, bfloat16 tensors, nested tensors with holes) is pickled
    the ordinary way. Raises ``ValueError`` for a ``TensorDict`` with more than one batch dimension.
    """
    if isinstance(data, WireBatch):
        return data
    if data.batch_dims > 1:
        raise ValueError(f"to_wire expects a verl batch (one batch dimension), got batch_size {tuple(data.batch_size)}")
    return WireBatch(data)
