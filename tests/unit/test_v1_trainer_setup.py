"""verl 0.9.1's V1 trainer as the remote path's default: which runner, agent loop and Ray budget a
config gets, what is refused before Ray starts, and the per-sample seeds of a GRPO group.

No Ray cluster: the composed config, the glue and verl's own agent-loop classes (their sampling
call replaced by a recorder) are enough. The trainer run itself is tests/e2e/test_e2e_grpo_v1.py.
"""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
from omegaconf import OmegaConf
from support.remote_e2e import LEGACY_TRAINER_ON_091, REMOTE_BASE_OVERRIDES, compose

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.launch.derive import derive_remote_settings, explicit_override_keys
from verl.remote_backend.launch.validation import required_ray_cpus, validate_remote_backend_config
from verl.remote_backend.verl_versions import installed_verl_version

pytestmark = [
    pytest.mark.every_verl,
    pytest.mark.skipif(installed_verl_version() != "0.9.1", reason="verl 0.9.1's V1 trainer"),
]

STORAGE_UNITS = "transfer_queue.backend.SimpleStorage.num_data_storage_units"


@pytest.fixture
def line(tiny_model_dir) -> list[str]:
    return [*REMOTE_BASE_OVERRIDES, f"actor_rollout_ref.model.path={tiny_model_dir}"]


def _derived(overrides: list[str]):
    config = compose(overrides)
    derive_remote_settings(config, explicit_override_keys(overrides))
    return config


def test_the_v1_trainer_is_the_default_with_one_transfer_queue_storage_unit(line):
    from verl.remote_backend.main_ppo import _remote_task_runner, _seed_each_sample
    from verl.remote_backend.trainers.v1_runner import RemoteBackendTaskRunnerV1
    from verl.workers.rollout.remote_rollout.seeding import MANAGER_TQ_FQN

    config = _derived(line)
    assert config.trainer.use_v1 is True and config.trainer.v1.trainer_mode == "sync"
    assert OmegaConf.select(config, STORAGE_UNITS) == 1  # verl's default is 8
    # runner 1 + forwarder 1 + TransferQueue's controller 1 and storage unit 1
    assert required_ray_cpus(config) == 4
    assert _remote_task_runner(config) is RemoteBackendTaskRunnerV1
    _seed_each_sample(config)
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == MANAGER_TQ_FQN
    validate_remote_backend_config(config, scan_files=False)


def test_the_users_storage_units_are_kept_and_counted(line):
    config = _derived([*line, f"{STORAGE_UNITS}=3"])
    assert OmegaConf.select(config, STORAGE_UNITS) == 3 and required_ray_cpus(config) == 6
    with pytest.raises(ConfigError, match=r"^ray_kwargs.ray_init.num_cpus=5: .*TransferQueue.*at least 7"):
        validate_remote_backend_config(_derived([*line, f"{STORAGE_UNITS}=3", "ray_kwargs.ray_init.num_cpus=5"]))


def test_use_v1_false_keeps_the_legacy_trainer_on_0_9_1(line):
    from verl.remote_backend.main_ppo import _remote_task_runner, _seed_each_sample
    from verl.remote_backend.trainers.ray_ppo_runner import RemoteBackendTaskRunner
    from verl.workers.rollout.remote_rollout.seeding import MANAGER_FQN

    config = _derived([*line, LEGACY_TRAINER_ON_091])
    assert OmegaConf.select(config, STORAGE_UNITS) == 8  # untouched: no TransferQueue on this path
    assert required_ray_cpus(config) == 2
    assert _remote_task_runner(config) is RemoteBackendTaskRunner
    _seed_each_sample(config)
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == MANAGER_FQN


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_the_asynchronous_v1_modes_are_refused_before_ray_starts(line, mode):
    overrides = [o for o in line if not o.startswith("trainer.v1.trainer_mode=")] + [f"trainer.v1.trainer_mode={mode}"]
    with pytest.raises(ConfigError, match=rf"^trainer.v1.trainer_mode='{mode}' was set explicitly.*asynchronous"):
        _derived(overrides)
    config = compose(overrides)  # a config that skipped the switch: validation names the key and the fix
    derive_remote_settings(config, explicit=None)
    OmegaConf.update(config, "trainer.v1.trainer_mode", mode)
    fix = "Fix: set trainer.v1.trainer_mode=sync"
    with pytest.raises(ConfigError, match=rf"^trainer.v1.trainer_mode='{mode}': .*{fix}"):
        validate_remote_backend_config(config, scan_files=False)


def _without_transfer_queue(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transfer_queue" else real(name, *a)
    )


def test_without_transfer_queue_a_run_goes_to_the_legacy_trainer_and_says_why(line, monkeypatch):
    from verl.remote_backend.main_ppo import _remote_task_runner
    from verl.remote_backend.trainers.ray_ppo_runner import RemoteBackendTaskRunner

    _without_transfer_queue(monkeypatch)
    config = compose(line)
    changes = derive_remote_settings(config, explicit_override_keys(line))
    (fallback,) = [c for c in changes if c.key == "trainer.use_v1"]
    assert (fallback.before, fallback.after) == (True, False)
    assert "TransferQueue, which is not installed" in fallback.reason and "verl[verl-core]" in fallback.reason
    assert STORAGE_UNITS not in {c.key for c in changes}  # no TransferQueue actors on the legacy trainer
    validate_remote_backend_config(config, scan_files=False)
    assert _remote_task_runner(config) is RemoteBackendTaskRunner


def test_an_explicit_v1_trainer_without_transfer_queue_is_refused_with_the_install_command(line, monkeypatch):
    _without_transfer_queue(monkeypatch)
    install = r"pip install 'TransferQueue==0\.1\.11'"
    with pytest.raises(ConfigError, match=rf"^trainer.use_v1=True: .*TransferQueue.*{install}"):
        validate_remote_backend_config(_derived([*line, "trainer.use_v1=true"]), scan_files=False)


# ---------------------------------------------------------------- seeds of a GRPO group
def _seeds_sent(worker_cls, monkeypatch, calls: list[tuple[dict, dict]]) -> list[int]:
    """The ``seed`` each call of ``worker_cls._run_agent_loop`` hands to verl's agent loop."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    sent: list[int] = []

    async def record(self, sampling_params, trajectory, **kwargs):
        sent.append(sampling_params["seed"])

    monkeypatch.setattr(AgentLoopWorker, "_run_agent_loop", record)
    worker = object.__new__(worker_cls)  # only the seeding: no Ray, no server
    worker.config = OmegaConf.create({"data": {"seed": 7}})

    async def run() -> None:
        for trajectory, kwargs in calls:
            await worker._run_agent_loop({"temperature": 1.0}, trajectory, agent_name="single_turn_agent", **kwargs)

    asyncio.run(run())
    return sent


def test_the_n_sessions_of_a_v1_group_get_distinct_seeds_the_legacy_loop_gives_too(monkeypatch):
    from verl.workers.rollout.remote_rollout.seeding import SeededAgentLoopWorker
    from verl.workers.rollout.remote_rollout.seeding_tq import seeded_worker_class

    n = 4
    shared = {"step": 3, "sample_index": 11, "rollout_n": 0, "validate": False}  # V1: one record per group
    v1 = _seeds_sent(seeded_worker_class(), monkeypatch, [(shared, {"session_id": i}) for i in range(n)])
    legacy = _seeds_sent(SeededAgentLoopWorker, monkeypatch, [({**shared, "rollout_n": i}, {}) for i in range(n)])
    assert len(set(v1)) == n
    assert v1 == legacy


def test_the_tq_manager_starts_seeded_workers():
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    from verl.workers.rollout.remote_rollout.seeding_tq import SeededAgentLoopManagerTQ

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {}, "model": {}}})
    worker_cls = SeededAgentLoopManagerTQ(config, llm_client=None).agent_loop_workers_class.__ray_actor_class__
    assert issubclass(worker_cls, AgentLoopWorkerTQ.__ray_actor_class__)
    assert "_run_agent_loop" in vars(worker_cls)  # the seeding; that Ray can start it: test_e2e_grpo_v1
