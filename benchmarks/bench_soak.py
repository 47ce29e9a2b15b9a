"""Soak: does any process of a long GRPO run grow? (issue 26; a benchmark, not a timed test)

Runs ``python -m verl.remote_backend.main_ppo trainer.remote_backend=local`` for ``--steps``
GRPO steps on the tiny test model (CPU, a gsm8k subset, a reward that varies so every update
changes the weights; ``tests/support/remote_e2e.py``'s ``soak_overrides``) in a child process, and every
``--every`` steps samples each process of the run - the driver, Ray's task runner, the forwarder
(``WorkerDict``), the local engine (``EngineActor``), the rollout server
(``RemoteRolloutServer``), the agent-loop and reward workers, Ray's own daemons - for RSS, PSS,
open fds and threads, plus the bytes in Ray's object store
(:mod:`verl.remote_backend.testing.soak`). Step boundaries come from verl's file logger.

Per process it prints the first and last values and the least-squares slope per 100 steps over
the samples after ``--warmup`` steps (a Markdown table; ``--json`` writes everything, samples
included).

Usage: ``python -m benchmarks.bench_soak [--steps 300] [--every 10] [--warmup 50] [--json out.json]``
(~1-3 s a step on 2 cores, depending on the machine's load).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from benchmarks.common import e2e_helpers


def run_soak(
    workdir: Path,
    *,
    steps: int,
    every: int,
    batch_size: int = 4,
    rollout_n: int = 2,
    response_len: int = 16,
    train_prompts: int = 64,
) -> tuple[Any, Any]:
    """One long run through the entry point, sampled every ``every`` steps; returns
    ``(RunResult, StepSampler)``. Raises ``RuntimeError`` with the run's tail if it fails."""
    from verl.remote_backend.testing.soak import OBJECT_STORE, StepSampler

    e2e = e2e_helpers()
    model = e2e.build_model(workdir / "model")
    train, test = e2e.build_gsm8k(workdir / "data", max_train=train_prompts, max_test=4)
    overrides = e2e.soak_overrides(
        model=model,
        train=train,
        test=test,
        ckpt_dir=workdir / "ckpt",
        steps=steps,
        batch_size=batch_size,
        rollout_n=rollout_n,
        response_len=response_len,
    )
    sampler = StepSampler(every)

    def monitor(child_pid: int, metrics_path: Path) -> None:
        taken = len(sampler.sampler.samples) if sampler.sampler else 0
        sampler(child_pid, metrics_path)
        fresh = sampler.sampler.samples[taken:]
        if fresh:  # one progress line per sample: a long run shows where it is
            engine = next((s.rss_mb for s in fresh if s.role == "EngineActor"), float("nan"))
            store = next((s.rss_mb for s in fresh if s.role == OBJECT_STORE), float("nan"))
            print(
                f"[soak] step {sampler.last_step}: {len(fresh)} processes sampled, "
                f"engine RSS {engine:.1f} MiB, object store {store:.2f} MiB",
                flush=True,
            )

    result = e2e.run_entry(overrides, workdir=workdir / "run", monitor=monitor, timeout_s=max(900, 30 * steps))
    if result.returncode != 0:
        raise RuntimeError(f"soak run failed (rc={result.returncode}):\n{result.tail()}")
    return result, sampler


def summary(result: Any, sampler: Any, *, steps: int, warmup: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Everything the run measured, as JSON-ready data."""
    step_s = [float(m["data"]["timing_s/step"]) for m in result.metrics if "timing_s/step" in m["data"]]
    return {
        "command": "python -m benchmarks.bench_soak " + " ".join(f"--{k} {v}" for k, v in settings.items()),
        "machine": f"{platform.machine()}, {_cpus()} CPUs, python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "steps": steps,
        "warmup_steps": warmup,
        "wall_s": result.wall_s,
        "median_step_s": sorted(step_s)[len(step_s) // 2] if step_s else None,
        "reports": [r.to_dict() for r in sampler.report(warmup_steps=warmup)],
        "samples": [asdict(s) for s in (sampler.sampler.samples if sampler.sampler else [])],
    }


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="GRPO steps (default 300)")
    parser.add_argument("--every", type=int, default=10, help="sample every N steps (default 10)")
    parser.add_argument("--warmup", type=int, default=50, help="steps left out of the slope (default 50)")
    parser.add_argument("--batch-size", type=int, default=4, help="prompts per step (default 4)")
    parser.add_argument("--rollout-n", type=int, default=2, help="samples per prompt (default 2)")
    parser.add_argument("--response-len", type=int, default=16, help="max response tokens (default 16)")
    parser.add_argument("--json", type=Path, default=None, help="also write the summary and every sample here")
    parser.add_argument("--workdir", type=Path, default=None, help="run folder (default: a new temp folder)")
    args = parser.parse_args(argv)
    if args.warmup >= args.steps:
        parser.error(f"--warmup {args.warmup} leaves no step to fit (--steps {args.steps})")

    from verl.remote_backend.testing.soak import format_report

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_soak_"))
    result, sampler = run_soak(
        workdir,
        steps=args.steps,
        every=args.every,
        batch_size=args.batch_size,
        rollout_n=args.rollout_n,
        response_len=args.response_len,
    )
    settings = {"steps": args.steps, "every": args.every, "warmup": args.warmup}
    data = summary(result, sampler, steps=args.steps, warmup=args.warmup, settings=settings)
    print(
        f"`{data['command']}` - {data['machine']}, {data['date']}, {data['wall_s']:.0f} s in all, "
        f"median step {data['median_step_s']:.2f} s, run folder {workdir}"
    )
    print()
    print(format_report(sampler.report(warmup_steps=args.warmup)))
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
