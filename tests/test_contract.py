"""The RemoteBackend contract: nine abstract methods, nothing silently inherited."""

from __future__ import annotations

import pytest

from verl.remote_backend import BackendDevice, RemoteBackend, supports_resume

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


class _Complete(RemoteBackend):
    @classmethod
    def from_config(cls, main_config, *, handle=None):
        return cls()

    def reconnect_handle(self):
        return {}

    def destroy(self):
        return None

    async def compute_log_prob(self, data, *, ref, calculate_entropy, rollout_n, temperature, pad_token_id):
        return {"model_output": {}, "metrics": {}}

    async def update_actor(self, data, *, actor_config, pad_token_id, rollout_n, temperature):
        return {"loss": 0.0, "metrics": {}, "global_token_num": []}

    async def generate(self, prompt_ids, sampling_params):
        return {"token_ids": [], "log_probs": None, "stop_reason": "completed"}

    async def update_weights(self):
        return None

    async def save_checkpoint(self, path=None, step=None):
        return None

    def requires_single_forwarder(self):
        return True


def test_contract_declares_exactly_the_nine_methods_as_abstract():
    assert RemoteBackend.__abstractmethods__ == frozenset(CONTRACT)


@pytest.mark.parametrize("missing", CONTRACT)
def test_subclass_missing_any_one_method_cannot_be_instantiated(missing):
    namespace = {name: getattr(_Complete, name) for name in CONTRACT if name != missing}
    # from_config is a classmethod: re-wrap the underlying function
    if "from_config" in namespace:
        namespace["from_config"] = classmethod(_Complete.__dict__["from_config"].__func__)
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
    with pytest.raises(ValueError, match="unknown keys"):
        BackendDevice.from_dict({"type": "cuda", "gpus": 8})
