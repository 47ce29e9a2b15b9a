"""A CPU stand-in for the Arctic RL HTTP server (tests only).

Speaks the real server's protocol (``arctic_platform.common.http_server`` of
arctic-platform 0.1.4): the same endpoints, query parameters, pydantic request
models (imported from ``arctic_platform.common.utils.server_models``) and the
same DSSST1 safetensors wire (``arctic_platform.wire``) for octet bodies and
answers. Instead of DeepSpeed + vLLM on GPUs it drives the ``local`` engine
in-process (see ``bridge.py``). It accepts the real server's command line, so
the adapter can launch it like the real one.

Test-only extra: ``POST /_standin/fault`` arms a fault for the next call(s) of an
endpoint (HTTP error with a detail, a missing key, a wrong shape, a hang, or the
process exiting) so failure handling can be tested end to end.

Run: ``python tests/arctic_standin/server.py --host 127.0.0.1 --port 8123 --training-gpus 1 --sampling-gpus 1``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import sys
import threading
from typing import Any, Optional


import torch
import uvicorn
from arctic_platform import wire
from arctic_platform.common.utils.batch import unpack_batch
from arctic_platform.common.utils.server_models import (
    GenerateRequest,
    JobConfig,
    LoadCheckpointRequest,
    OperationRequest,
    SaveRequest,
    StepRequest,
    WeightSyncRequest,
)
from fastapi import Body, FastAPI, HTTPException, Response
from starlette.concurrency import run_in_threadpool

if __package__ in (None, ""):  # run as a script: import the sibling module by path
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from arctic_standin import bridge
else:
    from . import bridge

OCTET = "application/octet-stream"


class StandinState:
    """Jobs, the engine, sampler sleep state and armed faults."""

    def __init__(self, training_gpus: int, sampling_gpus: int, log_prob_gpus: int, colocate: bool) -> None:
        self.gpus = {"training": training_gpus, "sampling": sampling_gpus, "log_prob": log_prob_gpus}
        self.colocate = colocate
        self.jobs: dict[int, dict] = {}
        self.next_job_id = 1
        self.engine = None
        self.sampler_asleep = False
        self.faults: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.calls: dict[str, int] = {}


def create_app(state: StandinState) -> FastAPI:
    app = FastAPI(title="Arctic RL stand-in (CPU, local engine)")
    app.state.standin = state

    def verify(job_id: int, types: list[str]) -> dict:
        info = state.jobs.get(job_id)
        if info is None:
            raise HTTPException(404, f"Job {job_id} not found")
        if info["job_type"] not in types:
            raise HTTPException(400, f"Job {job_id} is not a {', '.join(types)} job")
        return info

    def engine():
        if state.engine is None:
            raise HTTPException(409, "no training job: the engine is created with the training job")
        return state.engine

    async def fault(endpoint: str) -> Optional[dict]:
        state.calls[endpoint] = state.calls.get(endpoint, 0) + 1
        armed = state.faults.get(endpoint)
        if armed is None:
            return None
        armed["count"] -= 1
        if armed["count"] <= 0:
            state.faults.pop(endpoint, None)
        kind = armed["kind"]
        if kind == "http_error":
            raise HTTPException(int(armed.get("status", 500)), armed.get("detail", "injected failure"))
        if kind == "hang":
            await asyncio.sleep(float(armed.get("seconds", 3600)))
        if kind == "exit":
            os._exit(17)
        return armed

    def octet(obj: Any) -> Response:
        return Response(content=wire.dumps(obj), media_type=OCTET)

    async def run(fn, *args, **kwargs):
        try:
            return await run_in_threadpool(fn, *args, **kwargs)
        except bridge.BridgeError as exc:
            raise HTTPException(400, str(exc)) from exc

    @app.get("/health")
    async def health():
        return {"status": "OK"}

    @app.post("/_standin/fault")
    async def arm_fault(body: dict = Body(...)):
        state.faults[body["endpoint"]] = {"count": 1, **body}
        return {"armed": body["endpoint"]}

    @app.get("/_standin/calls")
    async def calls():
        return dict(state.calls)

    @app.post("/initialize")
    async def initialize(job_config: JobConfig = Body(...)):
        job_type = job_config.job_type
        if job_type not in state.gpus:
            raise HTTPException(400, f"Unknown job type: {job_type}")
        if state.gpus[job_type] == 0:
            raise HTTPException(400, f"No {job_type.replace('_', '-')} GPUs configured")
        if any(j["job_type"] == job_type for j in state.jobs.values()):
            raise HTTPException(409, f"{job_type} job already running")
        info = {"job_id": state.next_job_id, "job_type": job_type, "model_name": job_config.model_name, "status": "RUNNING"}
        if job_type == "training":
            if job_config.checkpoint_path is None:
                raise HTTPException(400, "checkpoint_path is required for training jobs")
            need_ref = any(j["job_type"] == "log_prob" for j in state.jobs.values())
            state.engine = await run(bridge.build_engine, job_config.model_dump(), need_ref=need_ref)
            ckpt = pathlib.Path(job_config.checkpoint_path) / f"arctic_rl_job_{info['job_id']}"
            ckpt.mkdir(parents=True, exist_ok=True)
            info["checkpoint_path"] = str(ckpt)
        state.jobs[info["job_id"]] = info
        state.next_job_id += 1
        return {"job_id": info["job_id"], "job_type": job_type, "running": True}

    @app.post("/destroy")
    async def destroy(job_id: int, job_type: str = Body(..., embed=True)):
        info = state.jobs.pop(job_id, None)
        if info is None:
            raise HTTPException(404, f"Job {job_id} not found")
        if info["job_type"] == "training":
            state.engine = None
        return {"job_id": job_id}

    @app.get("/job/{job_id}")
    async def job(job_id: int):
        info = state.jobs.get(job_id)
        if info is None:
            raise HTTPException(404, f"Job {job_id} not found")
        return info

    @app.get("/status")
    async def status():
        return {**{f"{k}_gpus": v for k, v in state.gpus.items()}, "jobs": state.jobs}

    @app.post("/forward")
    async def forward(job_id: int, body: bytes = Body(..., media_type=OCTET)):
        info = verify(job_id, ["training", "log_prob"])
        armed = await fault("/forward")
        _, batch, meta, processing = unpack_batch(wire.loads(body))
        out = await run(bridge.forward, engine(), batch, meta, processing, ref=info["job_type"] == "log_prob")
        _corrupt(armed, out["batch"])
        return octet({"job_id": job_id, **out})

    @app.post("/forward-backward")
    async def forward_backward(job_id: int, body: bytes = Body(..., media_type=OCTET)):
        verify(job_id, ["training"])
        armed = await fault("/forward-backward")
        _, batch, meta, processing = unpack_batch(wire.loads(body))
        meta = {**meta, "dp_size": 1}
        out = await run(bridge.forward_backward, engine(), batch, meta, processing)
        _corrupt(armed, out["metrics"])
        return octet({"job_id": job_id, **out})

    @app.post("/step")
    async def step(job_id: int, request: StepRequest = Body(default=StepRequest())):
        verify(job_id, ["training"])
        armed = await fault("/step")
        out = await run(bridge.step, engine())
        _corrupt(armed, out["metrics"])
        return {"job_id": job_id, **out}

    @app.post("/save")
    async def save(job_id: int, request: SaveRequest = Body(default=SaveRequest())):
        info = verify(job_id, ["training"])
        await fault("/save")
        root = request.path or info["checkpoint_path"]
        path = os.path.join(root, f"checkpoint-{int(request.step)}") if request.step is not None else root
        written = await run(engine().save_checkpoint, path, request.step)
        if request.step is not None:
            pathlib.Path(root, "latest").write_text(str(int(request.step)))
        return {"job_id": job_id, "path": written, "hf_path": None, "global_step": request.step}

    @app.post("/load-checkpoint")
    async def load_checkpoint(job_id: int, request: LoadCheckpointRequest = Body(default=LoadCheckpointRequest())):
        info = verify(job_id, ["training"])
        await fault("/load-checkpoint")
        path = request.path or info["checkpoint_path"]
        step = request.step
        if step is None and (pathlib.Path(path) / "latest").is_file():
            step = int((pathlib.Path(path) / "latest").read_text().strip())
        if step is not None:
            path = os.path.join(path, f"checkpoint-{int(step)}")
        try:
            out = await run(engine().load_checkpoint, path, step)
        except Exception as exc:  # CheckpointError and friends: the caller must see why
            raise HTTPException(400, f"cannot load checkpoint {path}: {exc}") from exc
        return {"job_id": job_id, "path": path, "global_step": out.get("step")}

    @app.post("/generate")
    async def generate(job_id: int, body: bytes = Body(..., media_type=OCTET)):
        verify(job_id, ["sampling"])
        armed = await fault("/generate")
        if state.sampler_asleep:
            raise HTTPException(409, "sampling engine is asleep (sleep-inference); wake it before generating")
        request = GenerateRequest(**wire.loads(body))
        try:
            results = await run(bridge.generate, engine(), request.prompts, request.sampling_params)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from exc
        if armed is not None and armed["kind"] == "missing_key":
            for r in results:
                r.pop(armed.get("key", "token_ids"), None)
        return octet({"job_id": job_id, "results": results})

    async def weight_sync(job_id: int, request: WeightSyncRequest) -> dict:
        verify(request.source_sub_job_id, ["training"])
        verify(request.target_sub_job_ids[0], ["sampling"])
        await fault("/weight-sync")
        out = await run(engine().sync_sampler_weights)
        return {"job_id": job_id, "status": "ok", **out}

    @app.post("/weight-sync")
    async def weight_sync_route(job_id: int, request: WeightSyncRequest = Body(...)):
        return await weight_sync(job_id, request)

    async def sleep_inference(job_id: int, level: int = 1) -> dict:
        verify(job_id, ["sampling"])
        state.sampler_asleep = True
        return {"job_id": job_id, "sampling": {"level": level}}

    async def wake_inference(job_id: int, tags: Any = None) -> dict:
        verify(job_id, ["sampling"])
        tags = tags.get("tags") if isinstance(tags, dict) else tags
        if tags is None or "kv_cache" in tags:
            state.sampler_asleep = False
        return {"job_id": job_id, "sampling": {"tags": tags}}

    @app.post("/sleep-inference")
    async def sleep_route(job_id: int, level: int = 1, body: Optional[dict] = Body(None)):
        if isinstance(body, dict) and body.get("level") is not None:
            level = int(body["level"])
        return await sleep_inference(job_id, level)

    @app.post("/wake-inference")
    async def wake_route(job_id: int, body: Any = Body(None)):
        return await wake_inference(job_id, body)

    @app.post("/reset-prefix-cache")
    async def reset_prefix_cache(job_id: int, body: Optional[dict] = Body(None)):
        verify(job_id, ["sampling"])
        return {"job_id": job_id, "sampling": True}

    @app.post("/sleep-training")
    async def sleep_training(job_id: int, body: Optional[dict] = Body(None)):
        verify(job_id, ["training"])
        return {"job_id": job_id, "workers": []}

    @app.post("/wake-training")
    async def wake_training(job_id: int, body: Optional[dict] = Body(None)):
        verify(job_id, ["training"])
        return {"job_id": job_id, "workers": []}

    @app.post("/operation")
    async def operation(job_id: int, request: OperationRequest = Body(...)):
        payload = request.payload or {}
        if request.operation_type == "weight-sync":
            return await weight_sync(job_id, WeightSyncRequest(**payload))
        if request.operation_type == "reset-prefix-cache":
            return await reset_prefix_cache(job_id, payload)
        if request.operation_type == "sleep-inference":
            return await sleep_inference(job_id, payload.get("level", 1))
        if request.operation_type == "wake-inference":
            return await wake_inference(job_id, payload.get("tags"))
        raise HTTPException(status_code=400, detail=f"unknown operation_type {request.operation_type!r}")

    return app


def _corrupt(armed: Optional[dict], target: dict) -> None:
    """Apply a response-shape fault (missing key / wrong shape / NaN) to an outgoing dict."""
    if armed is None:
        return
    key = armed.get("key")
    if armed["kind"] == "missing_key":
        target.pop(key, None)
    elif armed["kind"] == "wrong_shape" and torch.is_tensor(target.get(key)):
        target[key] = target[key][:, :-1].contiguous()
    elif armed["kind"] == "nan" and torch.is_tensor(target.get(key)):
        target[key] = torch.full_like(target[key], float("nan"))


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Arctic RL stand-in server (CPU, local engine)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", "-p", type=int, default=7000)
    parser.add_argument("--training-gpus", type=int, default=0)
    parser.add_argument("--sampling-gpus", type=int, default=0)
    parser.add_argument("--log-prob-gpus", type=int, default=0)
    parser.add_argument("--log-prob-engine", default="deepspeed", choices=["vllm", "deepspeed"])
    parser.add_argument("--colocate", action="store_true")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--no-ray-auto-attach", dest="ray_auto_attach", action="store_false")
    args = parser.parse_args(argv)
    if args.training_gpus + args.sampling_gpus + args.log_prob_gpus == 0:
        parser.error("At least one of --training-gpus, --sampling-gpus, --log-prob-gpus must be > 0")
    # One intra-op thread, as the local backend's Ray actor (num_cpus=1) uses: same reduction order.
    torch.set_num_threads(int(os.environ.get("ARCTIC_STANDIN_THREADS", "1")))
    state = StandinState(args.training_gpus, args.sampling_gpus, args.log_prob_gpus, args.colocate)
    uvicorn.run(create_app(state), host=args.host, port=args.port, access_log=args.verbose, log_level="warning")


if __name__ == "__main__":
    main()
