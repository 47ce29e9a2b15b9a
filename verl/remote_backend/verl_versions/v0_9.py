"""verl 0.9.1: the remote path runs on the V1 trainer (``PPOTrainerSync``), or on the legacy one.

0.9.1 defaults to its V1 trainer (``trainer.use_v1=true``: ``main_ppo.TaskRunnerV1``, batches in
TransferQueue with every per-sample field jagged, the trainer class chosen by
``trainer.v1.trainer_mode``). The remote path runs there by default, in its synchronous mode
(``trainers/v1_runner.py``, ``trainers/v1.py``); the asynchronous modes are refused before Ray starts.
With ``trainer.use_v1=false`` it runs on the ``RayPPOTrainer`` of ``main_ppo_v0``, the trainer
0.7.1 has (``trainers/ray_ppo_runner.py``, ``trainers/ray_ppo.py``).

verl decorates both task runners with ``ray.remote`` (an actor class cannot be subclassed), so
:class:`VerlTaskRunner` and :class:`VerlTaskRunnerV1` rebuild the plain classes; ``run_ppo`` needs
the runner class passed in. The V1 trainer needs TransferQueue (verl's ``verl-core`` extra), whose
controller and storage units are Ray actors of one logical CPU each (:func:`transfer_queue_cpus`);
:func:`release_defaults` shrinks verl's 8 storage units to 1 unless the user sets them.
Every module of this folder defines the same names; see ``verl_versions/__init__.py``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.settings.loader import select
from verl.trainer.main_ppo import TaskRunnerV1 as _VerlTaskRunnerV1Actor
from verl.trainer.main_ppo_v0 import BaseTaskRunner as _BaseTaskRunner
from verl.trainer.main_ppo_v0 import TaskRunner as _VerlTaskRunnerActor

TASK_RUNNER_MODULE = "verl.trainer.main_ppo_v0"

#: TransferQueue's key for the number of its storage-unit actors (verl's default: 8).
STORAGE_UNITS_KEY = "transfer_queue.backend.SimpleStorage.num_data_storage_units"


def task_runner_class() -> type:
    """verl's legacy task runner as a plain (not yet ``ray.remote``) class, to subclass."""
    return VerlTaskRunner


class VerlTaskRunner(_BaseTaskRunner):
    """``main_ppo_v0.TaskRunner`` without its ``ray.remote``: its hooks (from ``BaseTaskRunner``) and
    its ``run``. Built on the importable base because Ray re-imports a subclass's bases by name in
    the actor process, where ``main_ppo_v0.TaskRunner`` names the actor class, not a class."""

    run = _VerlTaskRunnerActor.__ray_actor_class__.run


class VerlTaskRunnerV1:
    """``main_ppo.TaskRunnerV1`` without its ``ray.remote``: its three methods (it has no base
    class; none of them calls ``super()``). ``run`` builds ``get_trainer_cls(trainer.v1.trainer_mode)``,
    inits TransferQueue, and closes it in its ``finally``."""

    __init__ = _VerlTaskRunnerV1Actor.__ray_actor_class__.__init__
    init_agent_loop_manager = _VerlTaskRunnerV1Actor.__ray_actor_class__.init_agent_loop_manager
    run = _VerlTaskRunnerV1Actor.__ray_actor_class__.run


def uses_v1_trainer(config: Any) -> bool:
    """Whether ``config`` runs on the V1 trainer (``trainer.use_v1``, verl's default true)."""
    return bool(select(config, "trainer.use_v1", True))


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
    """The rollout replicas the trainer built (empty before it did): both trainers keep them in
    their ``llm_server_manager``."""
    manager = getattr(trainer, "llm_server_manager", None)
    return list(manager.get_replicas()) if manager is not None else []


def transfer_queue_cpus(config: Any) -> int:
    """Logical Ray CPUs TransferQueue's actors reserve: on the V1 trainer its controller plus, with
    the ``SimpleStorage`` backend, one per storage unit; 0 on the legacy trainer (no TransferQueue)."""
    if not uses_v1_trainer(config):
        return 0
    storage = select(config, "transfer_queue.backend.storage_backend", "SimpleStorage")
    return 1 + (int(select(config, STORAGE_UNITS_KEY, 8)) if storage == "SimpleStorage" else 0)


def _transfer_queue_installed() -> bool:
    return importlib.util.find_spec("transfer_queue") is not None


def release_defaults(config: Any) -> tuple:
    """Keys the remote path sets unless the user set them: ``(key, value, reason)``.

    Without TransferQueue (a plain ``pip install verl==0.9.1`` has none) the V1 trainer cannot run,
    so a run that did not ask for it explicitly goes to the legacy trainer, saying why; an explicit
    ``trainer.use_v1=true`` is refused by :func:`check_release_settings` instead."""
    if not uses_v1_trainer(config):
        return ()
    if not _transfer_queue_installed():
        return (
            (
                "trainer.use_v1",
                False,
                "verl 0.9.1's V1 trainer needs TransferQueue, which is not installed, so the legacy trainer runs "
                "(pip install 'verl[verl-core]==0.9.1' for the V1 trainer)",
            ),
        )
    return (
        (
            STORAGE_UNITS_KEY,
            1,
            "TransferQueue's storage units are Ray actors of one logical CPU each; one holds a remote run's batches",
        ),
    )


def check_release_settings(config: Any) -> None:
    """What this release's trainer needs beyond the keys of :data:`RELEASE_REQUIRED_SETTINGS`.

    Raises:
        ConfigError: the V1 trainer is selected but TransferQueue is not installed.
    """
    if uses_v1_trainer(config) and not _transfer_queue_installed():
        raise ConfigError.for_setting(
            "trainer.use_v1",
            True,
            "verl 0.9.1's V1 trainer keeps its batches in TransferQueue, which is not installed",
            "pip install 'TransferQueue==0.1.11' (or verl's extra: pip install 'verl[verl-core]==0.9.1'), "
            "or set trainer.use_v1=false for verl's legacy trainer",
        )


#: Keys of verl's config the remote path sets that exist only in this release:
#: ``(key, value, reason, explicit values refused rather than overwritten)``.
RELEASE_REQUIRED_SETTINGS: tuple = (
    (
        "trainer.v1.trainer_mode",
        "sync",
        "the remote path drives verl's synchronous V1 trainer (PPOTrainerSync) only; its asynchronous modes "
        "are not supported",
        ("colocate_async", "separate_async"),
    ),
)
