"""The seed contract's module path of the trainer; it lives in
:mod:`verl.remote_backend.trainers.ray_ppo` (verl 0.9.1's V1 trainer: :mod:`~verl.remote_backend.trainers.v1`)."""

from verl.remote_backend.trainers.ray_ppo import CPUResourcePoolManager, RemoteBackendTrainer, forwarder_role

__all__ = ["RemoteBackendTrainer", "CPUResourcePoolManager", "forwarder_role"]
