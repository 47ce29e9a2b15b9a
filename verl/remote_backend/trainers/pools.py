"""The forwarders' place in verl's resource pools: CPU-only bundles and the actor role they take.

Both verl trainers the remote path runs on (``RayPPOTrainer`` and verl 0.9.1's V1 trainer) build
their worker groups from a ``ResourcePoolManager`` and a role -> worker-class mapping; the
remote path keeps both and changes what they ask Ray for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl.single_controller.ray import RayResourcePool, ResourcePoolManager
from verl.trainer.ppo.utils import Role, need_reference_policy

__all__ = ["CPUResourcePoolManager", "forwarder_role", "ACTOR_ROLES"]

#: The actor roles verl's new worker path gives the actor(+ref) worker, i.e. the forwarder.
ACTOR_ROLES = (Role.ActorRollout, Role.ActorRolloutRef)


@dataclass
class CPUResourcePoolManager(ResourcePoolManager):
    """verl's pool manager with CPU-only bundles (one logical CPU per forwarder, no GPU).

    verl's own manager hard-codes ``use_gpu=True`` and checks GPU counts;
    forwarders compute nothing, so asking for accelerators would only make
    Ray wait for devices the backend is using (or that do not exist).
    """

    def create_resource_pool(self) -> None:
        for pool_name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[pool_name] = RayResourcePool(
                process_on_nodes=process_on_nodes, use_gpu=False, max_colocate_count=1, name_prefix=pool_name
            )

    def get_n_gpus(self) -> int:
        """Number of forwarders (>= 1): the divisor of verl's per-device throughput metrics."""
        return max(1, super().get_n_gpus())

    @classmethod
    def from_manager(cls, manager: ResourcePoolManager) -> "CPUResourcePoolManager":
        if isinstance(manager, cls):
            return manager
        return cls(resource_pool_spec=dict(manager.resource_pool_spec), mapping=dict(manager.mapping))


def forwarder_role(config: Any) -> Role:
    """The actor role verl's new worker path uses: with a fused reference policy or without."""
    return Role.ActorRolloutRef if need_reference_policy(config) else Role.ActorRollout
