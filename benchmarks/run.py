"""Run every benchmark row and print one results table.

Usage (from the repository root)::

    python -m benchmarks.run            # full suite (a few minutes on a 2-core CPU machine)
    python -m benchmarks.run --quick    # smaller sizes, fewer repeats, no ~100M model
    python -m benchmarks.run --smoke    # tiny sizes, no thresholds (what the test suite runs)
    python -m benchmarks.run --rows 1,2 --out results.md

Rows: 1 forwarding overhead, 2 layout conversion, 3 end-to-end share,
4 sampling (tiny model: call overhead), 5 weight sync, 6 Arctic generation (row 6
starts the Arctic stand-in server as its own process), 7 the local engine on a
real model (SmolLM2-135M, gsm8k prompts, in this process; the tiny model in --smoke,
skipped when the model is absent); see each ``bench_*.py``. The process starts one
local Ray session for rows 1, 3 (replica hop), 4 and 5 and shuts it down at the
end; row 3's GRPO run is a child process with its own Ray session. torch runs
single-threaded in this driver, as in verl's trainer driver (a one-CPU Ray
actor); on a loaded 2-core machine multi-threaded kernels mostly measure the
neighbours.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from benchmarks.common import Result, format_table


@dataclass(frozen=True)
class Profile:
    """Sizes and repeats of one suite mode."""

    forwarding_sizes: list
    forwarding_repeats: int
    layout_sizes: list
    layout_repeats: int
    e2e_steps: int
    sampling_requests: int
    sampling_tokens: int
    weight_models: list
    weight_repeats: int
    arctic_model: tuple  # (hidden, layers) of row 6's random model


def _profiles() -> dict[str, Profile]:
    from benchmarks import bench_forwarding as fwd
    from benchmarks import bench_layout as lay
    from benchmarks import bench_weight_sync as ws

    return {
        "full": Profile(fwd.SIZES, 9, lay.SIZES, 9, 5, 64, 64, list(ws.MODELS), 5, (512, 4)),
        "quick": Profile(fwd.QUICK_SIZES, 5, lay.QUICK_SIZES, 5, 4, 64, 32, ws.SMOKE_MODELS, 3, (512, 4)),
        "smoke": Profile(fwd.SMOKE_SIZES, 2, lay.SMOKE_SIZES, 2, 2, 8, 8, ws.SMOKE_MODELS, 2, (64, 2)),
    }


def run_suite(
    mode: str = "full", rows: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7), *, log: Callable[[str], None] = print
) -> list[Result]:
    """Run the selected rows in ``mode`` (``full``, ``quick`` or ``smoke``) and return their results.

    Starts (and shuts down) a local Ray session when a selected row needs one.
    In ``smoke`` mode thresholds are not judged (``met`` is cleared).
    """
    import torch

    profile = _profiles()[mode]
    torch.set_num_threads(1)
    results: list[Result] = []
    needs_ray = any(r in rows for r in (1, 3, 4, 5))
    if needs_ray:
        import ray

        from benchmarks.null_backend import worker_env

        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": worker_env()})
    try:
        steps: list[tuple[int, str, Callable[[], list[Result]]]] = [
            (2, "layout conversion", lambda: _layout(profile)),
            (1, "forwarding overhead", lambda: _forwarding(profile)),
            (4, "sampling", lambda: _sampling(profile)),
            (5, "weight sync", lambda: _weight_sync(profile)),
            (3, "end-to-end share", lambda: _e2e(profile, mode)),
            (6, "arctic generation", lambda: _arctic_generate(profile)),
            (7, "real model", lambda: _real_model(mode)),
        ]
        for row, title, fn in steps:
            if row not in rows:
                continue
            start = time.perf_counter()
            log(f"[benchmarks] row {row}: {title} ...")
            out = fn()
            log(f"[benchmarks] row {row}: done in {time.perf_counter() - start:.0f}s")
            results.extend(out)
    finally:
        if needs_ray:
            import ray

            ray.shutdown()
    if mode == "smoke":
        for r in results:
            r.met = None
    return sorted(results, key=lambda r: r.row)


def _layout(p: Profile) -> list[Result]:
    from benchmarks.bench_layout import run

    return run(p.layout_sizes, repeats=p.layout_repeats)


def _forwarding(p: Profile) -> list[Result]:
    from benchmarks.bench_forwarding import run

    return run(p.forwarding_sizes, repeats=p.forwarding_repeats)


def _sampling(p: Profile) -> list[Result]:
    from benchmarks.bench_sampling import run

    return run(requests=p.sampling_requests, max_tokens=p.sampling_tokens, verbose=False)


def _weight_sync(p: Profile) -> list[Result]:
    from benchmarks.bench_weight_sync import run

    return run(p.weight_models, repeats=p.weight_repeats)


def _arctic_generate(p: Profile) -> list[Result]:
    from benchmarks.bench_arctic_generate import run

    hidden, layers = p.arctic_model
    return run(requests=p.sampling_requests, max_tokens=p.sampling_tokens, hidden=hidden, layers=layers, verbose=False)


def _real_model(mode: str) -> list[Result]:
    from benchmarks.bench_real_model import run

    threads = 2  # the comparison: engine and HF generate with the same two threads
    if mode == "smoke":
        return run(smoke=True, threads=threads, verbose=False)
    if mode == "quick":
        return run(prompts=16, max_tokens=32, prefill_prompts=32, train_rows=8, threads=threads, verbose=False)
    return run(threads=threads, verbose=False)


def _e2e(p: Profile, mode: str) -> list[Result]:
    from benchmarks.bench_e2e_share import run

    if mode == "smoke":
        return run(steps=p.e2e_steps, hidden=64, layers=2, response_len=16, replica_repeats=2)
    return run(steps=p.e2e_steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    group.add_argument("--smoke", action="store_true", help="tiny sizes, no thresholds")
    parser.add_argument("--rows", default="1,2,3,4,5,6,7", help="comma-separated row numbers (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown table here")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    rows = tuple(int(r) for r in args.rows.split(",") if r.strip())

    start = time.perf_counter()
    results = run_suite(mode, rows)
    command = "python -m benchmarks.run" + {"full": "", "quick": " --quick", "smoke": " --smoke"}[mode]
    if args.rows != "1,2,3,4,5,6,7":
        command += f" --rows {args.rows}"
    header = (
        f"`{command}` - {platform.machine()}, {_cpu_count()} CPUs, python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {time.perf_counter() - start:.0f}s"
    )
    table = format_table(results)
    print()
    print(header)
    print()
    print(table)
    if args.out is not None:
        args.out.write_text(f"{header}\n\n{table}\n")
    if args.json is not None:
        args.json.write_text(json.dumps({"command": command, "results": [asdict(r) for r in results]}, indent=1))
    missed = [r for r in results if r.met is False]
    if missed:
        print(f"\n{len(missed)} target(s) missed: " + "; ".join(f"{r.row} {r.case}" for r in missed))
    return 0


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


if __name__ == "__main__":
    sys.exit(main())
