"""Forwarding by reference: ``BatchRef``, the forwarder's dispatch/collect, per-step timing.

No Ray here: a ``BatchRef``'s reference only has to be awaitable, so an asyncio
future stands in for a Ray ``ObjectRef``; ``ray.put`` is replaced by identity.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import pickle

import pytest
import torch
from omegaconf import OmegaConf
from support.forwarder import in_process_forwarder
from support.remote_e2e import compose
from support.stub_backend import StubBackend

from verl.remote_backend import LogProbResult, RemoteBackendRegistry, UpdateResult
from verl.remote_backend.base import accepts_batch_refs
from verl.remote_backend.forwarder.dispatch import collect_outputs, dispatch_by_reference
from verl.remote_backend.forwarder.metrics import normalise_metrics
from verl.remote_backend.forwarder.step_timing import StepTiming, remote_overhead_metrics
from verl.remote_backend.results import as_update_result
from verl.remote_backend.transport.batch_ref import BatchRef, non_tensor_fields
from verl.remote_backend.transport.layout import packed_to_nested
from verl.remote_backend.transport.wire import WireBatch
from verl.utils import tensordict_utils as tu

COMPUTE_S = 0.125


def _batch(lengths=(5, 7), **non_tensor):
    offsets = torch.tensor([0, *itertools.accumulate(lengths)])
    values = torch.arange(sum(lengths)) % 50 + 3
    fields = {"epochs": 1, "temperature": 0.9, "calculate_entropy": True, "indices": torch.arange(sum(lengths))}
    fields.update(non_tensor)
    return tu.get_tensordict(
        {
            "input_ids": torch.nested.nested_tensor_from_jagged(values, offsets=offsets),
            "position_ids": torch.nested.nested_tensor_from_jagged(
                torch.cat([torch.arange(n) for n in lengths]), offsets=offsets
            ),
        },
        fields,
    )


def _ref_to(value):
    """An awaitable standing in for a Ray ObjectRef (resolves on every await)."""

    class _Ref:
        def __await__(self):
            async def get():
                return value

            return get().__await__()

    return _Ref()


# ---------------------------------------------------------------- BatchRef
def test_describe_keeps_offsets_and_scalar_fields_only():
    data = _batch(no_lora_adapter=True)
    batch_ref = BatchRef.describe(data, ref="R")
    assert len(batch_ref) == 2 and batch_ref.num_tokens == 12
    assert batch_ref.offsets.tolist() == [0, 5, 12]
    # a private copy: a view would pickle the whole batch storage with it
    assert batch_ref.offsets.untyped_storage().data_ptr() != data["input_ids"].offsets().untyped_storage().data_ptr()
    assert batch_ref.non_tensor == {"epochs": 1, "temperature": 0.9, "calculate_entropy": True, "no_lora_adapter": True}
    assert "indices" not in batch_ref.non_tensor and "indices" not in non_tensor_fields(data)  # tensor-valued: skipped
    layout = batch_ref.layout()
    assert layout.is_nested and layout.offsets().tolist() == [0, 5, 12] and layout.values().shape == (12,)
    assert batch_ref.pop("no_lora_adapter") is True and batch_ref.get("no_lora_adapter", "gone") == "gone"


def test_fetch_returns_the_batch_without_fields_the_forwarder_popped():
    data = _batch(no_lora_adapter=True)
    batch_ref = BatchRef.describe(data, ref=_ref_to(data))
    batch_ref.pop("no_lora_adapter")
    fetched = asyncio.run(batch_ref.fetch())
    assert "no_lora_adapter" not in fetched.keys() and tu.get(fetched, "epochs") == 1
    assert torch.equal(fetched["input_ids"].values(), data["input_ids"].values())


def test_packed_outputs_do_not_share_the_input_storage():
    data = _batch().consolidate()  # what verl's dispatch delivers: one storage for every field
    out = packed_to_nested(torch.zeros(12), data["input_ids"], key="log_probs")
    assert out.offsets().untyped_storage().data_ptr() != data["input_ids"].offsets().untyped_storage().data_ptr()


# ---------------------------------------------------------------- timing
def test_reported_compute_seconds_are_optional_and_validated():
    assert LogProbResult(torch.zeros(2)).compute_s is None
    assert UpdateResult({}, compute_s=1.5).compute_s == 1.5
    for bad in (-1, "x", math.inf, True):
        with pytest.raises(ValueError, match="compute_s"):
            UpdateResult({}, compute_s=bad)
    # the previous dict form: {"timing": {"compute_s": s}}, converted with a deprecation warning
    with pytest.warns(DeprecationWarning):
        assert as_update_result({"metrics": {}, "timing": {"compute_s": 1.5}}).compute_s == 1.5
    for bad in ({"compute_s": -1}, {"compute_s": "x"}, {"compute_s": math.inf}, {}, 3):
        with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="compute_s"):
            as_update_result({"metrics": {}, "timing": bad})


def test_step_timing_sums_a_step_and_drops_compute_when_one_call_lacks_it():
    timing = StepTiming()
    timing.record(0.5, 0.25)
    timing.record(1.0, 0.5)
    assert timing.pop_metrics() == {"remote/call_s": 1.5, "remote/compute_s": 0.75}
    assert timing.pop_metrics() == {}  # reset
    timing.record(0.5, 0.25)
    timing.record(0.5, None)
    assert timing.pop_metrics() == {"remote/call_s": 1.0}


def test_the_trainer_turns_step_timing_into_perf_remote_metrics():
    forwarded = normalise_metrics({"remote/call_s": 1.5, "remote/compute_s": 1.25, "pg_loss": 0.1})
    metrics = {f"actor/{k}": v for k, v in forwarded.items()}
    out = remote_overhead_metrics(metrics, 2.0)
    assert set(metrics) == {"actor/pg_loss"}  # the timing entries do not stay under actor/
    assert out == {
        "perf/remote/wall_s": 2.0,
        "perf/remote/forwarder_s": 1.5,
        "perf/remote/compute_s": 1.25,
        "perf/remote/overhead_s": 0.75,
        "perf/remote/overhead_frac": 0.375,
    }
    assert remote_overhead_metrics({}, 1.0) == {"perf/remote/wall_s": 1.0}  # no compute reported


# ---------------------------------------------------------------- dispatch / collect
class _Group:
    world_size = 1

    def __init__(self):
        self._dispatch_info, self._collect_info = {}, {}

    def _query_dispatch_info(self, mesh):
        return [0]

    def _query_collect_info(self, mesh):
        return [True]


def test_single_rank_dispatch_sends_one_reference_without_chunking(monkeypatch):
    import ray

    put = []
    monkeypatch.setattr(ray, "put", lambda obj: put.append(obj) or f"ref{len(put)}")
    data = _batch()
    args, kwargs = dispatch_by_reference("actor", _Group(), data)
    # the caller's TensorDict itself (no chunk copy, no consolidate), wrapped for the wire
    assert len(put) == 1 and isinstance(put[0], WireBatch) and put[0].data is data
    (batch_ref,) = args[0]
    assert isinstance(batch_ref, BatchRef) and batch_ref.ref == "ref1" and kwargs == {}
    out = _batch()
    assert collect_outputs("actor", _Group(), [out]) is out


# ---------------------------------------------------------------- the forwarder with a BatchRef
#: answers at once, reports COMPUTE_S of compute, records what ``data`` it got
_RecordingBackend = StubBackend.variant("RecordingBackend", COMPUTE_S=COMPUTE_S, UPDATE_LOSS=0.5)


def _seen() -> list:
    return [payload for op, payload in _RecordingBackend.calls if op in ("compute_log_prob", "update_actor")]


@pytest.fixture
def forwarder(tiny_model_dir, monkeypatch):
    RemoteBackendRegistry.register("test-recording")(_RecordingBackend)
    cfg = compose(["trainer.remote_backend=test-recording", f"actor_rollout_ref.model.path={tiny_model_dir}"])
    owner = _RecordingBackend.from_config(cfg)  # what the trainer creates; the forwarder re-attaches
    worker = in_process_forwarder(cfg, owner.reconnect_handle(), monkeypatch)
    _RecordingBackend.calls.clear()
    yield worker
    asyncio.run(owner.destroy())
    RemoteBackendRegistry.unregister("test-recording")


def test_a_backend_without_the_capability_gets_the_fetched_tensordict(forwarder):
    data = _batch(no_lora_adapter=True)
    wire = asyncio.run(forwarder.compute_log_prob(BatchRef.describe(data, _ref_to(data))))
    assert isinstance(wire, WireBatch)  # called as the worker group does: the output is wrapped for Ray
    out = pickle.loads(pickle.dumps(wire, protocol=5))  # what the driver unpickles
    (seen,) = _seen()
    assert not accepts_batch_refs(_RecordingBackend)
    assert not isinstance(seen, BatchRef) and "no_lora_adapter" not in seen.keys()
    assert out["log_probs"].offsets().tolist() == [0, 5, 12] and out["entropy"].values().tolist() == [
        0.0,
        1.0,
        2.0,
        3.0,
        0.0,
        5.0,
        6.0,
        7.0,
        8.0,
        9.0,
        10.0,
        0.0,  # rows' last slots 0
    ]


def test_a_capable_backend_gets_the_reference_and_step_timing_reaches_update_metrics(forwarder, monkeypatch):
    monkeypatch.setattr(_RecordingBackend, "accepts_batch_refs", True)
    batch_ref = BatchRef.describe(_batch(), ref="never fetched")
    asyncio.run(forwarder.compute_log_prob(batch_ref))
    metrics = tu.get(asyncio.run(forwarder.update_actor(BatchRef.describe(_batch(), ref="never fetched"))), "metrics")
    assert all(isinstance(seen, BatchRef) for seen in _seen())
    from verl.utils.metric import reduce_metrics

    reduced = reduce_metrics(dict(metrics))
    assert reduced["remote/compute_s"] == pytest.approx(2 * COMPUTE_S)
    assert reduced["remote/call_s"] >= 0 and OmegaConf.select(forwarder.config, "rollout.n") == 1


# ---------------------------------------------------------------- local engine -> client outputs
def test_local_engine_outputs_travel_as_numpy_and_come_back_as_private_tensors():
    import numpy as np

    from verl.remote_backend.results import BackendDevice, LogProbResult
    from verl.workers.remote_client.local.transport import LogProbWire

    result = LogProbResult(torch.arange(4.0), torch.ones(4), device=BackendDevice("cpu"), compute_s=0.5)
    wire = LogProbWire.of(result)
    assert isinstance(wire.log_probs, np.ndarray) and isinstance(wire.entropy, np.ndarray)
    wire.log_probs.setflags(write=False)  # what Ray hands over: a read-only view of the object store
    back = wire.to_result()
    assert torch.equal(back.log_probs, torch.arange(4.0)) and torch.equal(back.entropy, torch.ones(4))
    assert back.device == BackendDevice("cpu") and back.compute_s == 0.5
    back.log_probs[0] = 7.0  # a private, writable copy
    assert wire.log_probs[0] == 0.0


def test_bfloat16_outputs_stay_tensors_on_the_wire():
    from verl.remote_backend.results import LogProbResult
    from verl.workers.remote_client.local.transport import LogProbWire

    values = torch.arange(4.0, dtype=torch.bfloat16)
    wire = LogProbWire.of(LogProbResult(values))
    assert isinstance(wire.log_probs, torch.Tensor)
    assert torch.equal(wire.to_result().log_probs, values)
