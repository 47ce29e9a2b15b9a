"""The seed contract's API surface that adapters written for it import: the registry in ``base``,
``register_worker`` / ``get_worker``, ``worker_utils``, a backend's own worker made runnable by
stock verl, generate's per-prompt result list, and an open ``remote_backend`` block."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict

from verl.remote_backend import RemoteBackendRegistry
from verl.remote_backend.errors import BackendImportError, BackendOutputError, ConfigError
from verl.remote_backend.forwarder.backend_worker import backend_worker_class
from verl.remote_backend.launch.backend_keys import check_no_stray_backend_keys, open_third_party_keys
from verl.remote_backend.results import GenerateResult, as_generate_result
from verl.remote_backend.worker_utils import (
    make_njt,
    normalize_backend_metrics,
    shift_nested_response_aligned_to_predict_next,
)

pytestmark = pytest.mark.every_verl  # CI runs it on both releases (.ci/run)


# ---------------------------------------------------------------- registry
def test_registry_is_importable_from_base_as_the_seed_contract_puts_it():
    from verl.remote_backend.base import RemoteBackendRegistry as from_base

    assert from_base is RemoteBackendRegistry
    with pytest.raises(AttributeError):
        from verl.remote_backend import base

        base.NoSuchThing  # noqa: B018


class _WorkerA:
    pass


def test_register_worker_takes_a_class_or_a_lazy_loader_and_get_worker_returns_the_class():
    calls = []

    def loader():
        calls.append(1)
        return _WorkerA

    try:
        assert RemoteBackendRegistry.get_worker("vrb-seed-w1") is None  # no worker: the generic forwarder
        RemoteBackendRegistry.register_worker("vrb-seed-w1", loader)
        assert calls == []  # registering imports nothing
        assert RemoteBackendRegistry.get_worker("vrb-seed-w1") is _WorkerA
        assert RemoteBackendRegistry.get_worker("vrb-seed-w1") is _WorkerA
        assert calls == [1]  # the loader runs once
        RemoteBackendRegistry.register_worker("vrb-seed-w2", _WorkerA)
        assert RemoteBackendRegistry.get_worker("vrb-seed-w2") is _WorkerA
    finally:
        RemoteBackendRegistry.unregister("vrb-seed-w1")
        RemoteBackendRegistry.unregister("vrb-seed-w2")
    assert RemoteBackendRegistry.get_worker("vrb-seed-w1") is None


def test_a_worker_loader_that_fails_to_import_names_the_backend_and_one_returning_no_class_is_refused():
    def broken():
        import vrb_no_such_module  # noqa: F401

    try:
        RemoteBackendRegistry.register_worker("vrb-seed-broken", broken)
        with pytest.raises(BackendImportError, match="vrb-seed-broken.*vrb_no_such_module"):
            RemoteBackendRegistry.get_worker("vrb-seed-broken")
        RemoteBackendRegistry.register_worker("vrb-seed-broken", lambda: "not a class")
        with pytest.raises(TypeError, match="not a class"):
            RemoteBackendRegistry.get_worker("vrb-seed-broken")
    finally:
        RemoteBackendRegistry.unregister("vrb-seed-broken")
    with pytest.raises(TypeError):
        RemoteBackendRegistry.register_worker("vrb-seed-broken", 42)


# ---------------------------------------------------------------- a backend's own worker on stock verl
def _plugin_style_worker():
    """A worker written like Snowflake's: async methods under verl's DistProfiler.annotate + register."""
    from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch, register
    from verl.utils.profiler import DistProfiler

    class PluginWorker:
        def __init__(self, config, role, **kwargs):
            self.config, self.role = config, role
            self.main_config, self.handle = kwargs["main_config"], kwargs["backend_handle"]

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        @DistProfiler.annotate(color="blue", role="actor_compute_log_prob")
        async def compute_log_prob(self, x):
            await asyncio.sleep(0)
            return x * 2

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        async def already_async(self):
            return "a"

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def plain(self):
            return "p"

    return PluginWorker, MAGIC_ATTR


def test_a_backends_own_worker_gets_its_init_kwargs_and_its_hidden_async_methods_are_awaitable_again():
    worker_cls, magic = _plugin_style_worker()
    # what stock verl 0.7.1 sees: the annotate wrapper hides the coroutine function
    assert not inspect.iscoroutinefunction(worker_cls.compute_log_prob)
    bound = backend_worker_class(worker_cls, main_config={"m": 1}, backend_handle={"h": 2})
    assert bound.__name__ == "PluginWorker" and issubclass(bound, worker_cls)
    assert inspect.iscoroutinefunction(bound.compute_log_prob)
    assert getattr(bound.compute_log_prob, magic) == getattr(worker_cls.compute_log_prob, magic)
    assert bound.already_async is worker_cls.already_async and bound.plain is worker_cls.plain
    worker = bound(config="actor-cfg", role="actor_rollout")
    assert (worker.config, worker.role, worker.main_config, worker.handle) == (
        "actor-cfg",
        "actor_rollout",
        {"m": 1},
        {"h": 2},
    )
    assert asyncio.run(worker.compute_log_prob(21)) == 42


# ---------------------------------------------------------------- worker_utils
def _batch(prompt_lens, response_lens, width_p=4, width_r=3):
    b = len(prompt_lens)
    mask = torch.zeros(b, width_p + width_r, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        mask[i, width_p - p : width_p + r] = 1
    lengths = mask.sum(-1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    ids = torch.nested.nested_tensor_from_jagged(torch.arange(int(lengths.sum())), offsets)
    return TensorDict({"input_ids": ids, "attention_mask": mask}, batch_size=[b]), mask


def test_make_njt_packs_each_rows_attention_mask_run_in_input_ids_order():
    data, mask = _batch([2, 4], [3, 1])
    dense = torch.arange(14, dtype=torch.float32).reshape(2, 7) + 100
    njt = make_njt(data, dense)
    assert torch.equal(njt.offsets(), data["input_ids"].offsets())
    assert njt.values().tolist() == dense[mask.bool()].tolist()  # [2+3] then [4+1] real columns
    with pytest.raises(ValueError, match="does not match attention_mask"):
        make_njt(data, dense[:, :-1])
    holey = data.clone()
    holey["attention_mask"] = mask.clone()
    holey["attention_mask"][0, 3] = 0  # two runs in row 0
    with pytest.raises(ValueError, match="one run of ones"):
        make_njt(holey, dense)


def test_shift_moves_each_row_one_slot_left_and_zeroes_its_last_slot_without_crossing_rows():
    offsets = torch.tensor([0, 3, 5])
    njt = torch.nested.nested_tensor_from_jagged(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), offsets)
    shifted = shift_nested_response_aligned_to_predict_next(njt)
    assert shifted.values().tolist() == [2.0, 3.0, 0.0, 5.0, 0.0]
    assert torch.equal(shifted.offsets(), offsets)


def test_normalize_backend_metrics_gives_verl_metrics_aggregated_by_name():
    from verl.utils.metric.utils import Metric

    out = normalize_backend_metrics({"actor/pg_loss": [1.0, 3.0], "grad_norm": torch.tensor(2.0)})
    assert set(out) == {"pg_loss", "grad_norm"} and all(isinstance(m, Metric) for m in out.values())
    assert out["pg_loss"].aggregate() == pytest.approx(2.0) and out["grad_norm"].aggregate() == pytest.approx(2.0)


# ---------------------------------------------------------------- generate's result list
def test_a_one_result_list_from_generate_is_accepted_and_more_results_are_refused():
    with pytest.warns(DeprecationWarning):
        result = as_generate_result([{"text": "x", "token_ids": [5, 6], "finish_reason": "length"}])
    assert result == GenerateResult(token_ids=[5, 6])
    with pytest.raises(BackendOutputError, match="returned 2 results"):
        as_generate_result([{"token_ids": [1]}, {"token_ids": [2]}])
    with pytest.raises(BackendOutputError):
        as_generate_result([])


# ---------------------------------------------------------------- the remote_backend block
def test_third_party_keys_need_no_plus_but_owned_blocks_stay_strict_and_near_typos_are_refused():
    argv = [
        "trainer.remote_backend=arctic",
        "remote_backend.colocate=False",
        "remote_backend.train.deepspeed.zero_optimization.stage=2",
        "remote_backend.arctic.port=8000",
        "remote_backend.timeouts.create=5",
        "+remote_backend.extra=1",
    ]
    assert open_third_party_keys(argv) == [
        "trainer.remote_backend=arctic",
        "++remote_backend.colocate=False",
        "++remote_backend.train.deepspeed.zero_optimization.stage=2",
        "remote_backend.arctic.port=8000",
        "remote_backend.timeouts.create=5",
        "+remote_backend.extra=1",
    ]
    with pytest.raises(ConfigError, match=r"remote_backend\.timeuts.*typo of remote_backend\.timeouts"):
        open_third_party_keys(["remote_backend.timeuts.create=5"])


def test_a_flat_key_with_a_built_in_backend_is_refused_and_with_a_third_party_class_it_is_its_own():
    from omegaconf import OmegaConf

    from verl.workers.remote_client.local.backend import LocalBackend

    config = OmegaConf.create({"remote_backend": {"local": {}, "timeouts": {}, "colocate": False}})
    with pytest.raises(ConfigError, match=r"remote_backend\.colocate.*remote_backend\.local\.colocate"):
        check_no_stray_backend_keys(config, "local", LocalBackend)

    class PluginLocal(LocalBackend):  # a plugin's class registered under a built-in name
        pass

    check_no_stray_backend_keys(config, "local", PluginLocal)
    check_no_stray_backend_keys(OmegaConf.create({"remote_backend": {"local": {}}}), "local", LocalBackend)


@pytest.mark.integration
def test_a_command_line_searchpath_keeps_verl_configs_and_merges_a_plugins_yaml_flat(tmp_path):
    group = tmp_path / "remote_backend"
    group.mkdir()
    (group / "vendor.yaml").write_text("comms:\n  protocol: ray\ncolocate: true\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl.remote_backend.main_ppo",
            "--cfg",
            "job",
            f"hydra.searchpath=[file://{tmp_path}]",
            "remote_backend=vendor",
            "remote_backend.colocate=false",
            "remote_backend.vendor_only_key=7",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    from omegaconf import OmegaConf

    config = OmegaConf.create(proc.stdout)
    assert config.actor_rollout_ref.actor.ppo_epochs == 1  # verl's ppo_trainer is still composed
    block = config.remote_backend
    assert (block.comms.protocol, block.colocate, block.vendor_only_key) == ("ray", False, 7)
    assert "timeouts" in block and "local" in block  # ours are still there
