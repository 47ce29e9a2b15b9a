"""verl 0.7.1: ``main_ppo.TaskRunner`` is a plain class and ``run_ppo`` builds it itself.

Every module of this folder defines the same names; see ``verl_versions/__init__.py``.
"""

from __future__ import annotations

from typing import Any

#: Module whose global ``RayPPOTrainer`` verl's ``TaskRunner.run`` instantiates.
TASK_RUNNER_MODULE = "verl.trainer.main_ppo"


def task_runner_class() -> type:
    """verl's task runner as a plain (not yet ``ray.remote``) class, to subclass."""
    from verl.trainer.main_ppo import TaskRunner

    return TaskRunner


def run_stock_ppo(config: Any) -> None:
    """verl's own run for ``trainer.remote_backend=null``, as ``verl.trainer.main_ppo`` runs it."""
    from verl.trainer.main_ppo import run_ppo

    run_ppo(config)


def uses_v1_trainer(config: Any) -> bool:
    """Whether ``config`` runs on a V1 trainer: never (0.7.1 has none)."""
    return False


def rollout_replicas(trainer: Any) -> list:
    """The rollout replicas ``RayPPOTrainer.init_workers`` built (empty before it ran)."""
    manager = getattr(trainer, "async_rollout_manager", None)
    return list(getattr(manager, "rollout_replicas", None) or [])


def transfer_queue_cpus(config: Any) -> int:
    """Logical Ray CPUs TransferQueue's actors reserve: none (0.7.1's trainer does not use it)."""
    return 0


def release_defaults(config: Any) -> tuple:
    """Keys the remote path sets unless the user set them: ``(key, value, reason)``; none here."""
    return ()


def check_release_settings(config: Any) -> None:
    """What this release's trainer needs beyond :data:`RELEASE_REQUIRED_SETTINGS`: nothing."""


#: Keys of verl's config the remote path sets that exist only in this release:
#: ``(key, value, reason, explicit values refused rather than overwritten)``.
RELEASE_REQUIRED_SETTINGS: tuple = (
    (
        "trainer.use_legacy_worker_impl",
        "disable",
        "remote backends plug into verl's new worker path (nested-jagged TensorDict batches) only",
        ("enable",),
    ),
)
