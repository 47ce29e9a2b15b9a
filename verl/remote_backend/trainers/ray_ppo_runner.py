"""verl's legacy ``TaskRunner`` with the remote-backend trainer, forwarders and CPU pools.

verl's ``TaskRunner.run`` (the Ray actor that builds datasets, tokenizer and trainer) creates
``RayPPOTrainer`` by its module-global name and offers no hook for another class. Rather than
copy ``run``, this subclass overrides the ``add_*``/``init_*`` hooks it does offer and points
that global at :class:`RemoteBackendTrainer` while ``run`` lasts; the runner is a Ray actor
process of its own, so nothing else sees the substitution. Which module holds that runner
differs between verl releases (``verl_versions``); verl 0.9.1's V1 trainer has its own runner
(:mod:`~verl.remote_backend.trainers.v1_runner`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import ray

from verl.remote_backend.launch.cpu_compat import install_flash_attn_fallback
from verl.remote_backend.launch.interrupts import InterruptibleRunner
from verl.remote_backend.trainers.pools import CPUResourcePoolManager, forwarder_role
from verl.remote_backend.trainers.ray_ppo import RemoteBackendTrainer
from verl.remote_backend.verl_versions import verl_glue

_glue = verl_glue()

__all__ = ["RemoteBackendTaskRunner", "substitute_trainer_class"]


@contextlib.contextmanager
def substitute_trainer_class(trainer_cls: type) -> Iterator[None]:
    """Make verl's ``TaskRunner.run`` build ``trainer_cls`` while inside."""
    import importlib

    runner_module = importlib.import_module(_glue.TASK_RUNNER_MODULE)
    original = runner_module.RayPPOTrainer
    runner_module.RayPPOTrainer = trainer_cls
    try:
        yield
    finally:
        runner_module.RayPPOTrainer = original


class RemoteBackendTaskRunner(InterruptibleRunner, _glue.task_runner_class()):
    """Runs verl's ``TaskRunner.run`` with remote-backend pieces in place of verl's workers."""

    def add_actor_rollout_worker(self, config: Any):
        """The actor(+ref) role is the CPU forwarder; no verl engine worker is imported."""
        from verl.remote_backend.forwarder.worker import RemoteBackendWorker
        from verl.single_controller.ray import RayWorkerGroup

        role = forwarder_role(config)
        self.role_worker_mapping[role] = ray.remote(RemoteBackendWorker)
        self.mapping[role] = "global_pool"
        return RemoteBackendWorker, RayWorkerGroup

    def add_critic_worker(self, config: Any) -> None:
        """Nothing: remote backends have no critic (validation rejects configs that need one)."""

    def init_resource_pool_mgr(self, config: Any) -> CPUResourcePoolManager:
        """verl's pool spec, served by CPU-only placement groups."""
        return CPUResourcePoolManager.from_manager(super().init_resource_pool_mgr(config))

    def run(self, config: Any) -> None:
        """verl's ``TaskRunner.run``; a SIGINT ends it with :class:`RunInterruptedError` after teardown."""
        install_flash_attn_fallback()
        with substitute_trainer_class(RemoteBackendTrainer):
            self.run_interruptibly(lambda: super(RemoteBackendTaskRunner, self).run(config))
