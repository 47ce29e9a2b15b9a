"""``RemoteBackendTrainer``: verl's ``RayPPOTrainer`` with the compute in a remote backend.

The trainer of verl 0.7.1, and of verl 0.9.1 with ``trainer.use_v1=false`` (0.9.1's V1 trainer
has its own: :mod:`~verl.remote_backend.trainers.v1`). The algorithm stays verl's. This subclass
reserves CPU-only pools for the forwarders, creates the one backend in ``init_workers`` and
attaches forwarders and rollout replicas to its handle; validation, the timing of the forwarded
calls (``perf/remote/*``), guarded saves and the teardown after ``fit()`` are
:class:`~verl.remote_backend.trainers.shared.RemoteBackendTrainerMixin`'s.
"""

from __future__ import annotations

from typing import Any

from verl.remote_backend.trainers.pools import CPUResourcePoolManager, forwarder_role
from verl.remote_backend.trainers.shared import RemoteBackendTrainerMixin
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.utils import Role

__all__ = ["RemoteBackendTrainer", "CPUResourcePoolManager", "forwarder_role"]


class RemoteBackendTrainer(RemoteBackendTrainerMixin, RayPPOTrainer):
    """PPO/GRPO trainer whose actor, reference and sampler live in a ``RemoteBackend``.

    Takes exactly ``RayPPOTrainer``'s arguments. The actor entry of
    ``role_worker_mapping`` is replaced by the CPU forwarder and the pool
    manager by :class:`CPUResourcePoolManager`, so it also works when built by
    verl's own ``TaskRunner`` code path.

    Attributes:
        plan: the validated :class:`~verl.remote_backend.launch.validation.RemoteRunPlan`.
        backend: the driver's backend instance (``None`` before ``init_workers``
            and after teardown).
    """

    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        role_worker_mapping: dict,
        resource_pool_manager: Any,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        self._init_remote_state(config)
        role_worker_mapping = {
            role: cls
            for role, cls in role_worker_mapping.items()
            if role not in (Role.ActorRollout, Role.ActorRolloutRef, Role.Critic, Role.RefPolicy)
        }
        role_worker_mapping[forwarder_role(config)] = self._forwarder_worker()
        resource_pool_manager = CPUResourcePoolManager.from_manager(resource_pool_manager)
        resource_pool_manager.mapping.setdefault(forwarder_role(config), "global_pool")
        super().__init__(config, tokenizer, role_worker_mapping, resource_pool_manager, *args, **kwargs)

    def init_workers(self) -> None:
        """Create the backend, then verl's workers, replicas and agent loop, wired to it."""
        try:
            self._create_backend()
            self.role_worker_mapping[forwarder_role(self.config)] = self._forwarder_worker()
            super().init_workers()
            self._attach_forwarders()
        except BaseException:
            self.destroy_backend()
            raise

    def _update_actor(self, batch: Any) -> Any:
        """verl's update; the step's ``perf/remote/*`` metrics join the update's metrics."""
        from verl.remote_backend.forwarder.step_timing import remote_overhead_metrics

        output = self._timed(super()._update_actor, batch)
        wall = self._take_forwarded_wall_s()
        metrics = output.meta_info.get("metrics")
        if isinstance(metrics, dict):
            metrics.update(remote_overhead_metrics(metrics, wall))
        return output
