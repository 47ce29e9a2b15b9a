"""The entry point with ``trainer.remote_backend=null`` is verl's own ``main_ppo``:
same composed config (plus our declared keys) and verl's ``RayPPOTrainer``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf
from support.remote_e2e import REMOTE_BASE_OVERRIDES, REPO_ROOT, compose

OUR_KEYS_NOTE = "trainer.remote_backend and remote_backend.* are the only additions"


def _verl_config():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        return hydra_compose("ppo_trainer")


def _strip_ours(container: dict) -> dict:
    container = dict(container)
    container["trainer"] = {k: v for k, v in container["trainer"].items() if k != "remote_backend"}
    container.pop("remote_backend")
    return container


def test_composed_config_is_verls_plus_our_declared_keys():
    ours = OmegaConf.to_container(compose([]))
    assert ours["trainer"]["remote_backend"] is None
    assert set(ours["remote_backend"]) >= {"local", "arctic"}
    assert _strip_ours(ours) == OmegaConf.to_container(_verl_config()), OUR_KEYS_NOTE


def test_our_keys_need_no_plus_and_struct_mode_still_rejects_typos():
    cfg = compose(["trainer.remote_backend=local", "remote_backend.local.seed=3"])
    assert cfg.trainer.remote_backend == "local" and cfg.remote_backend.local.seed == 3
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose(["trainer.remote_backendd=local"])


@pytest.mark.timeout(300)
def test_cli_prints_the_same_job_config_as_verls_main_ppo():
    def job_config(module: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-m", module, "--cfg", "job", "data.train_batch_size=7"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=240,
            check=True,
        ).stdout
        return yaml.safe_load(out)

    ours = job_config("verl.remote_backend.main_ppo")
    verls = job_config("verl.trainer.main_ppo")
    assert ours["trainer"]["remote_backend"] is None
    assert _strip_ours(ours) == verls, OUR_KEYS_NOTE


def test_null_backend_runs_verls_run_ppo_with_verls_task_runner_and_trainer(monkeypatch):
    import verl.trainer.main_ppo as verl_main_ppo
    from verl.remote_backend.main_ppo import run
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    calls = []
    monkeypatch.setattr(
        verl_main_ppo, "run_ppo", lambda config, task_runner_class=None: calls.append(task_runner_class)
    )
    run(compose([]))
    assert calls == [None], "with remote_backend=null verl's default TaskRunner must be used"
    # verl's TaskRunner.run builds this class
    assert verl_main_ppo.RayPPOTrainer is RayPPOTrainer


def test_a_named_backend_runs_verls_run_ppo_with_our_task_runner(monkeypatch, tiny_model_dir):
    import verl.trainer.main_ppo as verl_main_ppo
    from verl.remote_backend.main_ppo import run
    from verl.remote_backend.trainer import RemoteBackendTrainer
    from verl.remote_backend.trainers.ray_ppo_runner import RemoteBackendTaskRunner, substitute_trainer_class
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    calls = []
    monkeypatch.setattr(
        verl_main_ppo, "run_ppo", lambda config, task_runner_class=None: calls.append((config, task_runner_class))
    )
    overrides = [*REMOTE_BASE_OVERRIDES, f"actor_rollout_ref.model.path={tiny_model_dir}"]
    run(compose(overrides))
    ((config, runner_cls),) = calls
    assert runner_cls.actor_class.__ray_actor_class__ is RemoteBackendTaskRunner  # via the Ctrl-C launcher
    assert config.ray_kwargs.ray_init.num_cpus >= 2  # filled in: runner + forwarder + backend headroom
    with substitute_trainer_class(RemoteBackendTrainer):
        assert verl_main_ppo.RayPPOTrainer is RemoteBackendTrainer
    assert verl_main_ppo.RayPPOTrainer is RayPPOTrainer
    assert issubclass(RemoteBackendTrainer, RayPPOTrainer)
