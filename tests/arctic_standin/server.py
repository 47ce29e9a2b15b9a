"""Arctic RL's own HTTP server, run on CPU with only its GPU engines replaced (tests only).

This starts ``arctic_platform.common.http_server.main()`` from arctic-platform 0.1.4 -
its FastAPI app, routes, request models, job bookkeeping, batch splitting / merging /
reordering, ``DeepSpeedWorker`` Ray actors, processing pipeline, losses, checkpoint and
weight-sync handling - after swapping in, before it runs:

* ``DeepSpeedWorker`` -> :class:`.cpu_worker.CpuDeepSpeedWorker` (Arctic's class, its real
  ``initialize`` run on DeepSpeed's CPU engine with a few scoped CPU patches);
* the vLLM ``ReplicaPool`` and ``build_model_config`` -> :mod:`.cpu_sampler`;
* ``init_ray_cluster`` -> a private local Ray cluster that declares the requested GPUs as
  logical resources (placement groups and ``num_gpus`` requests then schedule as on GPUs).

See ``README.md`` beside this file for what each replacement preserves. The command line
is the real server's (``--host --port --training-gpus --sampling-gpus --log-prob-gpus
--log-prob-engine --colocate ...``), so the adapter launches it as it launches the real one.

Test-only additions, outside Arctic's routes: ``POST /_standin/fault`` arms a fault for the
next call of an endpoint (HTTP error, hang, process exit, or a response with a key
removed / a tensor cut short / NaNs) and ``GET /_standin/calls`` counts calls per endpoint.

Run: ``python tests/arctic_standin/server.py --host 127.0.0.1 --port 8123 --training-gpus 1 --sampling-gpus 1``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sys
from typing import Any, Optional

_TESTS = str(pathlib.Path(__file__).resolve().parents[1])
if __package__ in (None, ""):  # run as a script: import the package by path (and let Ray workers do the same)
    sys.path.insert(0, _TESTS)
    os.environ["PYTHONPATH"] = os.pathsep.join([_TESTS, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)

OCTET = "application/octet-stream"
# DeepSpeed picks its accelerator on first use: the CPU one, here and in every Ray worker of the server.
os.environ.setdefault("DS_ACCELERATOR", "cpu")
_WORKER_ENV = ("PYTHONPATH", "DS_ACCELERATOR", "ARCTIC_STANDIN_DTYPE", "ARCTIC_STANDIN_THREADS")


def _gpu_counts(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    for name in ("--training-gpus", "--sampling-gpus", "--log-prob-gpus"):
        parser.add_argument(name, type=int, default=0)
    args, _ = parser.parse_known_args(argv)
    return args.training_gpus + args.sampling_gpus + args.log_prob_gpus


def _local_ray(logical_gpus: int):
    def init_ray_cluster(auto_attach: bool = True) -> None:
        import ray

        if not ray.is_initialized():  # never attach to another cluster on this machine (e.g. the tests' own)
            ray.init(
                address="local",
                num_cpus=16,
                num_gpus=max(1, logical_gpus),
                include_dashboard=False,
                log_to_driver=True,
                runtime_env={"env_vars": {k: os.environ[k] for k in _WORKER_ENV if k in os.environ}},
            )

    return init_ray_cluster


def install_substitutions(argv: list[str]) -> Any:
    """Swap Arctic's GPU-only pieces for the CPU doubles; returns Arctic's ``http_server`` module."""
    from arctic_platform.common import http_server

    from arctic_standin import cpu_sampler, cpu_worker

    cpu_worker.install()
    http_server._replica_pool_cls = lambda: cpu_sampler.CpuReplicaPool
    http_server.build_model_config = cpu_sampler.build_model_config
    http_server.init_ray_cluster = _local_ray(_gpu_counts(argv))
    return http_server


def install_fault_injection(app: Any) -> None:
    """``/_standin/fault`` + ``/_standin/calls`` and the middleware applying armed faults."""
    from arctic_platform import wire
    from fastapi import Body
    from fastapi.responses import JSONResponse
    from starlette.responses import Response

    faults: dict[str, dict] = {}
    calls: dict[str, int] = {}

    @app.post("/_standin/fault")
    async def arm_fault(body: dict = Body(...)):
        faults[body["endpoint"]] = dict(body)
        return {"armed": body["endpoint"]}

    @app.get("/_standin/calls")
    async def call_counts():
        return dict(calls)

    @app.middleware("http")
    async def inject(request, call_next):
        path = request.url.path
        if path.startswith("/_standin"):
            return await call_next(request)
        calls[path] = calls.get(path, 0) + 1
        armed = faults.pop(path, None)
        kind = armed["kind"] if armed else None
        if kind == "http_error":
            return JSONResponse(
                {"detail": armed.get("detail", "injected failure")}, status_code=int(armed.get("status", 500))
            )
        if kind == "hang":
            await asyncio.sleep(float(armed.get("seconds", 3600)))
        if kind == "exit":
            os._exit(17)
        response = await call_next(request)
        if kind not in ("missing_key", "wrong_shape", "nan"):
            return response
        body = b"".join([chunk async for chunk in response.body_iterator])
        octet = response.headers.get("content-type", "").startswith(OCTET)
        payload = wire.loads(body) if octet else json.loads(body)
        _corrupt(payload, kind, armed.get("key"))
        if octet:
            return Response(wire.dumps(payload), status_code=response.status_code, media_type=OCTET)
        return JSONResponse(payload, status_code=response.status_code)


def _corrupt(payload: dict, kind: str, key: Optional[str]) -> None:
    """Damage ``key`` wherever a response carries it: ``batch``, ``metrics`` or each generate result."""
    import torch

    targets = [payload.get("batch"), payload.get("metrics")] + list(payload.get("results") or [])
    for target in targets:
        if not isinstance(target, dict) or key not in target:
            continue
        if kind == "missing_key":
            target.pop(key)
        elif kind == "wrong_shape" and torch.is_tensor(target[key]):
            target[key] = target[key][:, :-1].contiguous()
        elif kind == "nan" and torch.is_tensor(target[key]):
            target[key] = torch.full_like(target[key], float("nan"))


def main(argv: Optional[list[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--host" not in argv:
        argv = ["--host", "127.0.0.1"] + argv  # Arctic's default is "localhost"; ours is the loopback address
    http_server = install_substitutions(argv)
    install_fault_injection(http_server.app)
    sys.argv = [sys.argv[0]] + argv
    http_server.main()


if __name__ == "__main__":
    main()
