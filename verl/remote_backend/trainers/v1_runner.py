"""verl 0.9.1's ``TaskRunnerV1`` with the remote-backend trainer in place of ``PPOTrainerSync``.

``TaskRunnerV1.run`` builds the trainer registered under ``trainer.v1.trainer_mode`` (looked up
in verl's ``TRAINER_REGISTRY`` when ``run`` starts) and brackets the run with TransferQueue's
``init``/``close``. Rather than copy ``run``, the runner registers
:class:`~verl.remote_backend.trainers.v1.RemoteBackendTrainerV1` as the ``sync`` trainer while
``run`` lasts; the runner is a Ray actor process of its own, so nothing else sees the
substitution, and verl's behaviour keyed on the mode's name (its replay buffer, dataloader
refills, checkpoint contents) stays that of ``sync``. Importing this module needs verl 0.9.1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from verl.remote_backend.launch.cpu_compat import install_flash_attn_fallback
from verl.remote_backend.launch.interrupts import InterruptibleRunner
from verl.remote_backend.verl_versions import verl_glue

__all__ = ["RemoteBackendTaskRunnerV1", "substitute_sync_trainer", "SYNC_MODE"]

#: The V1 trainer mode the remote path runs in (the others are refused before Ray starts).
SYNC_MODE = "sync"


@contextlib.contextmanager
def substitute_sync_trainer(trainer_cls: type) -> Iterator[None]:
    """Make verl's V1 trainer registry answer ``trainer_cls`` for ``sync`` while inside."""
    from verl.trainer.ppo.v1 import trainer_base

    registry = trainer_base.TRAINER_REGISTRY
    original = registry[SYNC_MODE]
    registry[SYNC_MODE] = trainer_cls
    try:
        yield
    finally:
        registry[SYNC_MODE] = original


class RemoteBackendTaskRunnerV1(InterruptibleRunner, verl_glue().VerlTaskRunnerV1):
    """Runs verl's ``TaskRunnerV1.run`` with :class:`~verl.remote_backend.trainers.v1.RemoteBackendTrainerV1`."""

    def run(self, config: Any) -> None:
        """verl's ``TaskRunnerV1.run``; a SIGINT ends it with :class:`RunInterruptedError` after teardown."""
        from verl.remote_backend.trainers.v1 import RemoteBackendTrainerV1

        install_flash_attn_fallback()
        with substitute_sync_trainer(RemoteBackendTrainerV1):
            self.run_interruptibly(lambda: super(RemoteBackendTaskRunnerV1, self).run(config))
