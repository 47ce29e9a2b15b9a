"""Sampling throughput of the local backend: 64 concurrent requests, batched vs one at a time.

Starts the real engine actor through ``LocalBackend`` (Ray, CPU) on the tiny
Qwen2 model and sends the same 64 ``generate`` requests twice:

* **batched** - all at once with ``asyncio.gather`` (what verl's agent loop does);
  the engine's actor decodes them together;
* **one at a time** - each awaited before the next is sent (``max_batch_size=1``
  behaviour from the caller's side).

Usage::

    python benchmarks/bench_sampling.py [--requests 64] [--max-tokens 64] [--model DIR]

Prints generated tokens/s for both modes and their ratio. Not a test: numbers
depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--model", default=None, help="HF model dir (default: build the tiny model)")
    parser.add_argument("--num-cpus", type=float, default=1, help="CPUs (torch threads) for the engine actor")
    args = parser.parse_args()

    import ray
    from omegaconf import OmegaConf

    from verl.remote_backend.registry import RemoteBackendRegistry
    from verl.remote_backend.tiny_model import build_tiny_model

    model = args.model or build_tiny_model(tempfile.mkdtemp(prefix="bench_tiny_"))
    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"path": model}, "actor": {"optim": {"lr": 1e-6}}},
            "remote_backend": {"local": {"num_cpus": args.num_cpus, "max_batch_size": args.requests}},
        }
    )
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    backend = RemoteBackendRegistry.create("local", cfg)
    # Rows may stop early at EOS; tokens/s counts the tokens actually generated.
    params = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": 1.0}
    prompts = [[5 + (i % 50), 17, 33, 9 + (i % 7)] for i in range(args.requests)]

    async def batched() -> int:
        outs = await asyncio.gather(*[backend.generate(p, params) for p in prompts])
        return sum(len(o["token_ids"]) for o in outs)

    async def sequential() -> int:
        total = 0
        for p in prompts:
            total += len((await backend.generate(p, params))["token_ids"])
        return total

    async def run() -> None:
        await backend.generate(prompts[0], {"max_tokens": 4})  # warm-up
        t0 = time.perf_counter()
        tok_b = await batched()
        t_b = time.perf_counter() - t0
        t0 = time.perf_counter()
        tok_s = await sequential()
        t_s = time.perf_counter() - t0
        info = await backend.engine_info()
        print(f"requests={args.requests} max_tokens={args.max_tokens} temperature={args.temperature}")
        print(f"batched:        {tok_b:6d} tokens in {t_b:7.2f}s = {tok_b / t_b:9.1f} tokens/s")
        print(f"one at a time:  {tok_s:6d} tokens in {t_s:7.2f}s = {tok_s / t_s:9.1f} tokens/s")
        print(f"speed-up (tokens/s batched / one at a time): {(tok_b / t_b) / (tok_s / t_s):.1f}x")
        print(f"engine decode batches run so far: {info['batches_run']}")

    try:
        asyncio.run(run())
    finally:
        backend.destroy()
        ray.shutdown()


if __name__ == "__main__":
    main()
