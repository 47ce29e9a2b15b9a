"""Arctic's in-process Ray server (``protocol=ray``) on a CPU-only Ray cluster (tests only).

arctic-platform's ``RayTransport`` starts ``ArcticRLRayServerState`` as a Ray actor in the
caller's cluster; that actor creates the DeepSpeed worker actors and the vLLM replica pool. The
HTTP stand-in swaps the GPU-only pieces inside its server process (``server.py``); here the
server runs in Ray worker processes, so the same swaps are made in every worker of the test's
cluster by Ray's ``worker_process_setup_hook`` (:func:`install_in_worker`), at the moment
Arctic's ``common.ray_server`` module is imported there (nothing else is imported early):

* ``DeepSpeedWorker`` -> :class:`.cpu_worker.CpuDeepSpeedWorker` (as for HTTP);
* ``_replica_pool_cls`` / ``build_model_config`` -> :mod:`.cpu_sampler` (as for HTTP).

``init_ray_cluster`` needs no swap: inside the state actor Ray is up and Arctic's function
returns at once. The placement groups Arctic creates ask for ``{"GPU": 1, "CPU": 4}`` bundles
(``create_colocate_placement``) and fractional GPUs: :func:`ray_init_kwargs` declares the GPUs
as logical Ray resources of the local node, so they schedule as on a GPU node (nothing computes
on them: DeepSpeed runs its CPU accelerator, ``DS_ACCELERATOR=cpu``).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import pathlib
import sys
from collections.abc import Iterator
from typing import Any, Optional

_TESTS = str(pathlib.Path(__file__).resolve().parents[1])
_TARGET = "arctic_platform.common.ray_server"
#: What the workers inherit: the test tree on the path, DeepSpeed's CPU accelerator, the stand-in's knobs.
_WORKER_ENV = ("DS_ACCELERATOR", "ARCTIC_STANDIN_DTYPE", "ARCTIC_STANDIN_THREADS")


def ray_init_kwargs(logical_gpus: int = 1, num_cpus: int = 16) -> dict:
    """``ray.init`` arguments of a private local cluster able to host Arctic's Ray server on CPU."""
    env = {k: os.environ[k] for k in _WORKER_ENV if k in os.environ}
    env.setdefault("DS_ACCELERATOR", "cpu")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_TESTS, os.environ.get("PYTHONPATH", "")) if p)
    return dict(
        address="local",
        num_cpus=num_cpus,
        num_gpus=max(1, int(logical_gpus)),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": env, "worker_process_setup_hook": "arctic_standin.ray_setup.install_in_worker"},
    )


def patch_ray_server(module: Any) -> None:
    """The HTTP stand-in's swaps, applied to Arctic's ``common.ray_server`` module."""
    from arctic_standin import cpu_sampler, cpu_worker

    cpu_worker.install(module)
    module._replica_pool_cls = lambda: cpu_sampler.CpuReplicaPool
    module.build_model_config = cpu_sampler.build_model_config


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs :func:`patch_ray_server` right after Arctic's ``common.ray_server`` executes in this process."""

    def __init__(self) -> None:
        self._busy = False

    def find_spec(self, name: str, path: Optional[Any] = None, target: Optional[Any] = None) -> Any:
        if name != _TARGET or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            patch_ray_server(module)

        spec.loader.exec_module = exec_module
        return spec


def install_in_worker() -> None:
    """Ray's ``worker_process_setup_hook``: patch Arctic's Ray server module now or when it is imported."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if _TESTS not in sys.path:
        sys.path.insert(0, _TESTS)
    if _TARGET in sys.modules:
        patch_ray_server(sys.modules[_TARGET])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def start_ray(logical_gpus: int = 1, attempts: int = 3) -> None:
    """``ray.init(**ray_init_kwargs(...))``, tried again when the raylet misses Ray's fixed 30 s start-up
    window (it does on an overloaded machine: "The current node timed out during startup")."""
    import ray

    for attempt in range(1, attempts + 1):
        try:
            ray.init(**ray_init_kwargs(logical_gpus=logical_gpus))
            return
        except Exception as exc:
            ray.shutdown()
            if "timed out during startup" not in str(exc) or attempt == attempts:
                raise


@contextlib.contextmanager
def own_ray_cluster(logical_gpus: int = 1) -> Iterator[Any]:
    """A Ray cluster of the caller's own for Arctic's Ray server (:func:`start_ray`), shut down on
    exit; a cluster left by another test module is shut down first (it has neither the logical GPUs
    nor the stand-in's worker hook). Yields the ``ray`` module."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    start_ray(logical_gpus=logical_gpus)
    try:
        yield ray
    finally:
        ray.shutdown()


def entry_point_overrides(logical_gpus: int = 1) -> tuple[list[str], dict[str, str]]:
    """``main_ppo`` overrides and environment that give verl's own Ray cluster what Arctic's Ray server
    needs on CPU (the same as :func:`ray_init_kwargs`): ``protocol=ray``, logical GPUs, enough logical
    CPUs for Arctic's ``{"GPU": 1, "CPU": 4}`` bundles, and the worker set-up hook (via verl's
    ``ray_kwargs.ray_init``, which verl merges into its own ``runtime_env``)."""
    overrides = [
        "remote_backend.arctic.protocol=ray",
        "ray_kwargs.ray_init.num_cpus=16",
        f"++ray_kwargs.ray_init.num_gpus={max(1, int(logical_gpus))}",
        "++ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=arctic_standin.ray_setup.install_in_worker",
    ]
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (_TESTS, os.environ.get("PYTHONPATH", "")) if p),
        "DS_ACCELERATOR": "cpu",
    }
    return overrides, env
