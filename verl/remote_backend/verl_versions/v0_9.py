"""verl 0.9.1: the remote path runs on the ``RayPPOTrainer`` of ``main_ppo_v0``.

0.9.1 defaults to its V1 trainer (``trainer.use_v1=true``: TransferQueue, jagged per-sample
batches, ``PPOTrainerSync``), which this plugin does not drive yet; its ``RayPPOTrainer`` with
the new worker path is the trainer 0.7.1 has, so the remote path sets ``trainer.use_v1=false``.
Its ``TaskRunner`` is decorated with ``ray.remote`` (a Ray actor class cannot be subclassed), so
:class:`VerlTaskRunner` rebuilds the plain class; ``run_ppo`` needs the runner class passed in.
Every module of this folder defines the same names; see ``verl_versions/__init__.py``.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.main_ppo_v0 import BaseTaskRunner as _BaseTaskRunner
from verl.trainer.main_ppo_v0 import TaskRunner as _VerlTaskRunnerActor

TASK_RUNNER_MODULE = "verl.trainer.main_ppo_v0"


def task_runner_class() -> type:
    """verl's task runner as a plain (not yet ``ray.remote``) class, to subclass."""
    return VerlTaskRunner


class VerlTaskRunner(_BaseTaskRunner):
    """``main_ppo_v0.TaskRunner`` without its ``ray.remote``: its hooks (from ``BaseTaskRunner``) and
    its ``run``. Built on the importable base because Ray re-imports a subclass's bases by name in
    the actor process, where ``main_ppo_v0.TaskRunner`` names the actor class, not a class."""

    run = _VerlTaskRunnerActor.__ray_actor_class__.run


def run_stock_ppo(config: Any) -> None:
    """verl's own run for ``trainer.remote_backend=null``, as ``verl.trainer.main_ppo.main`` runs it
    (its V1 runner, or the legacy one with ``trainer.use_v1=false``)."""
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    if config.trainer.use_v1:
        run_ppo(config, task_runner_class=TaskRunnerV1)
    else:
        from verl.trainer.main_ppo_v0 import TaskRunner

        run_ppo(config, task_runner_class=TaskRunner)


def rollout_replicas(trainer: Any) -> list:
    """The rollout replicas ``RayPPOTrainer.init_workers`` built (empty before it ran)."""
    manager = getattr(trainer, "llm_server_manager", None)
    return list(manager.get_replicas()) if manager is not None else []


#: Keys of verl's config the remote path sets that exist only in this release:
#: ``(key, value, reason, explicit values refused rather than overwritten)``.
RELEASE_REQUIRED_SETTINGS: tuple = (
    (
        "trainer.use_v1",
        False,
        "on verl 0.9.1 the remote path runs on verl's RayPPOTrainer (main_ppo_v0); the V1 trainer is not supported yet",
        (True,),
    ),
)
