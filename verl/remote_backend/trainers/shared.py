"""The remote backend's life inside a verl trainer, whichever trainer it is.

The remote path runs on two verl trainers: ``RayPPOTrainer`` (verl 0.7.1, and 0.9.1 with
``trainer.use_v1=false``; :mod:`~verl.remote_backend.trainer`) and verl 0.9.1's V1
``PPOTrainerSync`` (:mod:`~verl.remote_backend.trainers.v1`). They build workers, replicas and
steps differently, but the backend lives the same way in both: a validated config; one backend
created on the driver (bounded by ``remote_backend.timeouts.create``) whose handle the forwarders
and rollout servers re-attach to; the forwarded calls timed for ``perf/remote/*``; saves that
never leave a half-written step behind; teardown after ``fit()`` whatever happens.
:class:`RemoteBackendTrainerMixin` holds that, and each trainer calls it from verl's own hooks.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any, Callable, Optional, TypeVar

import ray

from verl.remote_backend.base import RemoteBackend, destroy_backend
from verl.remote_backend.checkpoints import TRACKER_FILE, exception_chain, storage_failure, tracker_step
from verl.remote_backend.errors import BackendTimeoutError, CheckpointSaveError, ConfigError, RunInterruptedError
from verl.remote_backend.forwarder.backend_worker import backend_worker_class
from verl.remote_backend.launch.cpu_compat import install_flash_attn_fallback
from verl.remote_backend.launch.interrupts import raise_if_interrupted
from verl.remote_backend.launch.validation import RemoteRunPlan, validate_remote_backend_config
from verl.remote_backend.registry import RemoteBackendRegistry
from verl.remote_backend.reliability.guard import run_with_timeout
from verl.remote_backend.reliability.policy import ReliabilitySettings
from verl.remote_backend.verl_versions import verl_glue

__all__ = ["RemoteBackendTrainerMixin"]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

# Seconds to wait for forwarders/servers to drop their connections at shutdown.
_DETACH_TIMEOUT_S = 30.0

T = TypeVar("T")


class RemoteBackendTrainerMixin:
    """Put before a verl trainer class in the bases; verl's trainer provides ``config``,
    ``global_steps``, ``actor_rollout_wg`` and ``_save_checkpoint``/``fit``.

    Attributes:
        plan: the validated :class:`RemoteRunPlan`.
        backend: the driver's backend instance (``None`` before :meth:`_create_backend` and after
            teardown).
    """

    config: Any
    plan: RemoteRunPlan
    backend: Optional[RemoteBackend]

    # ------------------------------------------------------------ set-up
    def _init_remote_state(self, config: Any) -> None:
        """Validate ``config`` for a remote run and reset the backend's state; call first in ``__init__``.

        Raises:
            ConfigError: ``trainer.remote_backend`` is null, or any rule of
                :func:`~verl.remote_backend.launch.validation.validate_remote_backend_config`.
        """
        # The entry point already read the data files and checksummed the checkpoint on the driver.
        plan = validate_remote_backend_config(config, scan_files=False)
        if plan is None:
            raise ConfigError.for_setting(
                "trainer.remote_backend",
                None,
                f"{type(self).__name__} drives a remote backend and needs its name",
                "set trainer.remote_backend=<name>, or use verl's own trainer for verl's own path",
            )
        self.plan = plan
        self.backend = None
        self._backend_destroyed = False
        self._handle: Optional[dict[str, Any]] = None
        self._backend_worker: Optional[type] = None  # a backend's own forwarder worker class (register_worker)
        self._forwarded_wall_s = 0.0  # driver seconds of this step's forwarded calls so far
        install_flash_attn_fallback()

    def _create_backend(self) -> None:
        """Create the backend (bounded by ``remote_backend.timeouts.create``), keep its handle, and
        bind this process's rollout replica class to it (verl builds the replicas in this process)."""
        from verl.workers.rollout.remote_rollout.replica import register_remote_replica

        self.backend = run_with_timeout(
            lambda: RemoteBackendRegistry.create(self.plan.name, self.config),
            op="create",
            backend=self.plan.name,
            limit_s=ReliabilitySettings.from_main_config(self.config).timeouts.create,
        )
        self._handle = self.backend.reconnect_handle()
        register_remote_replica(self.config.actor_rollout_ref.rollout.name, self.config, self._handle)
        own_worker = RemoteBackendRegistry.get_worker(self.plan.name)
        if own_worker is not None:
            self._backend_worker = own_worker
            print(
                f"[remote_backend] backend {self.plan.name!r} brings its own forwarder worker: "
                f"{own_worker.__module__}.{own_worker.__qualname__}",
                flush=True,
            )

    def _forwarder_worker(self) -> Any:
        """The ``ray.remote`` class of the actor(+ref) role: the generic CPU forwarder, or the
        backend's own worker class bound to the backend's handle (after :meth:`_create_backend`)."""
        if self._backend_worker is not None:
            bound = backend_worker_class(self._backend_worker, main_config=self.config, backend_handle=self._handle)
            return ray.remote(bound)
        from verl.remote_backend.forwarder.worker import RemoteBackendWorker

        return ray.remote(RemoteBackendWorker)

    def _attach_forwarders(self) -> None:
        """Re-attach the generic forwarders to the backend (a backend's own worker got the handle
        at construction)."""
        if self._backend_worker is None:
            self.actor_rollout_wg.attach_backend(self.config, self._handle)

    def _rollout_servers(self) -> list:
        """The rollout server actors of the replicas the trainer built."""
        return [server for replica in verl_glue().rollout_replicas(self) for server in replica.servers]

    # ------------------------------------------------------------ timing of forwarded calls
    # verl's step calls old log-prob, ref and update in that order; the update's metrics are the
    # only ones the trainer logs from a worker, so the step's totals travel there.
    def _timed(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call(*args, **kwargs)``, its driver wall time added to this step's forwarded seconds."""
        raise_if_interrupted()
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            self._forwarded_wall_s += time.perf_counter() - start

    def _take_forwarded_wall_s(self) -> float:
        """This step's forwarded seconds so far; the count starts again at 0."""
        wall, self._forwarded_wall_s = self._forwarded_wall_s, 0.0
        return wall

    def _compute_old_log_prob(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super()._compute_old_log_prob, batch, *args, **kwargs)

    def _compute_ref_log_prob(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super()._compute_ref_log_prob, batch, *args, **kwargs)

    # ------------------------------------------------------------ checkpoints
    def _save_checkpoint(self) -> None:
        """verl's save (the backend's ``actor/``, then verl's ``data.pt``, then the tracker). When
        the storage refuses any part of it, this step's folder is removed unless the tracker
        already names it (so resume cannot pick a half-written step) and the run ends with
        :class:`CheckpointSaveError` naming the folder and the fix; the previous checkpoint and the
        tracker that names it are untouched."""
        root = os.path.abspath(self.config.trainer.default_local_dir)
        previous = tracker_step(root)
        try:
            super()._save_checkpoint()
        except Exception as exc:
            step_dir = os.path.join(root, f"global_step_{self.global_steps}")
            refused = exc if _is_save_refusal(exc) else storage_failure(exc, step_dir)
            if refused is None:
                raise
            if tracker_step(root) != self.global_steps:
                shutil.rmtree(step_dir, ignore_errors=True)
                # verl opens the tracker with "w" before writing: a write the disk refused leaves it
                # empty. The truncation freed its bytes, so the previous step fits back in.
                if previous is not None and tracker_step(root) != previous:
                    _rewrite_tracker(root, previous)
            if refused is exc:
                raise
            raise refused from exc

    # ------------------------------------------------------------ the loop and teardown
    def fit(self, *args: Any, **kwargs: Any) -> None:
        """verl's training loop; the backend is destroyed afterwards, whatever happens.

        Raises:
            RunInterruptedError: Ctrl-C (SIGINT, see :mod:`verl.remote_backend.launch.interrupts`),
                after the backend's teardown; carries the last step that finished.
        """
        try:
            super().fit(*args, **kwargs)
        except KeyboardInterrupt:
            # verl's loops advance global_steps after each finished step.
            finished = max(int(getattr(self, "global_steps", 1)) - 1, 0)
            raise RunInterruptedError(step=finished, backend_destroyed=self.destroy_backend()) from None
        finally:
            self.destroy_backend()

    def destroy_backend(self) -> bool:
        """Detach forwarders and rollout servers, then destroy the backend. Idempotent.

        Returns ``True`` when the backend is gone (destroyed now or before), ``False`` when its
        ``destroy()`` overran ``remote_backend.timeouts.destroy``."""
        backend, self.backend = self.backend, None
        if backend is None:
            return self._backend_destroyed
        refs = []
        wg = getattr(self, "actor_rollout_wg", None)
        if wg is not None and self._backend_worker is None:
            try:
                refs += list(wg.detach_backend())  # non-blocking: one ref per forwarder
            except Exception as exc:  # noqa: BLE001 - teardown must reach backend.destroy()
                logger.warning("Could not detach forwarders from the backend: %s", exc)
        refs += [server.destroy.remote() for server in self._rollout_servers()]
        if refs:
            try:
                ray.get(refs, timeout=_DETACH_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001
                logger.warning("Detaching from the backend did not finish cleanly: %s", exc)
        try:
            # Bounded by remote_backend.timeouts.destroy.
            run_with_timeout(
                lambda: destroy_backend(backend),
                op="destroy",
                backend=self.plan.name,
                limit_s=ReliabilitySettings.from_main_config(self.config).timeouts.destroy,
            )
        except BackendTimeoutError as exc:  # runs in `finally`: report, never mask the run's own error
            logger.error("%s", exc)
            print(f"[remote_backend] {exc}", flush=True)
            return False
        self._backend_destroyed = True
        print(f"[remote_backend] destroyed backend {self.plan.name!r}", flush=True)
        return True


def _rewrite_tracker(root: str, step: int) -> None:
    """Put ``step`` back into verl's tracker (best effort: the disk may still refuse it)."""
    try:
        with open(os.path.join(root, TRACKER_FILE), "w") as fh:
            fh.write(str(step))
    except OSError:
        logger.warning("could not restore %s to step %d", os.path.join(root, TRACKER_FILE), step)


def _is_save_refusal(exc: BaseException) -> bool:
    """A :class:`CheckpointSaveError` raised by the backend's save, whether it arrives as itself or
    wrapped by Ray (``RayTaskError`` subclasses the cause's type) or by the forwarder."""
    return any(isinstance(link, CheckpointSaveError) for link in exception_chain(exc))
