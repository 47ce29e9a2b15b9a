"""Row 4 - sampling throughput of the local backend: 64 concurrent requests, batched vs one at a time.

Starts the real engine actor through ``LocalBackend`` (Ray, CPU) on the tiny
Qwen2 model and sends the same 64 ``generate`` requests twice:

* **batched** - all at once with ``asyncio.gather`` (what verl's agent loop does);
  the engine's actor decodes them together;
* **one at a time** - each awaited before the next is sent (``max_batch_size=1``
  behaviour from the caller's side).

Usage::

    python -m benchmarks.bench_sampling [--requests 64] [--max-tokens 64] [--model DIR]

Prints generated tokens/s for both modes and their ratio (target >= 4x). Not a
test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from typing import Optional

from benchmarks.common import Result, format_table

TARGET = 4.0


def run(
    *,
    requests: int = 64,
    max_tokens: int = 64,
    temperature: float = 1.0,
    model: Optional[str] = None,
    num_cpus: float = 1,
    verbose: bool = True,
) -> list[Result]:
    """Both modes once (after a warm-up request). Needs Ray initialised in this process."""
    from omegaconf import OmegaConf

    from verl.remote_backend.registry import RemoteBackendRegistry
    from verl.remote_backend.testing.tiny_model import build_tiny_model

    model = model or build_tiny_model(tempfile.mkdtemp(prefix="bench_tiny_"))
    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"path": model}, "actor": {"optim": {"lr": 1e-6}}},
            "remote_backend": {"local": {"num_cpus": num_cpus, "max_batch_size": requests}},
        }
    )
    backend = RemoteBackendRegistry.create("local", cfg)
    # Rows may stop early at EOS; tokens/s counts the tokens actually generated.
    params = {"max_tokens": max_tokens, "temperature": temperature, "top_p": 1.0}
    prompts = [[5 + (i % 50), 17, 33, 9 + (i % 7)] for i in range(requests)]

    async def batched() -> int:
        outs = await asyncio.gather(*[backend.generate(p, params) for p in prompts])
        return sum(len(o.token_ids) for o in outs)

    async def sequential() -> int:
        total = 0
        for p in prompts:
            total += len((await backend.generate(p, params)).token_ids)
        return total

    async def measure() -> list[Result]:
        await backend.generate(prompts[0], {"max_tokens": 4})  # warm-up
        t0 = time.perf_counter()
        tok_b = await batched()
        t_b = time.perf_counter() - t0
        t0 = time.perf_counter()
        tok_s = await sequential()
        t_s = time.perf_counter() - t0
        info = await backend.reconnect_handle()["actor"].info.remote()
        speedup = (tok_b / t_b) / (tok_s / t_s)
        if verbose:
            print(f"requests={requests} max_tokens={max_tokens} temperature={temperature}")
            print(f"batched:        {tok_b:6d} tokens in {t_b:7.2f}s = {tok_b / t_b:9.1f} tokens/s")
            print(f"one at a time:  {tok_s:6d} tokens in {t_s:7.2f}s = {tok_s / t_s:9.1f} tokens/s")
            print(f"speed-up (tokens/s batched / one at a time): {speedup:.1f}x")
            print(f"engine decode batches run so far: {info['batches_run']}")
        return [
            Result(
                row="4 sampling",
                case=f"{requests} concurrent generate, max_tokens={max_tokens}, tiny model: call overhead (tokens/s)",
                a=tok_b / t_b,
                a_label="batched tok/s",
                b=tok_s / t_s,
                b_label="one-at-a-time tok/s",
                ratio=speedup,
                target=f">= {TARGET:g}x",
                met=speedup >= TARGET,
            )
        ]

    try:
        return asyncio.run(measure())
    finally:
        asyncio.run(backend.destroy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--model", default=None, help="HF model dir (default: build the tiny model)")
    parser.add_argument("--num-cpus", type=float, default=1, help="CPUs (torch threads) for the engine actor")
    args = parser.parse_args()

    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        results = run(
            requests=args.requests,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            model=args.model,
            num_cpus=args.num_cpus,
        )
        print(format_table(results))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
