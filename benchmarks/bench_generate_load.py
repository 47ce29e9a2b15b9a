"""Load: concurrent ``generate`` requests through the rollout server actor, 2,048 vs 64 (issue 26).

Starts the local engine (``LocalBackend``, Ray, CPU, the tiny Qwen2 model) and one
``RemoteRolloutServer`` actor with verl's replica concurrency (1,000), the path verl's agent loop
uses, and sends bursts of ``--small`` and ``--large`` concurrent requests (distinct prompts and
seeds, ``--max-tokens`` each). Per burst: latency p50 / p99 (submission to answer, from the
caller) and generated tokens/s. Standalone (not in ``benchmarks.run``); the correctness side of
the same load is ``tests/integration/test_generate_load.py``.

Usage: ``python -m benchmarks.bench_generate_load [--small 64] [--large 2048] [--max-tokens 8]``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from typing import Any

from benchmarks.common import Result, format_table


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def _burst(server: Any, n: int, max_tokens: int, offset: int) -> tuple[float, list[float], int]:
    """(wall s, sorted latencies s, tokens generated) of ``n`` requests sent at once."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    tokens = 0

    async def one(ref: Any, submitted: float) -> None:
        nonlocal tokens
        out = await ref
        latencies.append(loop.time() - submitted)
        tokens += len(out.token_ids)

    start = loop.time()
    waits = []
    for i in range(offset, offset + n):
        params = {"max_tokens": max_tokens, "temperature": 1.0, "seed": i}
        prompt = [3 + (i % 500), 3 + (i // 500) % 500, 17, 9]
        waits.append(one(server.generate.remote(f"b{i}", prompt_ids=prompt, sampling_params=params), loop.time()))
    await asyncio.gather(*waits)
    return loop.time() - start, sorted(latencies), tokens


def run(*, small: int = 64, large: int = 2048, max_tokens: int = 8) -> list[Result]:
    """Both bursts (after a warm-up burst of ``small``). Needs Ray initialised in this process."""
    import ray

    from benchmarks.bench_forwarding import compose_config
    from verl.remote_backend.registry import RemoteBackendRegistry
    from verl.remote_backend.testing.tiny_model import build_tiny_model
    from verl.workers.rollout.remote_rollout.server import RemoteRolloutServer

    model = build_tiny_model(tempfile.mkdtemp(prefix="bench_load_"))
    config = compose_config(model, "local", [f"actor_rollout_ref.rollout.response_length={max_tokens}"])
    backend = RemoteBackendRegistry.create("local", config)
    server = (
        ray.remote(RemoteRolloutServer)
        .options(num_cpus=0, max_concurrency=1000)
        .remote(config, backend.reconnect_handle())
    )
    try:
        ray.get(server.ready.remote())

        async def measure() -> dict[int, tuple[float, list[float], int]]:
            await _burst(server, small, max_tokens, 10**6)  # warm-up
            return {n: await _burst(server, n, max_tokens, 0) for n in (small, large)}

        out = asyncio.run(measure())
    finally:
        ray.kill(server)
        asyncio.run(backend.destroy())
    rows = []
    for n, (wall, lat, tokens) in out.items():
        rows.append(
            Result(
                row="9 load",
                case=f"{n} concurrent generate via the rollout server, max_tokens={max_tokens}, tiny model",
                a=_percentile(lat, 0.5),
                a_label="latency p50 s",
                b=_percentile(lat, 0.99),
                b_label="p99 s",
                note=f"{tokens / wall:,.0f} tok/s, burst {wall:.2f} s",
                extra={"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall},
            )
        )
    small_tps, large_tps = (out[n][2] / out[n][0] for n in (small, large))
    rows.append(
        Result(
            row="9 load",
            case=f"tokens/s at {large} vs {small} concurrent",
            a=large_tps,
            a_label=f"{large} tok/s",
            b=small_tps,
            b_label=f"{small} tok/s",
            ratio=large_tps / small_tps,
        )
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=64)
    parser.add_argument("--large", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()

    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        start = time.monotonic()
        results = run(small=args.small, large=args.large, max_tokens=args.max_tokens)
        print(format_table(results))
        print(f"({time.monotonic() - start:.0f} s)")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
