"""``RolloutReplica`` whose server forwards generation to a remote backend.

verl's ``AgentLoopManager`` builds rollout replicas by looking up ``rollout.name`` in its
per-process ``RolloutReplicaRegistry``; this module provides the replica for ``remote``, so
verl's agent loop samples through the trainer's backend instead of starting its own engine.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional
from uuid import uuid4

import ray
from omegaconf import DictConfig

from verl.workers.rollout.remote_rollout.server import RemoteRolloutServer
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry

__all__ = ["RemoteRolloutReplica", "register_remote_replica"]


class RemoteRolloutReplica(RolloutReplica):
    """A rollout replica served by a remote backend (rollout name ``remote``).

    verl constructs replicas with no backend argument, so the main config and the backend's
    ``reconnect_handle()`` travel as class attributes: use :meth:`bind` (or
    :func:`register_remote_replica`) to attach them; the unbound class refuses to launch.
    The bound class stays in the process that registered it; only the server actor's
    constructor arguments go to Ray.
    """

    main_config: ClassVar[Optional[DictConfig]] = None
    backend_handle: ClassVar[Optional[dict[str, Any]]] = None

    @classmethod
    def bind(cls, main_config: DictConfig, handle: dict[str, Any]) -> type["RemoteRolloutReplica"]:
        """A subclass whose servers re-attach to the backend behind ``handle``."""
        return type(cls.__name__, (cls,), {"main_config": main_config, "backend_handle": handle})

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        """Start this replica's one server actor and wait until it has re-attached.

        The actor asks Ray for no CPU or GPU: it only awaits the backend, which owns the
        sampling hardware."""
        if self.main_config is None or self.backend_handle is None:
            raise RuntimeError(
                "RemoteRolloutReplica is not bound to a backend. Run through RemoteBackendTrainer "
                "(python -m verl.remote_backend.main_ppo trainer.remote_backend=<name>), or call "
                "register_remote_replica(name, main_config, handle) where the AgentLoopManager is built."
            )
        name = f"remote_rollout_server_{self.replica_rank}_{uuid4().hex[:8]}"
        server = (
            ray.remote(RemoteRolloutServer)
            .options(name=name, num_cpus=0, num_gpus=0, max_concurrency=self.max_concurrency)
            .remote(self.main_config, self.backend_handle, self.replica_rank)
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        # Unique per replica: verl's load balancer keys servers by this string.
        self._server_address = name


def register_remote_replica(name: str, main_config: DictConfig, handle: dict[str, Any]) -> None:
    """Register (in this process) rollout name ``name`` as a replica bound to ``handle``."""
    bound = RemoteRolloutReplica.bind(main_config, handle)
    RolloutReplicaRegistry.register(name, lambda: bound)
