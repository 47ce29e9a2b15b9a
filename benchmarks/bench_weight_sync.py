"""Row 5 - weight sync: ``update_weights`` of the local backend, tiny model and ~100M parameters.

For each model (built at run time with ``build_tiny_model``; the large one is a
GPT-2-small-sized Qwen2, ~113M parameters) the local engine is started through
``LocalBackend`` with ``share_sampler_weights=false`` and ``update_weights()`` - what the forwarder calls after
every update - is timed from the client (Ray call, drain of the sampler, copy
of every parameter into the sampler's weights, answer).

The reference is the physical floor in this process: ``copy_`` of a same-sized
set of float32 tensors (a memcpy of the model). ratio = update_weights /
memcpy floor; informative, no target.

Usage: ``python -m benchmarks.bench_weight_sync [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from typing import Any, Sequence

from benchmarks.common import Result, format_table, time_interleaved

#: name -> build_tiny_model keyword arguments
MODELS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "~100M": {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "num_kv_heads": 12, "intermediate_size": 3072},
}
SMOKE_MODELS = ["tiny"]


def _param_count(model_dir: str) -> int:
    """Parameters stored in the model directory's safetensors file."""
    from safetensors import safe_open

    total = 0
    with safe_open(f"{model_dir}/model.safetensors", framework="pt") as f:
        for key in f.keys():
            total += _numel(f.get_slice(key).get_shape())
    return total


def _numel(shape: Sequence[int]) -> int:
    out = 1
    for dim in shape:
        out *= int(dim)
    return out


def run(models: Sequence[str], *, repeats: int = 5) -> list[Result]:
    """Time ``update_weights`` per model. Needs Ray initialised in this process."""
    import torch
    from omegaconf import OmegaConf

    from verl.remote_backend.registry import RemoteBackendRegistry
    from verl.remote_backend.testing.tiny_model import build_tiny_model

    results: list[Result] = []
    for name in models:
        model_dir = build_tiny_model(tempfile.mkdtemp(prefix=f"bench_ws_{name.strip('~')}_"), **MODELS[name])
        params = _param_count(model_dir)
        # the copy path: with shared weights (the default) update_weights copies nothing
        cfg = OmegaConf.create(
            {
                "actor_rollout_ref": {"model": {"path": model_dir}, "actor": {"optim": {"lr": 1e-6}}},
                "remote_backend": {"local": {"share_sampler_weights": False}},
            }
        )
        backend = RemoteBackendRegistry.create("local", cfg)
        try:
            # the floor: one float32 copy of the same number of values, in this process
            src, dst = torch.randn(params), torch.empty(params)
            times = time_interleaved(
                {
                    "sync": lambda: asyncio.run(backend.update_weights()),
                    "memcpy": lambda: dst.copy_(src),
                },
                repeats=repeats,
            )
        finally:
            asyncio.run(backend.destroy())
        gbytes = params * 4 / 1e9
        results.append(
            Result(
                row="5 weight sync",
                case=f"update_weights, {name} model ({params / 1e6:.1f}M params, {gbytes * 1e3:.3g} MB fp32)",
                a=times["sync"],
                a_label="update_weights s",
                b=times["memcpy"],
                b_label="memcpy floor s",
                ratio=times["sync"] / times["memcpy"],
                note=f"{gbytes / times['sync']:.2f} GB/s",
            )
        )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model only")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        print(format_table(run(SMOKE_MODELS if args.quick else list(MODELS), repeats=args.repeats)))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
