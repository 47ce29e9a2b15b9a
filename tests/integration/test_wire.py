"""A verl batch crossing a process hop as numpy buffers (``verl.remote_backend.transport.wire``).

Checks that what arrives is the same ``TensorDict`` - every field, in order,
nested-jagged tensors with their offsets and cached sequence-length bounds,
tensor-valued and scalar non-tensor fields - with private writable tensors,
over plain pickle (protocol 5) and over a real Ray object store.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorData

from verl.remote_backend.transport.wire import WireBatch, to_wire
from verl.utils import tensordict_utils as tu


def verl_batch() -> TensorDict:
    """What the trainer sends for an update: nested input/position ids, dense rows, non-tensor fields."""
    lengths = [3, 6, 4]
    offsets = torch.tensor([0, 3, 9, 13])
    values = torch.arange(13) + 7
    return tu.get_tensordict(
        {
            "input_ids": torch.nested.nested_tensor_from_jagged(values, offsets=offsets, max_seqlen=6, min_seqlen=3),
            "position_ids": torch.nested.nested_tensor_from_jagged(
                torch.cat([torch.arange(n) for n in lengths]), offsets=offsets
            ),
            "advantages": torch.randn(3, 6),
            "attention_mask": torch.ones(3, 8, dtype=torch.int64),
            "old_log_probs": torch.randn(3, 6, dtype=torch.bfloat16),  # no numpy dtype: sent the ordinary way
        },
        {"indices": torch.arange(13), "temperature": 0.7, "epochs": 2, "dataloader_kwargs": {"shuffle": False}},
    )


def assert_same_batch(sent, received) -> None:
    assert type(received).__name__ == "TensorDict" and received.batch_size == sent.batch_size
    assert list(received.keys()) == list(sent.keys())
    for key in sent.keys():
        a, b = sent.get(key), received.get(key)
        if isinstance(a, NonTensorData):
            assert isinstance(b, NonTensorData), key
            if isinstance(a.data, torch.Tensor):
                assert torch.equal(a.data, b.data), key
            else:
                assert a.data == b.data, key
        elif a.is_nested:
            assert b.is_nested and torch.equal(a.offsets(), b.offsets()) and torch.equal(a.values(), b.values()), key
            assert (a._max_seqlen, a._min_seqlen) == (b._max_seqlen, b._min_seqlen), key
        else:
            assert b.dtype == a.dtype and torch.equal(a, b), key


def test_a_batch_round_trips_through_protocol_5_pickle_with_its_tensors_out_of_band():
    sent = verl_batch()
    buffers = []
    stream = pickle.dumps(to_wire(sent), protocol=5, buffer_callback=buffers.append)
    # input_ids (values + offsets), position_ids (values + offsets), advantages, attention_mask, indices
    assert len(buffers) == 7
    assert sum(b.raw().nbytes for b in buffers) > len(stream) / 4
    received = pickle.loads(stream, buffers=buffers)
    assert_same_batch(sent, received)


def test_received_tensors_are_private_copies_of_read_only_buffers():
    sent = verl_batch()
    buffers = []
    stream = pickle.dumps(to_wire(sent), protocol=5, buffer_callback=buffers.append)
    read_only = [memoryview(b.raw()).toreadonly() for b in buffers]  # what an object store hands out
    received = pickle.loads(stream, buffers=read_only)
    received["input_ids"].values()[0] = -1  # writable, and not the sender's memory
    received["advantages"][0, 0] = 99.0
    assert int(sent["input_ids"].values()[0]) == 7 and float(sent["advantages"][0, 0]) != 99.0


def test_a_batch_round_trips_through_rays_object_store():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False)
    try:
        sent = verl_batch()
        received = ray.get(ray.put(to_wire(sent)))
        assert_same_batch(sent, received)
        received["position_ids"].values().add_(1)  # writable after the object store
    finally:
        if started:
            ray.shutdown()


def test_wrapping_is_idempotent_and_refuses_multi_dimensional_batches():
    batch = verl_batch()
    wire = to_wire(batch)
    assert isinstance(wire, WireBatch) and to_wire(wire) is wire and wire.data is batch
    with pytest.raises(ValueError, match="one batch dimension"):
        to_wire(TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2, 3]))


def test_a_field_selected_from_a_consolidated_batch_sends_only_its_own_bytes():
    batch = verl_batch()
    batch["padding_heavy"] = torch.zeros(3, 100_000)  # 1.2 MB in the same storage after consolidate
    selected = batch.consolidate().select("input_ids", "position_ids")
    buffers = []
    stream = pickle.dumps(to_wire(selected), protocol=5, buffer_callback=buffers.append)
    sent = len(stream) + sum(b.raw().nbytes for b in buffers)
    assert sent < 20_000, sent  # 2 x (13 values + 4 offsets) int64 plus the structure, not 1.2 MB
    assert_same_batch(selected, pickle.loads(stream, buffers=buffers))
