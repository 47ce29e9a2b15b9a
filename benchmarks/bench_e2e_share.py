"""Row 3 - end-to-end share: the plugin's overhead as a fraction of a CPU GRPO step.

Runs ``python -m verl.remote_backend.main_ppo trainer.remote_backend=local`` (the
real entry point, verl's trainer, the local engine on CPU; GRPO on a gsm8k
subset, through ``tests/support/remote_e2e.py``'s helpers) and reads verl's logged
per-step metrics. Per step (the first, a warm-up, is dropped; medians over the
rest):

* ``perf/remote/overhead_s`` - the plugin's new per-step metric: the driver's
  wall time of ``compute_log_prob`` / ``update_actor`` (with verl's pad/unpad
  around them) minus the compute seconds the engine reported for them
  (dispatch, serialisation, forwarder and engine hops, layout conversion);
* the generation phase's replica hop - measured separately, in this process,
  as the extra time of the step's generate requests (same count, same
  ``max_tokens``) sent through a rollout server actor instead of straight to
  the engine client (:func:`replica_extra_seconds`);
* ``timing_s/step`` - verl's step time.

share = (overhead + replica hop) / step (target <= 10%). What is *not* counted
as the plugin's: verl's own driver work (reward, advantages, metrics) and its
agent loop - they are the same with any rollout engine.

Usage: ``python -m benchmarks.bench_e2e_share [--steps 5] [--hidden 256 --layers 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any, Optional

from benchmarks.common import Result, e2e_helpers, format_table

TARGET = 0.10


def run_grpo(
    workdir: Path,
    *,
    steps: int,
    hidden: int,
    layers: int,
    batch_size: int = 4,
    rollout_n: int = 4,
    response_len: int = 64,
) -> tuple[Any, dict[str, Any]]:
    """One GRPO run through the entry point; returns (RunResult, the settings used)."""
    e2e = e2e_helpers()
    from verl.remote_backend.testing.tiny_model import build_tiny_model

    model = build_tiny_model(str(workdir / "model"), hidden_size=hidden, num_layers=layers)
    train, test = e2e.build_gsm8k(workdir / "data", max_train=batch_size * (steps + 1), max_test=4)
    overrides = e2e.small_ci_overrides(
        model=model,
        train=train,
        test=test,
        ckpt_dir=workdir / "ckpt",
        steps=steps,
        batch_size=batch_size,
        rollout_n=rollout_n,
        response_len=response_len,
    )
    result = e2e.run_entry(overrides, workdir=workdir / "run")
    if result.returncode != 0:
        raise RuntimeError(f"GRPO run failed (rc={result.returncode}):\n{result.tail()}")
    settings = {"model": model, "requests": batch_size * rollout_n, "max_tokens": response_len}
    return result, settings


def replica_extra_seconds(model: str, *, requests: int, max_tokens: int, repeats: int = 7) -> tuple[float, float]:
    """(through the rollout server, straight to the engine client) median seconds of ``requests``
    concurrent generate calls. Needs Ray; starts and destroys its own local backend."""

    import ray

    from benchmarks.bench_forwarding import compose_config
    from benchmarks.common import time_interleaved
    from verl.remote_backend.registry import RemoteBackendRegistry
    from verl.workers.rollout.remote_rollout.server import RemoteRolloutServer

    config = compose_config(model, "local", [f"actor_rollout_ref.rollout.response_length={max_tokens}"])
    backend = RemoteBackendRegistry.create("local", config)
    try:
        server = (
            ray.remote(RemoteRolloutServer)
            .options(num_cpus=0, max_concurrency=1000)
            .remote(config, backend.reconnect_handle())
        )
        ray.get(server.ready.remote())
        params = {"max_tokens": max_tokens, "temperature": 0.0}
        prompts = [[5 + (i % 50), 17, 33, 9 + (i % 7)] for i in range(requests)]

        async def via_server() -> None:
            await asyncio.gather(
                *[server.generate.remote(f"r{i}", prompt_ids=p, sampling_params=params) for i, p in enumerate(prompts)]
            )

        async def direct() -> None:
            await asyncio.gather(*[backend.generate(p, params) for p in prompts])

        times = time_interleaved(
            {"server": lambda: asyncio.run(via_server()), "direct": lambda: asyncio.run(direct())}, repeats=repeats
        )
        ray.kill(server)
        return times["server"], times["direct"]
    finally:
        asyncio.run(backend.destroy())


def _median(metrics: list[dict[str, Any]], key: str) -> Optional[float]:
    values = [float(m[key]) for m in metrics if key in m]
    return statistics.median(values) if values else None


def run(
    *, steps: int = 5, hidden: int = 256, layers: int = 4, response_len: int = 64, replica_repeats: int = 7
) -> list[Result]:
    """The GRPO run, then the replica hop (needs Ray initialised in this process)."""
    workdir = Path(tempfile.mkdtemp(prefix="bench_e2e_"))
    result, settings = run_grpo(workdir, steps=steps, hidden=hidden, layers=layers, response_len=response_len)
    # the replica hop is timed after the run's processes are gone (they would share the CPUs)
    per_step = [entry["data"] for entry in result.metrics if entry["step"] >= 2] or [result.metrics[-1]["data"]]
    step_s = _median(per_step, "timing_s/step")
    overhead_s = _median(per_step, "perf/remote/overhead_s")
    compute_s = _median(per_step, "perf/remote/compute_s")
    wall_s = _median(per_step, "perf/remote/wall_s")
    gen_s = _median(per_step, "timing_s/gen")
    if step_s is None or overhead_s is None:
        raise RuntimeError(
            f"perf/remote/overhead_s or timing_s/step missing from the logged metrics: {sorted(per_step[0])}"
        )
    server_s, direct_s = replica_extra_seconds(
        settings["model"], requests=settings["requests"], max_tokens=settings["max_tokens"], repeats=replica_repeats
    )
    replica_s = max(0.0, server_s - direct_s)
    share = (overhead_s + replica_s) / step_s
    size = f"{settings['requests']} samples x {response_len} tokens, hidden={hidden} layers={layers}"
    return [
        Result(
            row="3 e2e share",
            case=f"GRPO step, local backend ({size}); steps 2-{steps} median",
            a=overhead_s + replica_s,
            a_label="plugin overhead s",
            b=step_s,
            b_label="step s",
            ratio=share,
            percent=True,
            target=f"<= {TARGET:.0%}",
            met=share <= TARGET,
            extra={
                "perf/remote/overhead_s": overhead_s,
                "perf/remote/compute_s": compute_s,
                "perf/remote/wall_s": wall_s,
                "timing_s/gen": gen_s,
                "replica_server_s": server_s,
                "replica_direct_s": direct_s,
            },
        ),
        Result(
            row="3 e2e share",
            case="of which: forwarded calls (perf/remote/overhead_s of perf/remote/wall_s)",
            a=overhead_s,
            a_label="overhead s",
            b=wall_s,
            b_label="wall s",
            ratio=None if not wall_s else overhead_s / wall_s,
            percent=True,
            note=f"engine compute {compute_s:.3f} s" if compute_s is not None else "",
        ),
        Result(
            row="3 e2e share",
            case=f"of which: replica hop ({settings['requests']} generate calls, server vs direct)",
            a=server_s,
            a_label="via server s",
            b=direct_s,
            b_label="direct s",
            ratio=server_s / direct_s,
            note=f"gen phase {gen_s:.3f} s" if gen_s is not None else "",
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--response-len", type=int, default=64)
    args = parser.parse_args(argv)

    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        results = run(steps=args.steps, hidden=args.hidden, layers=args.layers, response_len=args.response_len)
        print(format_table(results))
        for key, value in results[0].extra.items():
            print(f"  {key}: {value}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
