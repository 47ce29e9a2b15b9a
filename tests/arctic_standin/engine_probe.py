"""Start Arctic's ``DeepSpeedWorker`` jobs in this process on the real DeepSpeed CPU engine and report (tests only).

``python engine_probe.py '<json>'`` with ``{"jobs": [<job_config>, ...], "dtype": "float32"|"bfloat16",
"step": bool, "zero_grad": bool, "save_dir": str|null, "packed": {...}|null, "zorro_temperature": float|null}``:
each job config is what Arctic's ``/initialize`` hands a worker (``ArcticClientConfig.to_onprem(job_type)``). For
each job it runs :class:`~.cpu_worker.CpuDeepSpeedWorker` ``.initialize`` (Arctic's own, on DeepSpeed's CPU
accelerator) and, when asked, one forward / backward / ``step`` through the engine and Arctic's ``save_checkpoint``.
Prints one JSON line per job: ``{"ok": bool, "error": "<first line of the exception>", "grad_norm": float|null,
"files": [...], "packed_gap": float|null, ...}``. One process, one gloo rank: ``init_distributed`` runs once for all
jobs.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _probe(job: dict, request: dict, index: int) -> dict:
    import torch

    from arctic_standin.cpu_worker import CpuDeepSpeedWorker

    worker = CpuDeepSpeedWorker(0, 1, 0)
    out: dict = {"job_type": job.get("job_type")}
    try:
        worker.initialize("127.0.0.1", dict(job))
    except Exception as exc:  # the point of the probe: report what the real engine refuses
        out.update(
            ok=False, error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        )
        return out
    engine = worker.engine
    out.update(ok=True, stage=int(engine.zero_optimization_stage()), dtype=str(next(engine.module.parameters()).dtype))
    ids = torch.arange(3, 13).reshape(1, 10)
    if request.get("step") and job.get("job_type") == "training":
        engine.train()
        for _ in range(engine.gradient_accumulation_steps()):
            loss = engine(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean()
            if request.get("zero_grad"):  # GRPO with equal rewards in every group: an all-zero gradient
                loss = loss * 0.0
            engine.backward(loss)
            worker._engine_step()
        norm = engine.get_global_grad_norm()
        out["grad_norm"] = None if norm is None else float(norm)
        out["global_steps"] = int(engine.global_steps)
        out["lr"] = float(engine.get_lr()[0])
    if request.get("save_dir") and job.get("job_type") == "training":
        path = os.path.join(request["save_dir"], f"job{index}")
        saved = worker.save_checkpoint(path)
        out["saved"] = saved
        out["files"] = sorted(str(p.relative_to(path)) for p in pathlib.Path(path).rglob("*") if p.is_file())
    packed = request.get("packed")
    if packed:  # two sequences in one row, as Arctic's pipeline packs a micro-batch: does the second see the first?
        a, b = torch.tensor([packed["a"]]), torch.tensor([packed["b"]])
        row = torch.cat([a, b], 1)
        pos = torch.cat([torch.arange(a.shape[1]), torch.arange(b.shape[1])]).unsqueeze(0)
        engine.eval()
        with torch.no_grad():
            together = engine(input_ids=row, position_ids=pos, attention_mask=torch.ones_like(row)).logits[
                :, a.shape[1] :
            ]
            alone = engine(
                input_ids=b, position_ids=torch.arange(b.shape[1]).unsqueeze(0), attention_mask=torch.ones_like(b)
            ).logits
        out["packed_gap"] = float((together.float() - alone.float()).abs().max())
    zorro = request.get("zorro")
    if zorro:  # ZoRRo's forward: [B, S] padded in, response log-probs out, at the call's temperature?
        full = torch.tensor([zorro["ids"]])
        engine.eval()
        with torch.no_grad():
            res = engine(
                input_ids=full, attention_mask=torch.ones_like(full), temperature=float(zorro["call_temperature"])
            )
        out["zorro_logprobs"] = res.logprobs.reshape(-1).tolist()
    return out


def main() -> None:
    request = json.loads(sys.argv[1])
    os.environ["ARCTIC_STANDIN_DTYPE"] = request.get("dtype", "float32")
    for index, job in enumerate(request["jobs"]):
        try:
            result = _probe(job, request, index)
        except Exception as exc:
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        print("PROBE " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
