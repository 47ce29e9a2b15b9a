"""Entry point: ``python -m verl.remote_backend.main_ppo [hydra overrides]``.

Composes verl's own ``ppo_trainer`` config plus this project's keys
(``config/remote_ppo_trainer.yaml``) and then:

* ``trainer.remote_backend=null`` (default): calls verl's ``run_ppo(config)`` -
  verl's TaskRunner and ``RayPPOTrainer``, exactly as
  ``python -m verl.trainer.main_ppo`` would;
* ``trainer.remote_backend=<name>``: validates the config on the driver
  (before Ray starts), gives Ray enough logical CPUs when
  ``ray_kwargs.ray_init.num_cpus`` is null, seeds every rollout sample from
  its identity (``remote_rollout/seeding.py``) and calls verl's ``run_ppo`` with
  :class:`~verl.remote_backend.task_runner.RemoteBackendTaskRunner`.

``main()`` is the hydra-decorated console entry; :func:`run` takes an already
composed config (tests, notebooks, other launchers).
"""

from __future__ import annotations

import os
from typing import Any

import hydra

from verl.remote_backend.validation import required_ray_cpus, validate_remote_backend_config

__all__ = ["main", "run"]

# Logical CPUs added on top of what runner + forwarders reserve, for the backend's own
# actors (e.g. the local engine asks for remote_backend.local.num_cpus).
_BACKEND_CPU_HEADROOM = 4


def _ensure_ray_cpus(config: Any) -> None:
    """Fill a null ``ray_kwargs.ray_init.num_cpus`` with enough *logical* CPUs.

    Ray's CPU count is logical; a small machine (2 cores) would otherwise make
    the forwarder pool's placement group wait forever next to the task runner
    and the backend's actors.
    """
    ray_init = config.ray_kwargs.ray_init
    if ray_init.get("num_cpus") is None:
        ray_init.num_cpus = max(os.cpu_count() or 1, required_ray_cpus(config) + _BACKEND_CPU_HEADROOM)
        print(f"[remote_backend] ray_kwargs.ray_init.num_cpus=null -> {ray_init.num_cpus} logical CPUs")


def _seed_each_sample(config: Any) -> None:
    """Give every rollout sample its own random stream (see ``remote_rollout/seeding.py``), unless the
    user set an agent-loop manager of their own."""
    from omegaconf import open_dict

    from verl.workers.rollout.remote_rollout.seeding import MANAGER_FQN

    agent = config.actor_rollout_ref.rollout.agent
    if agent.get("agent_loop_manager_class") is None:
        with open_dict(agent):
            agent.agent_loop_manager_class = MANAGER_FQN


def run(config: Any) -> None:
    """Run PPO/GRPO for a composed config (see module docstring)."""
    import ray

    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    config = migrate_legacy_reward_impl(config)
    plan = validate_remote_backend_config(config)
    if plan is None:
        run_ppo(config)
        return

    from verl.remote_backend.task_runner import RemoteBackendTaskRunner

    _ensure_ray_cpus(config)
    _seed_each_sample(config)
    print(
        f"[remote_backend] backend={plan.name} forwarders={plan.num_forwarders} replicas={plan.num_replicas} "
        f"resume_from={plan.resume_from}"
    )
    run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(RemoteBackendTaskRunner))


@hydra.main(config_path="config", config_name="remote_ppo_trainer", version_base=None)
def main(config: Any) -> None:
    """Hydra entry point (``python -m verl.remote_backend.main_ppo``)."""
    run(config)


if __name__ == "__main__":
    main()
