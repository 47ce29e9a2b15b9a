"""``BatchRef``: a dispatched batch that stays in Ray's object store until something reads it.

Without it a batch would be serialised twice on the trainer's path: by verl's dispatch (driver
to forwarder) and again by a Ray-actor backend's client (forwarder to engine). A ``BatchRef``
carries the object reference plus the little the forwarder reads itself (row offsets, scalar
non-tensor fields), so the batch is deserialised only in the process that uses it.
Pure module: no Ray import (the reference is opaque here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = ["BatchRef", "batch_field", "non_tensor_fields"]


def non_tensor_fields(data: "TensorDict") -> dict[str, Any]:
    """The scalar non-tensor fields of a verl batch (``calculate_entropy``, ``epochs``, ``seed``, ...).

    Tensor-valued non-tensor entries (verl stores the unpad ``indices`` that
    way) and per-row stacks are left out: they are as large as the batch.
    """
    from tensordict.tensorclass import NonTensorData

    out: dict[str, Any] = {}
    for key in data.keys():
        value = data.get(key)
        if isinstance(value, NonTensorData) and not isinstance(value.data, (torch.Tensor, np.ndarray)):
            out[key] = value.data
    return out


def batch_field(data: "TensorDict | BatchRef", key: str, default: Any = None) -> Any:
    """A non-tensor field verl set on the batch (``mini_batch_size``, ``epochs``, ``temperature``, ...),
    unwrapped, or ``default`` when the batch has none. Reads a ``TensorDict`` or a :class:`BatchRef`
    alike; the one getter the forwarder and the backends use."""
    if isinstance(data, BatchRef):
        return data.get(key, default)
    from verl.utils import tensordict_utils as tu

    return tu.get(data, key, default=default)


@dataclass
class BatchRef:
    """A verl batch (``TensorDict``) in Ray's object store, plus what the forwarder reads itself.

    Attributes:
        ref: the ``ray.ObjectRef`` of the ``TensorDict`` (an opaque handle here).
        offsets: int64 ``[B + 1]`` row offsets of the batch's nested ``input_ids``
            (a private copy, never a view into the batch's storage).
        non_tensor: the scalar non-tensor fields (:func:`non_tensor_fields`).
    """

    ref: Any
    offsets: torch.Tensor
    non_tensor: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def describe(cls, data: "TensorDict", ref: Any) -> "BatchRef":
        """A ``BatchRef`` for ``data``, already stored under ``ref``."""
        input_ids = data["input_ids"]
        if not (isinstance(input_ids, torch.Tensor) and input_ids.is_nested):
            raise TypeError(
                "BatchRef needs the batch's nested-jagged input_ids (verl's left_right_2_no_padding output)"
            )
        # clone: a view would drag the whole batch storage along when pickled
        return cls(ref=ref, offsets=input_ids.offsets().to(torch.int64).clone(), non_tensor=non_tensor_fields(data))

    def __len__(self) -> int:
        return int(self.offsets.numel()) - 1

    @property
    def num_tokens(self) -> int:
        """``T``: packed tokens of the batch."""
        return int(self.offsets[-1])

    def get(self, key: str, default: Any = None) -> Any:
        """A non-tensor field (like ``verl.utils.tensordict_utils.get`` on the batch)."""
        return self.non_tensor.get(key, default)

    def pop(self, key: str, default: Any = None) -> Any:
        """Remove and return a non-tensor field (the stored batch itself is not changed)."""
        return self.non_tensor.pop(key, default)

    def layout(self) -> torch.Tensor:
        """A nested-jagged ``[B, j]`` tensor with the batch's offsets and no data.

        Its values are one zero expanded to ``T`` (no memory), so helpers that
        read only the layout (``offsets()``, ``values().shape``) accept it in
        place of ``input_ids``.
        """
        values = torch.zeros((), dtype=torch.int64).expand(self.num_tokens)
        return torch.nested.nested_tensor_from_jagged(values, offsets=self.offsets)

    async def fetch(self) -> "TensorDict":
        """The ``TensorDict`` itself (awaits the object reference), with the current non-tensor fields.

        Fields popped from :attr:`non_tensor` (e.g. ``no_lora_adapter``) are popped
        from the fetched batch too, so the backend sees what the forwarder saw.
        """
        data = await self.ref
        for key in set(non_tensor_fields(data)) - set(self.non_tensor):
            del data[key]
        return data
