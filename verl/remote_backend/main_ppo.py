"""Entry point: ``python -m verl.remote_backend.main_ppo [hydra overrides]``.

It composes verl's own ``ppo_trainer`` config plus this project's keys
(``config/remote_ppo_trainer.yaml``) and runs verl's ``run_ppo``: unchanged when
``trainer.remote_backend`` is null, with the remote-backend task runner otherwise. It exists so
one command line switches a verl run onto a remote backend, and so a run on that path ends
cleanly (Ctrl-C, a killed driver) and reports its failures plainly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any, Optional

import hydra

from verl.remote_backend.verl_versions import require_supported_verl

# Also here, not only in the package's __init__: a verl that ships its own seam may have replaced
# that file with its own, and this check is what says so.
require_supported_verl()

from verl.remote_backend.errors import ConfigError, RunInterruptedError
from verl.remote_backend.launch.backend_keys import open_third_party_keys
from verl.remote_backend.launch.derive import derive_remote_settings, describe, explicit_override_keys
from verl.remote_backend.launch.failure_report import failure_report, root_cause
from verl.remote_backend.launch.interrupts import EXIT_CODE_INTERRUPTED, RunnerLauncher, interrupt_report
from verl.remote_backend.launch.reaper import start_reaper
from verl.remote_backend.launch.secrets import check_secrets_reach_workers, hide_secrets, move_secret_overrides
from verl.remote_backend.launch.validation import (
    backend_class_or_none,
    backend_name,
    required_ray_cpus,
    validate_remote_backend_config,
)
from verl.remote_backend.registry import RemoteBackendRegistry

__all__ = ["main", "run"]

# Logical CPUs added on top of what runner + forwarders reserve, for the backend's own
# actors (e.g. the local engine asks for remote_backend.local.num_cpus).
_BACKEND_CPU_HEADROOM = 4

# Seconds the driver waits, after Ctrl-C, for the runner to tear the backend down (the whole
# exit stays within 15 s; what is not torn down by then stops with Ray's shutdown).
_INTERRUPT_TEARDOWN_S = 10.0


def _ensure_ray_cpus(config: Any) -> None:
    """Fill a null ``ray_kwargs.ray_init.num_cpus`` with enough *logical* CPUs.

    Ray's CPU count is logical; a small machine (2 cores) would otherwise make
    the forwarder pool's placement group wait forever next to the task runner
    and the backend's actors.
    """
    ray_init = config.ray_kwargs.ray_init
    if ray_init.get("num_cpus") is None:
        ray_init.num_cpus = max(os.cpu_count() or 1, required_ray_cpus(config) + _BACKEND_CPU_HEADROOM)
        print(f"[remote_backend] ray_kwargs.ray_init.num_cpus=null -> {ray_init.num_cpus} logical CPUs")


def _seed_each_sample(config: Any) -> None:
    """Give every rollout sample its own random stream (see ``remote_rollout/seeding.py``; on verl
    0.9.1's V1 trainer ``seeding_tq.py``), unless the user set an agent-loop manager of their own."""
    from omegaconf import open_dict

    from verl.remote_backend.verl_versions import verl_glue
    from verl.workers.rollout.remote_rollout.seeding import MANAGER_FQN, MANAGER_TQ_FQN

    agent = config.actor_rollout_ref.rollout.agent
    if agent.get("agent_loop_manager_class") is None:
        with open_dict(agent):
            agent.agent_loop_manager_class = MANAGER_TQ_FQN if verl_glue().uses_v1_trainer(config) else MANAGER_FQN


def _remote_task_runner(config: Any) -> type:
    """The task runner of the trainer ``config`` selects: verl 0.9.1's V1 trainer, or the legacy one."""
    from verl.remote_backend.verl_versions import verl_glue

    if verl_glue().uses_v1_trainer(config):
        from verl.remote_backend.trainers.v1_runner import RemoteBackendTaskRunnerV1

        return RemoteBackendTaskRunnerV1
    from verl.remote_backend.trainers.ray_ppo_runner import RemoteBackendTaskRunner

    return RemoteBackendTaskRunner


def run(config: Any, explicit_keys: Optional[Collection[str]] = None) -> None:
    """Run PPO/GRPO for a composed config.

    ``trainer.remote_backend=null``: verl's own run, as ``verl.trainer.main_ppo`` runs it.
    Otherwise: move the backend's credential settings into their environment variables, derive
    the keys with one valid value on the remote path and print them in one line, validate on the
    driver before Ray starts (a moved credential cannot reach an existing cluster), fill a null
    ``ray_init.num_cpus``, seed every rollout sample from its identity, start the reaper, and run
    verl's ``run_ppo`` with the remote path's task runner: on verl 0.9.1's V1 trainer (its default,
    ``trainer.use_v1=true``) :class:`~verl.remote_backend.trainers.v1_runner.RemoteBackendTaskRunnerV1`,
    otherwise :class:`~verl.remote_backend.trainers.ray_ppo_runner.RemoteBackendTaskRunner`. Ctrl-C tears the
    backend down, prints how to resume and exits with 130.

    ``explicit_keys``: the keys the user set (Hydra overrides); with a remote backend, keys with
    one valid value are derived (``launch/derive.py``) unless set explicitly to a value that
    cannot work. ``None`` treats every key as left at its default."""
    import ray

    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.remote_backend.verl_versions import verl_glue
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    if backend_name(config) is None:
        # Only verl's own path: the remote path's verl side is CPU by design, and verl 0.9.1's
        # platform detection reports "cuda" on a machine with no accelerator at all.
        auto_set_device(config)
    config = migrate_legacy_reward_impl(config)
    moved_secrets = _hide_backend_secrets(config)
    derived = derive_remote_settings(config, explicit_keys)
    if derived:
        print(describe(backend_name(config), derived), flush=True)
    plan = validate_remote_backend_config(config)
    if plan is None:
        verl_glue().run_stock_ppo(config)
        return

    check_secrets_reach_workers(config, moved_secrets)
    _ensure_ray_cpus(config)
    _seed_each_sample(config)
    cls = plan.backend_cls
    served_by = "" if RemoteBackendRegistry.is_builtin(cls, plan.name) else f" ({cls.__module__}.{cls.__qualname__})"
    print(
        f"[remote_backend] backend={plan.name}{served_by} forwarders={plan.num_forwarders} "
        f"replicas={plan.num_replicas} resume_from={plan.resume_from}"
    )
    start_reaper()  # a killed driver leaves no process of the run behind
    launcher = RunnerLauncher(ray.remote(num_cpus=1)(_remote_task_runner(config)))
    try:
        run_ppo(config, task_runner_class=launcher)
    except KeyboardInterrupt:
        interrupted = launcher.interrupt(wait_s=_INTERRUPT_TEARDOWN_S)
        print(interrupt_report(config, plan.name, interrupted), flush=True)
        raise SystemExit(EXIT_CODE_INTERRUPTED) from None
    except Exception as exc:
        cause = root_cause(exc)
        if not isinstance(cause, RunInterruptedError):  # the runner took the SIGINT first
            raise
        print(interrupt_report(config, plan.name, cause), flush=True)
        raise SystemExit(EXIT_CODE_INTERRUPTED) from None


def _hide_backend_secrets(config: Any) -> list[str]:
    """Move the selected backend's credential settings out of ``config`` (``launch/secrets.py``)
    before anything prints it; returns the keys moved. An unknown backend is left to validation."""
    backend_cls = backend_class_or_none(backend_name(config))
    return [] if backend_cls is None else hide_secrets(config, backend_cls, _hydra_record_dir())


@hydra.main(config_path="config", config_name="remote_ppo_trainer", version_base=None)
def _hydra_main(config: Any) -> None:
    try:
        run(config, explicit_keys=_hydra_override_keys())
    except Exception as exc:
        print(failure_report(exc, run_dir=_hydra_output_dir()), file=sys.stderr, flush=True)
        raise


def main() -> None:
    """Entry point (``python -m verl.remote_backend.main_ppo [overrides]``): Hydra composes the
    config from ``sys.argv``, with a third-party backend's ``remote_backend.<key>=...`` accepted
    without ``+`` (:mod:`~verl.remote_backend.launch.backend_keys`) and the selected backend's
    credential settings moved out of it into their environment variables
    (:mod:`~verl.remote_backend.launch.secrets`).

    A failure prints :func:`~verl.remote_backend.launch.failure_report.failure_report` (cause, fix, logs)
    before Hydra's own error line and the traceback."""
    try:
        sys.argv[1:] = move_secret_overrides(open_third_party_keys(sys.argv[1:]))
    except ConfigError as exc:  # before Hydra and Ray: the message is the whole story
        print(f"[remote_backend] bad command line: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    _hydra_main()


def _hydra_override_keys() -> Optional[frozenset[str]]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return explicit_override_keys(HydraConfig.get().overrides.task)
    except Exception:  # noqa: BLE001 - not under Hydra: keys unknown
        return None


def _hydra_output_dir() -> Optional[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().runtime.output_dir)
    except Exception:  # noqa: BLE001 - only used in messages
        return None


def _hydra_record_dir() -> Optional[Path]:
    """Where Hydra wrote the composed config and the overrides (``<run dir>/.hydra``), if it did."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra_cfg = HydraConfig.get()
        sub = hydra_cfg.output_subdir
        return None if sub is None else Path(hydra_cfg.runtime.output_dir) / str(sub)
    except Exception:  # noqa: BLE001 - not under Hydra: nothing was written
        return None


if __name__ == "__main__":
    main()
