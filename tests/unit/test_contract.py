"""The RemoteBackend contract: nine abstract methods, nothing silently inherited."""

from __future__ import annotations

import inspect

import pytest
from support.stub_backend import StubBackend

from verl.remote_backend import BackendDevice, RemoteBackend, supports_resume

pytestmark = pytest.mark.every_verl  # CI runs it on both releases (.ci/run)

CONTRACT = (
    "from_config",
    "reconnect_handle",
    "destroy",
    "compute_log_prob",
    "update_actor",
    "generate",
    "update_weights",
    "save_checkpoint",
    "requires_single_forwarder",
)


#: the suite's stub with every optional capability back at the contract's "not supported" default
_Complete = StubBackend.variant(
    "_Complete",
    load_checkpoint=RemoteBackend.load_checkpoint,
    health=RemoteBackend.health,
    log_location=RemoteBackend.log_location,
)


def test_contract_declares_exactly_the_nine_methods_as_abstract():
    assert RemoteBackend.__abstractmethods__ == frozenset(CONTRACT)


@pytest.mark.parametrize("missing", CONTRACT)
def test_subclass_missing_any_one_method_cannot_be_instantiated(missing):
    namespace = {name: inspect.getattr_static(_Complete, name) for name in CONTRACT if name != missing}
    partial_cls = type(f"Missing_{missing}", (RemoteBackend,), namespace)
    with pytest.raises(TypeError, match=missing):
        partial_cls()


def test_complete_subclass_can_be_instantiated_and_built_from_config():
    backend = _Complete.from_config({})
    assert isinstance(backend, RemoteBackend)
    assert backend.requires_single_forwarder() is True


def test_resume_is_an_optional_capability_detected_on_async_load_checkpoint():
    class WithResume(_Complete):
        async def load_checkpoint(self, path, step):
            return None

    class WithSyncLoad(_Complete):
        def load_checkpoint(self, path, step):  # not async: not the capability
            return None

    assert not supports_resume(_Complete())
    assert supports_resume(WithResume())
    assert supports_resume(WithResume)
    assert not supports_resume(WithSyncLoad())


def test_backend_device_round_trips_and_rejects_bad_reports():
    device = BackendDevice(type="cuda", count=8, peak_flops=989e12, name="H100")
    assert BackendDevice.from_dict(device.to_dict()) == device
    assert BackendDevice.from_dict({"type": "cpu"}) == BackendDevice(type="cpu", count=1)
    with pytest.raises(ValueError, match="count"):
        BackendDevice.from_dict({"type": "cuda", "count": 0})
    with pytest.raises(ValueError, match="peak_flops"):
        BackendDevice("cuda", peak_flops=float("nan"))
    with pytest.raises(ValueError, match="unknown keys"):
        BackendDevice.from_dict({"type": "cuda", "gpus": 8})


def test_single_forwarder_is_asked_on_the_class_and_a_legacy_instance_method_still_answers():
    from verl.remote_backend.base import requires_single_forwarder

    assert requires_single_forwarder(_Complete) is True

    class Legacy(_Complete):
        def requires_single_forwarder(self):  # the previous contract's form
            return False

    with pytest.warns(DeprecationWarning, match="declare it a @classmethod"):
        assert requires_single_forwarder(Legacy) is False

    class StateDependent(_Complete):
        def requires_single_forwarder(self):
            return self._engine.is_sharded()  # state that exists only after from_config

    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(TypeError, match="declare it a @classmethod returning a constant"),
    ):
        requires_single_forwarder(StateDependent)


def test_destroy_has_one_calling_convention_and_a_legacy_sync_destroy_still_runs():
    import asyncio

    from verl.remote_backend.base import destroy_backend

    calls = []

    class Async(_Complete):
        async def destroy(self):
            calls.append("async")

    class Sync(_Complete):
        def destroy(self):
            calls.append("sync")

    asyncio.run(destroy_backend(Async()))
    with pytest.warns(DeprecationWarning, match="declare it `async def destroy"):
        asyncio.run(destroy_backend(Sync()))
    assert calls == ["async", "sync"]


def test_optional_capabilities_are_declared_on_the_contract_and_detected_when_overridden():
    from verl.remote_backend.base import implements, log_location, supports_health

    class Live(_Complete):
        async def health(self):
            return None

        def log_location(self):
            return "/var/log/engine.log"

        async def sleep(self):
            return None

    assert not supports_health(_Complete()) and supports_health(Live()) and supports_health(Live)
    assert implements(Live(), "sleep") and not implements(Live(), "wake_up") and not implements(_Complete(), "sleep")
    assert log_location(Live()) == "/var/log/engine.log"
    assert log_location(_Complete()) == "not reported (_Complete has no log_location())"
    assert _Complete.checkpoint_problem("/nowhere", 1) is None and _Complete.check_config({}) is None
