"""Row 7 - the local engine on a real model (SmolLM2-135M-Instruct, fp32, chat-templated gsm8k prompts).

In this process, same torch threads, side by side: engine sampling vs HF ``generate`` batched;
prefill in one admission vs one by one, and its padded slots; update_actor / compute_log_prob
vs a plain padded PyTorch loop; the forwarder's MFU vs an independent FLOP count. Each case
notes its FLOP/s as a fraction of the engine's measured matmul rate. Skipped without the model
(``examples/gsm8k_remote/prepare_model.py``); ``--smoke`` uses the tiny test model.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch

from benchmarks.common import Result, format_table, time_interleaved

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = REPO_ROOT / "examples" / "gsm8k_remote"
ROW = "7 real model"


def _example(name: str) -> Any:
    """An example script as a module (``examples/`` is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def default_model_dir() -> Path:
    """Where ``prepare_model.py`` caches SmolLM2-135M-Instruct."""
    return _example("prepare_model").default_output_dir()


def gsm8k_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """Token ids of the first ``count`` gsm8k test questions, chat-templated as the example's data."""
    prep = _example("prepare_gsm8k")
    rows = prep.build_rows(
        prep.load_records("test", prep.DEFAULT_INPUT_DIR), "test", max_rows=count, max_question_chars=None
    )
    out = []
    for row in rows:
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
        out.append([int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)])
    return out


def independent_forward_flops(config: Any, seqlens: list[int]) -> float:
    """Forward FLOPs counted from the config: 2 per weight per token over every matmul (the
    embedding lookup is not one) + causal attention, ``2 * s^2 * heads * head_dim`` per layer."""
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    per_layer = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim + 3 * h * config.intermediate_size
    return (
        2 * sum(seqlens) * (layers * per_layer + vocab * h)
        + 2 * sum(s * s for s in seqlens) * heads * head_dim * layers
    )


def run(
    *,
    model: Optional[str] = None,
    prompts: int = 32,
    max_tokens: int = 64,
    prefill_prompts: int = 64,
    train_rows: int = 16,
    micro_batch: int = 4,
    threads: int = 2,
    repeats: int = 2,
    smoke: bool = False,
    verbose: bool = True,
) -> list[Result]:
    """Every case after warm-ups, with ``threads`` torch threads (restored after); sampling,
    prefill and compute_log_prob alternate engine and reference ``repeats`` times (medians).
    ``smoke``: the tiny test model, few prompts and tokens."""
    if smoke:
        from verl.remote_backend.testing.tiny_model import build_tiny_model

        model = build_tiny_model(tempfile.mkdtemp(prefix="bench_tiny_"))
        prompts, max_tokens, prefill_prompts, train_rows, micro_batch, repeats = 4, 8, 8, 4, 2, 1
    model = model or str(default_model_dir())
    if not os.path.exists(os.path.join(model, "config.json")):
        print(f"[bench_real_model] no model at {model} (run examples/gsm8k_remote/prepare_model.py): row 7 skipped")
        return []
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _run(model, prompts, max_tokens, prefill_prompts, train_rows, micro_batch, repeats, smoke, verbose)
    finally:
        torch.set_num_threads(previous_threads)


def _run(
    model: str,
    prompts: int,
    max_tokens: int,
    prefill_prompts: int,
    train_rows: int,
    micro_batch: int,
    repeats: int,
    smoke: bool,
    verbose: bool,
) -> list[Result]:
    from transformers import AutoConfig

    from verl.utils.flops_counter import FlopsCounter
    from verl.workers.remote_client.local.config import EngineSettings, LocalBackendConfig
    from verl.workers.remote_client.local.engine import LocalEngine

    threads = torch.get_num_threads()
    engine = LocalEngine(
        EngineSettings(
            model_path=model,
            optim={"lr": 1e-6},
            backend=LocalBackendConfig(seed=0),
            log_prob_micro_batch_size=micro_batch,  # the plain loop's micro-batches
        )
    )
    config = AutoConfig.from_pretrained(model)
    counter = FlopsCounter(config)
    peak = engine.peak_flops
    ids = gsm8k_prompts(engine.tokenizer, max(prompts, prefill_prompts))
    name = "tiny test model" if smoke else "SmolLM2-135M fp32"
    where = f"{name}, {threads} threads, measured matmul rate {peak / 1e9:.0f} GFLOP/s"

    def frac(seqlens: list[int], seconds: float, *, forward_only: bool) -> float:
        return independent_forward_flops(config, seqlens) * (1 if forward_only else 3) / seconds / peak

    results = [*_sampling(engine, ids[:prompts], max_tokens, frac, where, repeats)]
    results += _low_precision_sampling(engine, model, ids[:prompts], max_tokens, where, repeats)
    results += _prefill(engine, ids[:prefill_prompts], frac, where, repeats)
    results += _requests(engine, ids[: max(1, prefill_prompts // 4)], frac, where)
    results += _training(engine, ids[:train_rows], max_tokens, micro_batch, frac, counter, where, repeats)
    if verbose:
        print(format_table(results))
    return results


def _sampling(engine: Any, ids: list[list[int]], max_tokens: int, frac: Any, where: str, repeats: int) -> list[Result]:
    params = {"max_tokens": max_tokens, "temperature": 0}
    engine.sample([engine.make_request(ids[0], {"max_tokens": 2})])  # warm-up
    outputs: dict[str, Any] = {}

    def ours_run() -> None:
        outputs["ours"] = engine.sample([engine.make_request(p, params) for p in ids])

    def hf_run() -> None:
        outputs["hf"] = _hf_generate(engine, ids, max_tokens)[0]

    times = time_interleaved({"engine": ours_run, "hf": hf_run}, repeats=repeats, warmup=0)
    t_engine, t_hf = times["engine"], times["hf"]
    ours, hf_tokens = outputs["ours"], outputs["hf"]
    n_engine = sum(len(r.token_ids) for r in ours)
    n_hf = sum(len(t) for t in hf_tokens)
    same = sum(r.token_ids == t for r, t in zip(ours, hf_tokens))
    seqlens = [len(p) + len(r.token_ids) for p, r in zip(ids, ours)]
    ratio = (n_engine / t_engine) / (n_hf / t_hf)
    return [
        Result(
            row=ROW,
            case=f"sampling: {len(ids)} gsm8k prompts x {max_tokens} new tokens, greedy, engine vs HF generate batched",
            a=n_engine / t_engine,
            a_label="engine tok/s",
            b=n_hf / t_hf,
            b_label="HF generate tok/s",
            ratio=ratio,
            target=">= 2.5x",
            met=ratio >= 2.5,
            note=f"{where}; matmul-rate fraction engine {frac(seqlens, t_engine, forward_only=True):.2f}, "
            f"HF {frac(seqlens, t_hf, forward_only=True):.2f}; {same}/{len(ids)} rows token-identical to HF's "
            "left-padded batch",
        )
    ]


def _low_precision_sampling(
    engine: Any, model: str, ids: list[list[int]], max_tokens: int, where: str, repeats: int
) -> list[Result]:
    """``remote_backend.local.sampler_dtype=bfloat16`` against the fp32 sampler: tokens/s, and
    what it does to parity: greedy rows token-identical, and |log-prob difference| on the tokens
    both chose (each row up to its first differing token; the fp32 sampler's log-probs are the
    trainer's to float32 noise, so this is how far bypass mode's old log-probs would move)."""
    from verl.workers.remote_client.local.config import EngineSettings, LocalBackendConfig
    from verl.workers.remote_client.local.engine import LocalEngine

    low = LocalEngine(
        EngineSettings(
            model_path=model, optim={"lr": 1e-6}, backend=LocalBackendConfig(seed=0, sampler_dtype="bfloat16")
        )
    )
    params = {"max_tokens": max_tokens, "temperature": 0, "logprobs": True}
    outputs: dict[str, Any] = {}
    for name, eng in (("fp32", engine), ("bf16", low)):
        eng.sample([eng.make_request(ids[0], {"max_tokens": 2})])  # warm-up

        def run_one(eng: Any = eng, name: str = name) -> None:
            outputs[name] = eng.sample([eng.make_request(p, params) for p in ids])

        outputs[f"run_{name}"] = run_one
    times = time_interleaved(
        {"bf16": outputs.pop("run_bf16"), "fp32": outputs.pop("run_fp32")}, repeats=repeats, warmup=0
    )
    full, half = outputs["fp32"], outputs["bf16"]
    rate = {k: sum(len(r.token_ids) for r in outputs[k]) / times[k] for k in ("fp32", "bf16")}
    same_rows = sum(a.token_ids == b.token_ids for a, b in zip(full, half))
    diffs = []
    for a, b in zip(full, half):
        for ta, tb, la, lb in zip(a.token_ids, b.token_ids, a.log_probs, b.log_probs):
            if ta != tb:
                break
            diffs.append(abs(la - lb))
    ratio = rate["bf16"] / rate["fp32"]
    return [
        Result(
            row=ROW,
            case=f"sampling: {len(ids)} gsm8k prompts x {max_tokens} new tokens, greedy, bf16 sampler vs fp32 sampler",
            a=rate["bf16"],
            a_label="bf16 tok/s",
            b=rate["fp32"],
            b_label="fp32 tok/s",
            ratio=ratio,
            target=None,
            met=None,
            note=f"{where}; {same_rows}/{len(ids)} greedy rows token-identical; |log-prob bf16 - fp32| on "
            f"{len(diffs)} shared tokens: mean {sum(diffs) / max(len(diffs), 1):.3g}, max {max(diffs, default=0):.3g}",
        )
    ]


def _hf_generate(engine: Any, ids: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    """HF ``generate`` on the left-padded batch; returns each row's tokens up to (with) EOS, and seconds."""
    width = max(len(p) for p in ids)
    pad = engine.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    model = engine.sampler_model
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=engine.eos_token_ids,
            pad_token_id=pad,
        )
    seconds = time.perf_counter() - start
    rows = []
    for row in out[:, width:].tolist():
        stop = next((i + 1 for i, t in enumerate(row) if t in engine.eos_token_ids), len(row))
        rows.append(row[:stop])
    return rows, seconds


def _prefill(engine: Any, ids: list[list[int]], frac: Any, where: str, repeats: int) -> list[Result]:
    reqs = [engine.make_request(p, {"max_tokens": 1, "temperature": 0}) for p in ids]
    engine.decode_batch().admit([(0, reqs[0])])  # warm-up
    together = engine.decode_batch()

    def concurrent() -> None:
        nonlocal together
        together = engine.decode_batch()
        together.admit(list(enumerate(reqs)))

    def sequential() -> None:
        for i, r in enumerate(reqs):
            engine.decode_batch().admit([(i, r)])

    times = time_interleaved({"concurrent": concurrent, "sequential": sequential}, repeats=repeats, warmup=0)
    t_conc, t_seq = times["concurrent"], times["sequential"]
    lens = [len(p) for p in ids]
    padded = (together.prefill_slots - together.prefill_tokens) / together.prefill_tokens
    return [
        Result(
            row=ROW,
            case=f"prefill: {len(ids)} prompts ({sum(lens)} tokens) in one admission vs one by one",
            a=t_conc,
            a_label="concurrent s",
            b=t_seq,
            b_label="sequential s",
            ratio=t_seq / t_conc,
            target=">= 1.5x",
            met=t_seq / t_conc >= 1.5,
            note=f"matmul-rate fraction concurrent {frac(lens, t_conc, forward_only=True):.2f}, "
            f"sequential {frac(lens, t_seq, forward_only=True):.2f}",
        ),
        Result(
            row=ROW,
            case=f"prefill: padded slots of that admission ({together.prefill_slots} slots for "
            f"{together.prefill_tokens} prompt tokens)",
            a=float(together.prefill_slots - together.prefill_tokens),
            a_label="padded slots",
            ratio=padded,
            percent=True,
            target="<= 5%",
            met=padded <= 0.05,
        ),
    ]


def _requests(engine: Any, ids: list[list[int]], frac: Any, where: str) -> list[Result]:
    params = {"max_tokens": 16, "temperature": 0}
    start = time.perf_counter()
    together = engine.sample([engine.make_request(p, params) for p in ids])
    t_conc = time.perf_counter() - start
    start = time.perf_counter()
    for p in ids:
        engine.sample([engine.make_request(p, params)])
    t_seq = time.perf_counter() - start
    seqlens = [len(p) + len(r.token_ids) for p, r in zip(ids, together)]
    return [
        Result(
            row=ROW,
            case=f"requests: {len(ids)} prompts x 16 new tokens, together vs one at a time (single run each)",
            a=t_conc,
            a_label="together s",
            b=t_seq,
            b_label="one at a time s",
            ratio=t_seq / t_conc,
            note=f"matmul-rate fraction together {frac(seqlens, t_conc, forward_only=True):.2f}, "
            f"one at a time {frac(seqlens, t_seq, forward_only=True):.2f}",
        )
    ]


def _training(
    engine: Any, ids: list[list[int]], max_tokens: int, micro: int, frac: Any, counter: Any, where: str, repeats: int
) -> list[Result]:
    """update_actor and compute_log_prob vs a plain padded loop on the same rollouts."""
    import copy

    from benchmarks.bench_forwarding import compose_config
    from verl.remote_backend.forwarder.mfu import compute_mfu
    from verl.remote_backend.testing.batches import dense_rollout_batch, to_no_padding

    outs = engine.sample(
        [engine.make_request(p, {"max_tokens": max_tokens, "temperature": 1.0, "seed": i}) for i, p in enumerate(ids)]
    )
    responses = [r.token_ids or [engine.pad_token_id] for r in outs]
    rows = len(ids)
    gen = torch.Generator().manual_seed(0)
    width = max(len(r) for r in responses)
    extra = {
        "advantages": torch.randn(rows, width, generator=gen),
        "old_log_probs": -torch.rand(rows, width, generator=gen),
        "ref_log_prob": -torch.rand(rows, width, generator=gen),
    }
    dense = dense_rollout_batch(ids, responses, extra=extra)
    dense["old_log_probs"] = dense["old_log_probs"] * dense["response_mask"]
    cfg = compose_config(
        engine.settings.model_path,
        "local",
        [
            f"actor_rollout_ref.actor.ppo_mini_batch_size={rows}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
            "actor_rollout_ref.actor.use_kl_loss=false",
            "actor_rollout_ref.actor.optim.lr=1e-6",
        ],
    )
    update_td = to_no_padding(
        dense,
        global_batch_size=rows,
        mini_batch_size=rows,
        epochs=1,
        seed=0,
        dataloader_kwargs={"shuffle": False},
        temperature=1.0,
        calculate_entropy=False,
    )
    warm_cfg = compose_config(
        engine.settings.model_path,
        "local",
        [
            f"actor_rollout_ref.actor.ppo_mini_batch_size={micro}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
            "actor_rollout_ref.actor.use_kl_loss=false",
        ],
    )
    warm_td = to_no_padding(
        dense[:micro],
        global_batch_size=micro,
        mini_batch_size=micro,
        epochs=1,
        seed=0,
        dataloader_kwargs={"shuffle": False},
        temperature=1.0,
        calculate_entropy=False,
    )
    logp_td = to_no_padding(dense, calculate_entropy=False, compute_loss=False)
    seqlens = dense["attention_mask"].sum(-1).tolist()

    plain_model = copy.deepcopy(engine.model).train()
    plain_opt = torch.optim.AdamW(plain_model.parameters(), lr=1e-6, weight_decay=0.01)

    def plain_update(rows: int = rows) -> None:
        plain_opt.zero_grad(set_to_none=True)
        for lo in range(0, rows, micro):
            mb = dense[lo : lo + micro]
            logp = _dense_response_log_probs(plain_model, mb)
            ratio = torch.exp(logp - mb["old_log_probs"])
            adv, mask = mb["advantages"], mb["response_mask"].float()
            loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
            ((loss * mask).sum() / dense["response_mask"].sum()).backward()
        torch.nn.utils.clip_grad_norm_(plain_model.parameters(), 1.0)
        plain_opt.step()

    def plain_log_prob() -> None:
        plain_model.eval()
        with torch.no_grad():
            for lo in range(0, rows, micro):
                _dense_response_log_probs(plain_model, dense[lo : lo + micro])
        plain_model.train()

    def timed(fn: Any) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    actor_cfg = cfg.actor_rollout_ref.actor
    # warm-ups: one micro-batch update each (optimizer state, first backward), one log-prob pass
    engine.update_actor(warm_td, warm_cfg.actor_rollout_ref.actor, temperature=1.0)
    plain_update(micro)
    timed(lambda: engine.compute_log_prob(logp_td, ref=False, calculate_entropy=False, temperature=1.0))
    t_up = timed(lambda: engine.update_actor(update_td, actor_cfg, temperature=1.0))
    t_up_plain = timed(plain_update)
    lp_times = time_interleaved(
        {
            "engine": lambda: engine.compute_log_prob(logp_td, ref=False, calculate_entropy=False, temperature=1.0),
            "plain": plain_log_prob,
        },
        repeats=repeats,
        warmup=0,
    )
    t_lp, t_lp_plain = lp_times["engine"], lp_times["plain"]
    reported = compute_mfu(counter, seqlens, t_lp, engine.device_report(), forward_only=True)
    independent = frac(seqlens, t_lp, forward_only=True)
    case = f"{rows} rollouts ({sum(seqlens)} tokens), micro-batch {micro}"
    return [
        Result(
            row=ROW,
            case=f"update_actor: {case}, engine vs plain padded PyTorch loop",
            a=t_up,
            a_label="engine s",
            b=t_up_plain,
            b_label="plain loop s",
            ratio=t_up_plain / t_up,
            target=">= 1.5x",
            met=t_up_plain / t_up >= 1.5,
            note=f"matmul-rate fraction engine {frac(seqlens, t_up, forward_only=False):.2f}, "
            f"plain {frac(seqlens, t_up_plain, forward_only=False):.2f}",
        ),
        Result(
            row=ROW,
            case=f"compute_log_prob: {case}, engine vs plain padded PyTorch loop",
            a=t_lp,
            a_label="engine s",
            b=t_lp_plain,
            b_label="plain loop s",
            ratio=t_lp_plain / t_lp,
            target=">= 1.0x",
            met=t_lp_plain / t_lp >= 1.0,
            note=f"matmul-rate fraction engine {frac(seqlens, t_lp, forward_only=True):.2f}, "
            f"plain {frac(seqlens, t_lp_plain, forward_only=True):.2f}",
        ),
        Result(
            row=ROW,
            case="MFU the forwarder reports for that compute_log_prob vs an independent FLOP count, same measured peak",
            a=reported,
            a_label="reported MFU",
            b=independent,
            b_label="independent MFU",
            ratio=reported / independent,
            target="0.85-1.15x",
            met=0.85 <= reported / independent <= 1.15,
        ),
    ]


def _dense_response_log_probs(model: torch.nn.Module, mb: Any) -> torch.Tensor:
    """``[b, R]`` log-probs of the response tokens from one forward of verl's dense layout."""
    resp_len = mb["responses"].shape[1]
    logits = model(
        input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"], use_cache=False
    ).logits
    logits = logits[:, -resp_len - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, mb["responses"][..., None]).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: prepare_model.py's cache)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prefill-prompts", type=int, default=64)
    parser.add_argument("--train-rows", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="tiny test model, tiny sizes")
    args = parser.parse_args()
    run(
        model=args.model,
        prompts=args.prompts,
        max_tokens=args.max_tokens,
        prefill_prompts=args.prefill_prompts,
        train_rows=args.train_rows,
        threads=args.threads,
        repeats=args.repeats,
        smoke=args.smoke,
    )


if __name__ == "__main__":
    main()
