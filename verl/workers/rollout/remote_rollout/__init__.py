"""Rollout replica and server that forward verl's ``generate`` calls to a ``RemoteBackend``.

Importing this package registers rollout name ``remote`` in verl's
``RolloutReplicaRegistry`` of the current process (an unbound replica that
explains how to bind it); :class:`~verl.remote_backend.trainer.RemoteBackendTrainer`
re-registers it bound to its backend before verl builds the AgentLoopManager.
"""

from verl.remote_backend.launch.rules import REMOTE_ROLLOUT_NAME
from verl.workers.rollout.replica import RolloutReplicaRegistry


def _load_unbound_replica():
    from verl.workers.rollout.remote_rollout.replica import RemoteRolloutReplica

    return RemoteRolloutReplica


RolloutReplicaRegistry.register(REMOTE_ROLLOUT_NAME, _load_unbound_replica)

__all__ = ["REMOTE_ROLLOUT_NAME"]
