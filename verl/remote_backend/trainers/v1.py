"""``RemoteBackendTrainerV1``: verl 0.9.1's V1 ``PPOTrainerSync`` with the compute in a remote backend.

verl 0.9.1's V1 trainer (``trainer.use_v1=true``, ``trainer.v1.trainer_mode=sync``) builds its
own worker classes and pools in ``_setup``; this subclass changes only what differs on the remote
path, through the trainer's own hooks:

* ``_setup``: the backend is created first (the rollout servers and, for a backend with its own
  worker class, the forwarders need its handle while ``_setup`` builds them);
* ``_init_resource_pool_mgr``: the actor(+ref) role is the CPU forwarder, the pools CPU-only;
* ``_load_checkpoint`` (the last step of ``_setup``): the forwarders attach before it, because a
  resume loads the backend's checkpoint through them;
* ``on_init_end`` / ``on_step_end``: after verl's weight sync, the rollout servers learn the
  weight version (``set_global_steps``), which V1 tags every trajectory with;
* ``_update_actor``: the step's ``perf/remote/*`` metrics.

Batches reach the forwarders through TransferQueue (verl's ``tqbridge``) and are converted to the
dense layout backends read there (``forwarder/v1_layout.py``). Importing this module needs verl
0.9.1 and TransferQueue.
"""

from __future__ import annotations

from typing import Any

import ray

from verl.remote_backend.trainers.pools import ACTOR_ROLES, CPUResourcePoolManager
from verl.remote_backend.trainers.shared import RemoteBackendTrainerMixin
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

__all__ = ["RemoteBackendTrainerV1"]


class RemoteBackendTrainerV1(RemoteBackendTrainerMixin, PPOTrainerSync):
    """PPO/GRPO on verl 0.9.1's synchronous V1 trainer, with actor, reference and sampler in a
    ``RemoteBackend``. Takes ``PPOTrainerSync``'s argument (the whole config); verl's
    ``TaskRunnerV1`` builds it when it stands registered as the ``sync`` trainer
    (:func:`~verl.remote_backend.trainers.v1_runner.substitute_sync_trainer`).

    Attributes:
        plan: the validated :class:`~verl.remote_backend.launch.validation.RemoteRunPlan`.
        backend: the driver's backend instance (``None`` before ``init()`` and after teardown).
    """

    def __init__(self, config: Any) -> None:
        self._init_remote_state(config)
        super().__init__(config)

    def _setup(self) -> None:
        """Create the backend, then verl's set-up (workers, replicas, checkpoint engine, resume);
        any failure destroys the backend before it propagates."""
        try:
            self._create_backend()
            super()._setup()
        except BaseException:
            self.destroy_backend()
            raise

    def _init_resource_pool_mgr(self) -> None:
        """verl's roles and pool spec, with the forwarder as the actor(+ref) worker on CPU-only pools."""
        super()._init_resource_pool_mgr()
        for role in ACTOR_ROLES:
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = self._forwarder_worker()
        self.resource_pool_manager = CPUResourcePoolManager.from_manager(self.resource_pool_manager)

    def _load_checkpoint(self) -> None:
        """Attach the forwarders to the backend, then verl's resume (which loads through them)."""
        self._attach_forwarders()
        super()._load_checkpoint()

    def on_init_end(self) -> None:
        super().on_init_end()
        self._announce_weight_version()

    def on_step_end(self) -> None:
        super().on_step_end()
        self._announce_weight_version()

    def _announce_weight_version(self) -> None:
        """Tell every rollout server the step of the weights just synced (verl's own rollouts learn
        it from their weight update, which the naive sync never sends them)."""
        ray.get([server.set_global_steps.remote(int(self.global_steps)) for server in self._rollout_servers()])

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        """verl's update; the step's ``perf/remote/*`` metrics join the step's ``metrics``."""
        from verl.remote_backend.forwarder.step_timing import remote_overhead_metrics

        batch = self._timed(super()._update_actor, batch, metrics)
        metrics.update(remote_overhead_metrics(metrics, self._take_forwarded_wall_s()))
        return batch
