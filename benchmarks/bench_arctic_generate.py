"""Row 6 - Arctic generation at the sampler's batch size: adapter -> Arctic's server vs the sampler alone.

Starts the Arctic stand-in (arctic-platform's own ``http_server`` with the CPU sampler
double, ``tests/arctic_standin``) as a separate process, creates the ``arctic`` backend on
it, and sends 64 concurrent ``generate`` calls through the adapter (token ids -> text ->
HTTP ``/generate`` -> Arctic's route -> the replica pool -> the sampler). The reference is
the same sampler (``EngineActor``, same model, ``max_batch_size``, one torch thread) called
directly in this process with the same 64 prompts. Both count the tokens actually generated
(a row may stop at EOS) and report tokens/s.

Usage::

    python -m benchmarks.bench_arctic_generate [--requests 64] [--max-tokens 64]

ratio = direct tokens/s / adapter tokens/s (target <= 1.25x). Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from benchmarks.common import Result, format_table

TARGET = 1.25
_STANDIN = Path(__file__).resolve().parents[1] / "tests" / "arctic_standin" / "server.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _arctic_config(model: str, port: int, workdir: str, max_num_seqs: int, max_concurrency: Optional[int]):
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf, open_dict

    GlobalHydra.instance().clear()
    with initialize_config_module("verl.remote_backend.config", version_base=None):
        cfg = compose("remote_ppo_trainer", overrides=["trainer.remote_backend=arctic"])
    with open_dict(cfg):
        for key, value in {
            "actor_rollout_ref.model.path": model,
            "trainer.default_local_dir": os.path.join(workdir, "ckpt"),
            "data.max_prompt_length": 32,
            "data.max_response_length": 64,
            "remote_backend.arctic.port": port,
            "remote_backend.arctic.device.type": "cpu",
            "remote_backend.arctic.sampling.max_num_seqs": max_num_seqs,
            "remote_backend.arctic.generate.max_concurrency": max_concurrency,
        }.items():
            OmegaConf.update(cfg, key, value, merge=True)
    return cfg


def run(
    *,
    requests: int = 64,
    max_tokens: int = 64,
    model: Optional[str] = None,
    hidden: int = 512,
    layers: int = 4,
    max_concurrency: Optional[int] = None,
    verbose: bool = True,
) -> list[Result]:
    """Both paths once each (after a warm-up). Starts and stops its own stand-in server.

    Without ``model`` a random Qwen2 of ``hidden`` x ``layers`` is built (default ~20M parameters:
    enough compute per token that the row measures batching, not only per-request overhead).
    ``max_concurrency`` caps the adapter's requests in flight (``generate.max_concurrency``;
    ``None`` = the sampler's ``max_num_seqs``, set to ``requests``).
    """
    label = f"{Path(model).name} model" if model else f"random Qwen2 {hidden}x{layers}"
    import torch
    from transformers import AutoTokenizer

    from verl.remote_backend.registry import RemoteBackendRegistry
    from verl.remote_backend.testing.tiny_model import build_tiny_model
    from verl.workers.remote_client.arctic.launcher import launch_server
    from verl.workers.remote_client.local.actor import EngineActor
    from verl.workers.remote_client.local.config import EngineSettings, LocalBackendConfig

    workdir = tempfile.mkdtemp(prefix="bench_arctic_")
    model = model or build_tiny_model(
        os.path.join(workdir, "model"),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=8,
        num_kv_heads=4,
        vocab_size=512,
    )
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(f"Question {i}: what is {i} plus {3 * i}?")["input_ids"] for i in range(requests)]
    params = {"max_tokens": max_tokens, "temperature": 1.0, "top_p": 1.0}
    port = _free_port()
    server = launch_server(
        host="127.0.0.1", port=port, training_gpus=1, sampling_gpus=1, log_prob_gpus=0, colocate=True,
        command=[sys.executable, str(_STANDIN)], startup_timeout_s=180, log_dir=workdir,
    )  # fmt: skip
    backend = None
    try:
        backend = RemoteBackendRegistry.create(
            "arctic", _arctic_config(model, port, workdir, requests, max_concurrency)
        )
        torch.set_num_threads(1)
        direct = EngineActor(
            EngineSettings(model_path=model, backend=LocalBackendConfig(max_batch_size=requests), optim={"lr": 0.0})
        )

        async def adapter_pass() -> int:
            outs = await asyncio.gather(*[backend.generate(p, params) for p in prompts])
            return sum(len(o.token_ids) for o in outs)

        async def direct_pass() -> int:
            outs = await asyncio.gather(*[direct.generate(p, params) for p in prompts])  # the engine actor's results
            return sum(len(o.token_ids) for o in outs)

        async def measure() -> tuple[float, float, int, int]:
            await backend.generate(prompts[0], {"max_tokens": 4})
            await direct.generate(prompts[0], {"max_tokens": 4})
            t0 = time.perf_counter()
            tok_a = await adapter_pass()
            t_a = time.perf_counter() - t0
            t0 = time.perf_counter()
            tok_d = await direct_pass()
            t_d = time.perf_counter() - t0
            return tok_a / t_a, tok_d / t_d, tok_a, tok_d

        tps_a, tps_d, tok_a, tok_d = asyncio.run(measure())
    finally:
        if backend is not None:
            asyncio.run(backend.destroy())
        server.stop()
    ratio = tps_d / tps_a
    if verbose:
        print(f"adapter -> Arctic server: {tok_a} tokens, {tps_a:.1f} tokens/s")
        print(f"sampler called directly:  {tok_d} tokens, {tps_d:.1f} tokens/s")
        print(f"ratio direct / adapter: {ratio:.2f}x (target <= {TARGET}x)")
    return [
        Result(
            row="6 arctic generate",
            case=(
                f"{requests} concurrent generate, max_tokens={max_tokens}, {label}, "
                f"in flight {max_concurrency or requests} (tokens/s)"
            ),
            a=tps_a,
            a_label="adapter->server tok/s",
            b=tps_d,
            b_label="sampler direct tok/s",
            ratio=ratio,
            target=f"<= {TARGET:g}x",
            met=ratio <= TARGET,
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default=None, help="HF model dir (default: build a random Qwen2)")
    parser.add_argument("--hidden", type=int, default=512, help="hidden size of the built model")
    parser.add_argument("--layers", type=int, default=4, help="layers of the built model")
    parser.add_argument("--max-concurrency", type=int, default=None, help="adapter requests in flight (default: all)")
    args = parser.parse_args()
    results = run(
        requests=args.requests, max_tokens=args.max_tokens, model=args.model, hidden=args.hidden, layers=args.layers,
        max_concurrency=args.max_concurrency,
    )  # fmt: skip
    print(format_table(results))


if __name__ == "__main__":
    main()
