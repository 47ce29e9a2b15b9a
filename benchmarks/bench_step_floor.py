"""Row 8 - the main job's GRPO step against the machine's floor for the same step.

Runs the main job (``examples/gsm8k_remote/run_gsm8k_grpo_local.sh``: SmolLM2-135M-Instruct,
gsm8k, the local backend on CPU) a few steps in two set-ups, one after the other on the same
machine, and sets each phase's measured seconds (verl's ``timing_s/*``, medians over the
steps after the first) beside its floor:

* ``update_actor``: the update's FLOPs (forward+backward, :func:`model_tflops` over the step's
  sequence lengths) over the all-core matmul rate (:func:`measure_matmul_flops`, float32);
* ``old_log_prob`` (only when recomputed): a forward's FLOPs over the same rate;
* ``gen``: the prefill's forward FLOPs over that rate, plus the decode: per decode step the
  larger of its FLOPs and one read of the weights at the measured memory bandwidth
  (``response_length/max`` steps); every sample's prompt counts, as the issue defined the floor
  (the engine prefills each distinct prompt once, so the case also notes the floor that counts
  each of the ``--rollout-n`` samples' shared prompt once; so do the update's and the step's
  cases, for the update with ``actor.use_prefix_grouper``);
* the step: the sum of those floors against ``timing_s/step`` minus the checkpoint save and
  validation (disk and evaluation time the compute floor does not cover).

Each phase is also set beside the GEMMs it must run, timed on this machine at the engine's own
shapes (:func:`gemm_passes`: 24 rows per decode step, micro-batches of ``rollout.n``
sequences in the update): the part PyTorch's float32 GEMMs alone take there, and the rate they
reach, which at these skinny shapes is below the square-matmul rate the floor divides by.

Set-ups: ``before`` is the main job as it was before the machine was used fully (the engine on
one thread, old log-probs recomputed, every sample's prompt run in the update:
``remote_backend.local.threads=1``, ``algorithm.rollout_correction.bypass_mode=false``,
``actor.use_prefix_grouper=false``); ``after`` is the main job's defaults.

Usage: ``python -m benchmarks.bench_step_floor [--steps 3] [--setups before,after]
[--keep-metrics DIR] [--from-metrics DIR/after.metrics.jsonl ...] [--row-by-row before]`` (about
5 minutes per set-up on a 2-core machine; needs the model that ``prepare_model.py`` caches;
``--from-metrics`` compares kept runs of this machine without running the job again;
``--row-by-row`` names the set-ups whose update ran every sample's prompt, for their GEMMs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from benchmarks.common import Result, format_table

REPO_ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB = REPO_ROOT / "examples" / "gsm8k_remote" / "run_gsm8k_grpo_local.sh"
TARGET = 1.5

#: Set-up name -> (environment for the main job, extra Hydra overrides).
SETUPS: dict[str, tuple[dict[str, str], list[str]]] = {
    "before": ({"BYPASS": "false", "SHARE_PROMPTS": "false"}, ["remote_backend.local.threads=1"]),
    "after": ({}, []),
}


@dataclass(frozen=True)
class MachineRates:
    """What the floor divides by: all-core float32 matmul FLOP/s and memory read bytes/s."""

    matmul_flops: float
    read_bytes_per_s: float


@dataclass(frozen=True)
class StepShape:
    """One logged step's sizes: ``samples`` sequences of mean ``prompt_tokens`` +
    ``response_tokens`` tokens, decoded for ``decode_steps`` steps, ``samples_per_prompt``
    of them per distinct prompt (GRPO's ``rollout.n``)."""

    samples: int
    prompt_tokens: float
    response_tokens: float
    decode_steps: int
    samples_per_prompt: int = 1


def measure_machine(threads: int) -> MachineRates:
    """All-core rates of this process with ``threads`` torch threads: the best square float32
    matmul (:func:`measure_matmul_flops`) and the best of repeated full reads of a 512 MiB
    float32 buffer (``sum``: one pass over memory, larger than any cache)."""
    import torch

    from verl.remote_backend.forwarder.mfu import measure_matmul_flops

    torch.set_num_threads(threads)
    flops = measure_matmul_flops("cpu", torch.float32, seconds=2.0)
    buffer = torch.ones(128 * 1024 * 1024, dtype=torch.float32)
    buffer.sum()
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        buffer.sum()
        best = max(best, buffer.numel() * 4 / (time.perf_counter() - start))
    return MachineRates(matmul_flops=flops, read_bytes_per_s=best)


def phase_floors(model_path: str, shape: StepShape, rates: MachineRates, *, recompute: bool) -> dict[str, float]:
    """Floor seconds of each phase of one step (see the module docstring), keyed like verl's
    ``timing_s/*`` metrics."""
    from transformers import AutoConfig

    from verl.remote_backend.forwarder.mfu import model_tflops
    from verl.utils.flops_counter import FlopsCounter

    config = AutoConfig.from_pretrained(model_path)
    counter = FlopsCounter(config)
    total = int(round(shape.prompt_tokens + shape.response_tokens))
    train_flops = model_tflops(counter, [total] * shape.samples) * 1e12
    prompt_flops = model_tflops(counter, [int(round(shape.prompt_tokens))] * shape.samples) * 1e12 / 3
    # one decode step: a forward of one token per sequence (the weights' matmuls, 2 FLOPs per weight)
    weights = sum(p.numel() for p in _meta_model(config).parameters())
    decode_step_flops = 2.0 * weights * shape.samples
    decode_step_s = max(decode_step_flops / rates.matmul_flops, weights * 4 / rates.read_bytes_per_s)
    floors = {
        "gen": prompt_flops / rates.matmul_flops + shape.decode_steps * decode_step_s,
        "update_actor": train_flops / rates.matmul_flops,
    }
    if recompute:
        floors["old_log_prob"] = train_flops / 3 / rates.matmul_flops
    return floors


def prefill_floor(model_path: str, shape: StepShape, rates: MachineRates) -> float:
    """The prefill's part of the ``gen`` floor: every sample's prompt forward, in seconds."""
    from transformers import AutoConfig

    from verl.remote_backend.forwarder.mfu import model_tflops
    from verl.utils.flops_counter import FlopsCounter

    counter = FlopsCounter(AutoConfig.from_pretrained(model_path))
    prompt_tflops = model_tflops(counter, [int(round(shape.prompt_tokens))] * shape.samples) / 3
    return prompt_tflops * 1e12 / rates.matmul_flops


#: One GEMM of a phase: (rows of the input, the weight's out_features, its in_features).
Gemm = tuple[int, int, int]


@dataclass(frozen=True)
class GemmPass:
    """A pass through the model's linear layers at the rows the engine feeds them: ``gemms`` in
    module order, each with its gradient's two GEMMs (input and weight) when ``backward``, the
    whole pass repeated ``times``."""

    gemms: tuple[Gemm, ...]
    times: int
    backward: bool = False


def gemm_passes(
    model_path: str, shape: StepShape, *, micro_rows: int, shared_prompts: bool = True
) -> dict[str, GemmPass]:
    """The float32 GEMMs each phase must run, at the engine's own shapes. Attention, norms and
    the sampler's draws are left out: this is the part a faster engine could not avoid with
    PyTorch's CPU GEMMs.

    * ``gen_prefill``: each distinct prompt once (its rows: ``samples / samples_per_prompt``
      prompts' tokens; the vocabulary projection only for each prompt's last token);
    * ``gen_decode``: ``decode_steps`` steps of ``samples`` rows;
    * ``update_actor``: ``samples / micro_rows`` micro-batches of ``micro_rows`` sequences (the
      vocabulary projection only for their response tokens, as the engine computes it), forward
      and backward; with ``shared_prompts`` (``actor.use_prefix_grouper``) a micro-batch's
      samples of one prompt hold it once.
    """
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    modules = _meta_model(config).modules()
    linears = [(m.out_features, m.in_features) for m in modules if isinstance(m, torch.nn.Linear)]
    body, head = linears[:-1], linears[-1]  # causal LMs end with the vocabulary projection
    if head[0] != config.vocab_size:
        raise ValueError(f"{model_path}: the last linear layer {head} is not the vocabulary projection")

    def through(rows: int, head_rows: int) -> tuple[Gemm, ...]:
        return tuple((rows, out_f, in_f) for out_f, in_f in body) + ((head_rows, *head),)

    prompts = max(1, round(shape.samples / shape.samples_per_prompt))
    micro_prompts = max(1.0, micro_rows / shape.samples_per_prompt) if shared_prompts else micro_rows
    micro_tokens = round(micro_prompts * shape.prompt_tokens + micro_rows * shape.response_tokens)
    return {
        "gen_prefill": GemmPass(through(round(prompts * shape.prompt_tokens), prompts), times=1),
        "gen_decode": GemmPass(through(shape.samples, shape.samples), times=shape.decode_steps),
        "update_actor": GemmPass(
            through(micro_tokens, round(micro_rows * shape.response_tokens)),
            times=max(1, round(shape.samples / micro_rows)),
            backward=True,
        ),
    }


def gemm_seconds(gemm_pass: GemmPass, *, repeats: int = 3) -> float:
    """Seconds of ``gemm_pass`` on this machine: the best of ``repeats`` timed passes (one
    distinct random float32 weight per GEMM, so weights stream from memory as the model's do),
    times ``gemm_pass.times``."""
    import torch

    weights = [torch.randn(out_f, in_f) for _, out_f, in_f in gemm_pass.gemms]
    inputs = {(rows, in_f): torch.randn(rows, in_f) for rows, _, in_f in gemm_pass.gemms}
    grads = {(rows, out_f): torch.randn(rows, out_f) for rows, out_f, _ in gemm_pass.gemms}
    best = float("inf")
    for _ in range(repeats + 1):  # the first pass warms up
        start = time.perf_counter()
        for (rows, out_f, in_f), weight in zip(gemm_pass.gemms, weights):
            x = inputs[(rows, in_f)]
            torch.nn.functional.linear(x, weight)
            if gemm_pass.backward:
                grad = grads[(rows, out_f)]
                torch.mm(grad, weight)  # the input's gradient
                torch.mm(grad.t(), x)  # the weight's gradient
        best = min(best, time.perf_counter() - start)
    return best * gemm_pass.times


def _meta_model(config: Any) -> Any:
    """The model built on the meta device (no memory): only its parameter count is read."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def run_main_job(workdir: Path, setup: str, model_path: str, *, steps: int) -> list[dict[str, Any]]:
    """The main job with ``setup``'s settings for ``steps`` steps; returns its logged training
    steps' metrics (``{"step", "data"}`` rows of verl's file logger)."""
    env_overrides, hydra_overrides = SETUPS[setup]
    env = dict(os.environ, WORK_DIR=str(workdir), STEPS=str(steps), SAVE_FREQ=str(steps), VALIDATE="false")
    env.update(env_overrides, PYTHON_BIN=sys.executable)
    command = ["bash", str(MAIN_JOB), model_path, *hydra_overrides]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"main job ({setup}) failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    return _read_steps(workdir / "metrics.jsonl")


def _median(steps: list[dict[str, Any]], key: str) -> Optional[float]:
    values = [float(s[key]) for s in steps if key in s]
    return statistics.median(values) if values else None


def compare(
    setup: str, steps: list[dict[str, Any]], model_path: str, rates: MachineRates, *, rollout_n: int = 4
) -> list[Result]:
    """Result lines of one set-up: each phase and the step, measured vs floor (``rollout_n``:
    the run's samples per prompt)."""
    timed = _timed_steps(steps)
    shape = step_shape(timed, rollout_n=rollout_n)
    recompute = _median(timed, "timing_s/old_log_prob") is not None  # absent in bypass mode
    floors = phase_floors(model_path, shape, rates, recompute=recompute)
    # a forward over the prompts that repeat within a GRPO group: what the engine computes once
    # per group (the sampler's prefill; the update and log-prob passes with use_prefix_grouper)
    repeated_prompts_s = prefill_floor(model_path, shape, rates) * (1 - 1 / shape.samples_per_prompt)
    passes = {"gen": 1, "update_actor": 3, "old_log_prob": 1}  # forward = 1, forward + backward = 3
    shared_floors = {phase: floor - passes[phase] * repeated_prompts_s for phase, floor in floors.items()}
    results = []
    for phase, floor in floors.items():
        measured = _median(timed, f"timing_s/{phase}") or 0.0
        note = (
            f"floor with each distinct prompt run once ({shape.samples_per_prompt} samples each): "
            f"{shared_floors[phase]:.2f} s = {measured / shared_floors[phase]:.2f}x"
        )
        results.append(
            Result(
                row="8 step floor",
                case=f"{setup}: {phase}",
                a=measured,
                a_label="measured s",
                b=floor,
                b_label="floor s",
                ratio=measured / floor,
                note=note,
            )
        )
    # per step: only some steps save or validate, so their seconds come off those steps alone
    io_per_step = [sum(float(s.get(f"timing_s/{k}", 0.0)) for k in ("save_checkpoint", "testing")) for s in timed]
    io_s = sum(io_per_step)
    step_s = statistics.median(float(s.get("timing_s/step", 0.0)) - io for s, io in zip(timed, io_per_step))
    floor_s = sum(floors.values())
    tokens = f"{shape.prompt_tokens:.0f}+{shape.response_tokens:.0f} tokens"
    size = f"{shape.samples} samples, {tokens}, {shape.decode_steps} decode steps"
    results.append(
        Result(
            row="8 step floor",
            case=f"{setup}: step without checkpoint/validation ({size})",
            a=step_s,
            a_label="measured s",
            b=floor_s,
            b_label="floor s",
            ratio=step_s / floor_s,
            target=f"<= {TARGET}x",
            met=step_s / floor_s <= TARGET,
            note=(
                f"checkpoint+validation {io_s:.1f} s over {len(timed)} steps not counted; floor with each distinct "
                f"prompt run once: {sum(shared_floors.values()):.2f} s = {step_s / sum(shared_floors.values()):.2f}x"
            ),
        )
    )
    return results


def _timed_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [row["data"] for row in steps[1:]] or [steps[-1]["data"]]  # the first step warms up


def step_shape(timed: list[dict[str, Any]], *, rollout_n: int) -> StepShape:
    """The median step's shape from verl's logged metrics (``rollout_n``: samples per prompt)."""
    samples = int(
        round(
            _median(timed, "perf/total_num_tokens")
            / (_median(timed, "prompt_length/mean") + _median(timed, "response_length/mean"))
        )
    )
    return StepShape(
        samples=samples,
        prompt_tokens=_median(timed, "prompt_length/mean"),
        response_tokens=_median(timed, "response_length/mean"),
        decode_steps=int(_median(timed, "response_length/max")),
        samples_per_prompt=rollout_n,
    )


def gemm_flops(gemm_pass: GemmPass) -> float:
    """FLOPs of ``gemm_pass``: 2 per multiply-add, 3 GEMMs per layer with the backward."""
    per_pass = sum(2.0 * rows * out_f * in_f for rows, out_f, in_f in gemm_pass.gemms)
    return per_pass * (3 if gemm_pass.backward else 1) * gemm_pass.times


def compare_with_gemms(
    setup: str, steps: list[dict[str, Any]], model_path: str, *, rollout_n: int = 4, shared_prompts: bool = True
) -> list[Result]:
    """Result lines of one set-up against the GEMMs its phases must run, timed on this machine
    at the engine's shapes (:func:`gemm_passes`, :func:`gemm_seconds`; the main job's
    micro-batch is ``rollout_n`` sequences, one prompt's samples): how much of each phase
    PyTorch's float32 GEMMs alone take at those shapes, and the rate they reach there."""
    timed = _timed_steps(steps)
    shape = step_shape(timed, rollout_n=rollout_n)
    passes = gemm_passes(model_path, shape, micro_rows=rollout_n, shared_prompts=shared_prompts)
    seconds = {name: gemm_seconds(p) for name, p in passes.items()}
    phases = {"gen": ("gen_prefill", "gen_decode"), "update_actor": ("update_actor",)}
    results = []
    for phase, parts in phases.items():
        measured = _median(timed, f"timing_s/{phase}") or 0.0
        gemm_s = sum(seconds[p] for p in parts)
        rate = sum(gemm_flops(passes[p]) for p in parts) / gemm_s
        results.append(
            Result(
                row="8 step floor",
                case=f"{setup}: {phase} vs its GEMMs alone at the engine's shapes",
                a=measured,
                a_label="measured s",
                b=gemm_s,
                b_label="GEMMs s",
                ratio=measured / gemm_s,
                note=f"the GEMMs run at {rate / 1e9:.0f} GFLOP/s there",
            )
        )
    return results


def run(
    *,
    steps: int = 3,
    setups: tuple[str, ...] = ("before", "after"),
    model_path: Optional[str] = None,
    keep_metrics: Optional[Path] = None,
    from_metrics: tuple[Path, ...] = (),
    row_by_row: tuple[str, ...] = ("before",),
) -> list[Result]:
    """The machine's rates, then the main job once per set-up (the rates are measured first,
    on an idle machine; the runs follow one after the other), each compared with its floor and
    with its GEMMs at the engine's shapes (timed after the run, the machine idle again).
    ``keep_metrics``: a folder that receives each set-up's ``<setup>.metrics.jsonl`` (verl's
    file logger: rewards, timings). ``from_metrics``: such kept files, compared instead of
    running the job again (set-up = file name before the first dot; same machine assumed).
    ``row_by_row``: set-ups whose update ran every sample's prompt (``use_prefix_grouper=false``)."""
    model_path = model_path or _cached_model()
    threads = os.cpu_count() or 1
    rates = measure_machine(threads)
    results = [
        Result(
            row="8 step floor",
            case="machine: all-core float32 matmul, memory read",
            a=rates.matmul_flops / 1e9,
            a_label="GFLOP/s",
            b=rates.read_bytes_per_s / 1e9,
            b_label="GB/s",
        )
    ]
    # The main job reads ROLLOUT_N from the environment it inherits (default 4).
    rollout_n = int(os.environ.get("ROLLOUT_N", "4"))
    runs = [(path.name.split(".")[0], _read_steps(path)) for path in from_metrics]
    for setup in setups if not from_metrics else ():
        with tempfile.TemporaryDirectory(prefix=f"bench_floor_{setup}_") as workdir:
            runs.append((setup, run_main_job(Path(workdir), setup, model_path, steps=steps)))
            if keep_metrics is not None:
                keep_metrics.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(workdir) / "metrics.jsonl", keep_metrics / f"{setup}.metrics.jsonl")
    import torch

    torch.set_num_threads(threads)  # the GEMMs on every core, as the engine's default runs them
    for setup, steps_run in runs:
        results += compare(setup, steps_run, model_path, rates, rollout_n=rollout_n)
        shared = setup not in row_by_row
        results += compare_with_gemms(setup, steps_run, model_path, rollout_n=rollout_n, shared_prompts=shared)
    return results


def _read_steps(metrics: Path) -> list[dict[str, Any]]:
    """The training steps of a verl file-logger ``metrics.jsonl`` (rows with ``timing_s/step``)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [row for row in rows if "timing_s/step" in row["data"]]


def _cached_model() -> str:
    """The model the main job uses (``prepare_model.py`` prints its path last)."""
    out = subprocess.run(
        [sys.executable, str(MAIN_JOB.parent / "prepare_model.py")], capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--setups", default="before,after")
    parser.add_argument("--keep-metrics", type=Path, default=None, help="folder for each run's metrics.jsonl")
    parser.add_argument(
        "--from-metrics", type=Path, nargs="*", default=(), help="kept <setup>.metrics.jsonl files to compare, no run"
    )
    parser.add_argument(
        "--row-by-row", default="before", help="set-ups whose update ran every sample's prompt (comma-separated)"
    )
    args = parser.parse_args(argv)
    setups = tuple(s for s in args.setups.split(",") if s)
    results = run(
        steps=args.steps,
        setups=setups,
        keep_metrics=args.keep_metrics,
        from_metrics=tuple(args.from_metrics),
        row_by_row=tuple(s for s in args.row_by_row.split(",") if s),
    )
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
