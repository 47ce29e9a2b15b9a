"""``RemoteBackendTrainer``: verl's ``RayPPOTrainer`` with the compute in a remote backend.

The algorithm stays verl's. This subclass validates the config first, reserves CPU-only
pools for the forwarders, creates the one backend on the driver (bounded by
``remote_backend.timeouts.create``) and attaches forwarders and rollout replicas to its
handle, destroys it after ``fit()`` whatever happens, and logs ``perf/remote/*``: how much
of the forwarded calls' wall time the backend computed and how much the plugin added.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any, Optional

import ray

from verl.remote_backend.base import RemoteBackend, destroy_backend
from verl.remote_backend.checkpoints import TRACKER_FILE, exception_chain, storage_failure, tracker_step
from verl.remote_backend.errors import BackendTimeoutError, CheckpointSaveError, ConfigError, RunInterruptedError
from verl.remote_backend.forwarder.backend_worker import backend_worker_class
from verl.remote_backend.launch.cpu_compat import install_flash_attn_fallback
from verl.remote_backend.launch.interrupts import raise_if_interrupted
from verl.remote_backend.launch.validation import (
    RemoteRunPlan,
    validate_remote_backend_config,
)
from verl.remote_backend.registry import RemoteBackendRegistry
from verl.remote_backend.reliability.guard import run_with_timeout
from verl.remote_backend.reliability.policy import ReliabilitySettings
from verl.remote_backend.verl_versions import verl_glue
from verl.single_controller.ray import RayResourcePool, ResourcePoolManager
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.utils import Role, need_reference_policy

__all__ = ["RemoteBackendTrainer", "CPUResourcePoolManager", "forwarder_role"]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

# Seconds to wait for forwarders/servers to drop their connections at shutdown.
_DETACH_TIMEOUT_S = 30.0


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


class RemoteBackendTrainer(RayPPOTrainer):
    """PPO/GRPO trainer whose actor, reference and sampler live in a ``RemoteBackend``.

    Takes exactly ``RayPPOTrainer``'s arguments. The actor entry of
    ``role_worker_mapping`` is replaced by the CPU forwarder and the pool
    manager by :class:`CPUResourcePoolManager`, so it also works when built by
    verl's own ``TaskRunner`` code path.

    Attributes:
        plan: the validated :class:`RemoteRunPlan`.
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
        # The entry point already read the data files and checksummed the checkpoint on the driver.
        plan = validate_remote_backend_config(config, scan_files=False)
        if plan is None:
            raise ConfigError.for_setting(
                "trainer.remote_backend",
                None,
                "RemoteBackendTrainer drives a remote backend and needs its name",
                "set trainer.remote_backend=<name>, or use verl's RayPPOTrainer for verl's own path",
            )
        self.plan: RemoteRunPlan = plan
        self.backend: Optional[RemoteBackend] = None
        self._backend_destroyed = False
        self._handle: Optional[dict[str, Any]] = None
        self._backend_worker: Optional[type] = None  # a backend's own forwarder worker class (register_worker)
        self._forwarded_wall_s = 0.0  # driver seconds of this step's forwarded calls so far
        install_flash_attn_fallback()

        from verl.remote_backend.forwarder.worker import RemoteBackendWorker

        role_worker_mapping = {
            role: cls
            for role, cls in role_worker_mapping.items()
            if role not in (Role.ActorRollout, Role.ActorRolloutRef, Role.Critic, Role.RefPolicy)
        }
        role_worker_mapping[forwarder_role(config)] = ray.remote(RemoteBackendWorker)
        resource_pool_manager = CPUResourcePoolManager.from_manager(resource_pool_manager)
        resource_pool_manager.mapping.setdefault(forwarder_role(config), "global_pool")
        super().__init__(config, tokenizer, role_worker_mapping, resource_pool_manager, *args, **kwargs)

    # ------------------------------------------------------------ workers
    def init_workers(self) -> None:
        """Create the backend, then verl's workers, replicas and agent loop, wired to it."""
        from verl.workers.rollout.remote_rollout.replica import register_remote_replica

        try:
            # Bounded by remote_backend.timeouts.create: a backend that never comes up fails the run.
            self.backend = run_with_timeout(
                lambda: RemoteBackendRegistry.create(self.plan.name, self.config),
                op="create",
                backend=self.plan.name,
                limit_s=ReliabilitySettings.from_main_config(self.config).timeouts.create,
            )
            self._handle = self.backend.reconnect_handle()
            # The AgentLoopManager is built in this process; bind its replica class to our handle.
            register_remote_replica(self.config.actor_rollout_ref.rollout.name, self.config, self._handle)
            own_worker = RemoteBackendRegistry.get_worker(self.plan.name)
            if own_worker is not None:
                self._backend_worker = own_worker
                self.role_worker_mapping[forwarder_role(self.config)] = ray.remote(
                    backend_worker_class(own_worker, main_config=self.config, backend_handle=self._handle)
                )
                print(
                    f"[remote_backend] backend {self.plan.name!r} brings its own forwarder worker: "
                    f"{own_worker.__module__}.{own_worker.__qualname__}",
                    flush=True,
                )
            super().init_workers()
            if own_worker is None:  # the generic forwarder re-attaches after start; a backend's own got the handle
                self.actor_rollout_wg.attach_backend(self.config, self._handle)
        except BaseException:
            self.destroy_backend()
            raise

    # ------------------------------------------------------------ timing of forwarded calls
    # verl's step calls these three in order (old log-prob, ref, update); the update's metrics
    # are the only ones the trainer logs from a worker, so the step's totals travel there.
    def _compute_old_log_prob(self, batch: Any) -> Any:
        raise_if_interrupted()
        start = time.perf_counter()
        try:
            return super()._compute_old_log_prob(batch)
        finally:
            self._forwarded_wall_s += time.perf_counter() - start

    def _compute_ref_log_prob(self, batch: Any) -> Any:
        raise_if_interrupted()
        start = time.perf_counter()
        try:
            return super()._compute_ref_log_prob(batch)
        finally:
            self._forwarded_wall_s += time.perf_counter() - start

    def _update_actor(self, batch: Any) -> Any:
        from verl.remote_backend.forwarder.step_timing import remote_overhead_metrics

        raise_if_interrupted()
        start = time.perf_counter()
        output = super()._update_actor(batch)
        wall, self._forwarded_wall_s = self._forwarded_wall_s + time.perf_counter() - start, 0.0
        metrics = output.meta_info.get("metrics")
        if isinstance(metrics, dict):
            metrics.update(remote_overhead_metrics(metrics, wall))
        return output

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

    def fit(self) -> None:
        """verl's training loop; the backend is destroyed afterwards, whatever happens.

        Raises:
            RunInterruptedError: Ctrl-C (SIGINT, see :mod:`verl.remote_backend.launch.interrupts`),
                after the backend's teardown; carries the last step that finished.
        """
        try:
            super().fit()
        except KeyboardInterrupt:
            # verl's loop advances global_steps after each finished step.
            finished = max(int(getattr(self, "global_steps", 1)) - 1, 0)
            raise RunInterruptedError(step=finished, backend_destroyed=self.destroy_backend()) from None
        finally:
            self.destroy_backend()

    # ------------------------------------------------------------ teardown
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
        for replica in verl_glue().rollout_replicas(self):
            refs += [server.destroy.remote() for server in replica.servers]
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
