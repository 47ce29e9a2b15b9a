"""Shared pieces of the benchmarks: interleaved timing, result rows, the table, verl-style batches.

Absolute times on shared CPU machines are noisy, so every row compares two
variants *measured in the same run*: :func:`time_interleaved` alternates them
(A, B, A, B, ...) so that a burst of background load hits both, and reports
medians. A row's ``ratio`` is always ``slower-is-worse / reference`` as the row
defines it, and ``target`` states the issue's threshold for that ratio.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

__all__ = [
    "Result",
    "time_interleaved",
    "format_table",
    "left_right_lengths",
    "dense_verl_batch",
    "nested_verl_batch",
    "e2e_helpers",
]


@dataclass
class Result:
    """One line of the results table.

    Attributes:
        row: benchmark row (``"1 forwarding"``, ...).
        case: what was measured (op and size).
        a / a_label: the measured variant's figure and what it is.
        b / b_label: the reference variant's figure and what it is.
        ratio: the row's ratio (see the row's docstring for its direction).
        target: the issue's threshold, e.g. ``"<= 1.25x"``; ``None`` for informative lines.
        met: whether ``ratio`` meets ``target`` (``None`` without a target).
        note: free text (units, sizes, caveats).
        percent: show ``ratio`` as a percentage (a share) rather than ``N.NNx``.
        extra: raw figures behind the line (printed by the row's own CLI).

    A label ending in ``" s"`` marks its figure as seconds.
    """

    row: str
    case: str
    a: float
    a_label: str
    b: Optional[float] = None
    b_label: str = ""
    ratio: Optional[float] = None
    target: Optional[str] = None
    met: Optional[bool] = None
    note: str = ""
    percent: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def time_interleaved(variants: dict[str, Callable[[], Any]], *, repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median wall seconds of each zero-argument callable, run alternately.

    Each round calls every variant once in the given order (after ``warmup``
    untimed rounds), so slow periods of a shared machine affect all variants.
    """
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def _fmt(label: str, value: Optional[float]) -> str:
    if not label:
        return ""
    if value is None:
        return label
    if label.endswith(" s"):
        text = f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.2f} s"
        return f"{label[:-2]}: {text}"
    return f"{label}: {value:,.1f}" if value >= 100 else f"{label}: {value:.3g}"


def format_table(results: Sequence[Result]) -> str:
    """A Markdown table of the results (what ``benchmarks/README.md`` shows)."""
    lines = [
        "| row | case | measured | reference | ratio | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.ratio is None:
            ratio = ""
        else:
            ratio = f"{r.ratio:.1%}" if r.percent else f"{r.ratio:.2f}x"
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        case = r.case + (f" ({r.note})" if r.note else "")
        lines.append(
            f"| {r.row} | {case} | {_fmt(r.a_label, r.a)} | {_fmt(r.b_label, r.b)} | {ratio} | "
            f"{r.target or ''} | {met} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- verl-style batches
def left_right_lengths(
    batch: int, prompt_width: int, response_width: int, *, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random real prompt/response lengths (int64 ``[B]`` each), between a quarter and all of the width."""
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(max(1, prompt_width // 4), prompt_width + 1, (batch,), generator=gen)
    response = torch.randint(max(1, response_width // 4), response_width + 1, (batch,), generator=gen)
    return prompt, response


def dense_verl_batch(batch: int, prompt_width: int, response_width: int, *, seed: int = 0, vocab: int = 500):
    """The dense batch verl's trainer holds after a rollout, as a TensorDict.

    ``prompts [B, P]`` left-padded, ``responses`` / ``response_mask [B, R]``
    right-padded, ``input_ids`` / ``attention_mask`` / ``position_ids [B, P + R]``,
    and the float ``[B, R]`` fields an update reads (``advantages``,
    ``old_log_probs``, ``ref_log_prob``).
    """
    from tensordict import TensorDict

    prompt_len, response_len = left_right_lengths(batch, prompt_width, response_width, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    width = prompt_width + response_width
    cols = torch.arange(width)
    in_prompt = (cols[None, :] >= prompt_width - prompt_len[:, None]) & (cols[None, :] < prompt_width)
    in_response = (cols[None, :] >= prompt_width) & (cols[None, :] < prompt_width + response_len[:, None])
    attention_mask = (in_prompt | in_response).to(torch.int64)
    input_ids = torch.randint(3, vocab, (batch, width), generator=gen) * attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = attention_mask[:, prompt_width:].clone()
    floats = {
        key: torch.randn(batch, response_width, generator=gen) * response_mask
        for key in ("advantages", "old_log_probs", "ref_log_prob")
    }
    return TensorDict(
        {
            "prompts": input_ids[:, :prompt_width].clone(),
            "responses": input_ids[:, prompt_width:].clone(),
            "response_mask": response_mask,
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            **floats,
        },
        batch_size=[batch],
    )


def nested_verl_batch(batch: int, prompt_width: int, response_width: int, *, seed: int = 0, update: bool = False):
    """What verl's trainer sends to the actor worker group (``use_legacy_worker_impl=disable``).

    The dense batch through verl's own ``left_right_2_no_padding`` (NJT
    ``input_ids`` / ``position_ids``), plus the non-tensor fields the trainer
    assigns before ``compute_log_prob`` or, with ``update=True``, ``update_actor``.
    """
    from verl.remote_backend.launch.cpu_compat import install_flash_attn_fallback
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    install_flash_attn_fallback()
    td = left_right_2_no_padding(dense_verl_batch(batch, prompt_width, response_width, seed=seed))
    if update:
        tu.assign_non_tensor(
            td,
            calculate_entropy=False,
            global_batch_size=batch,
            mini_batch_size=batch,
            epochs=1,
            seed=42,
            dataloader_kwargs={"shuffle": False},
            temperature=1.0,
        )
    else:
        tu.assign_non_tensor(td, calculate_entropy=True, compute_loss=False)
    return td


# ---------------------------------------------------------------- end-to-end runs
def e2e_helpers():
    """The end-to-end harness of the test suite (``tests/support/remote_e2e.py``: gsm8k subset, tiny
    model, small-CI overrides, entry-point runner), loaded from its file: ``tests`` is not a
    package, and ``sys.path`` stays as it is."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "tests" / "support" / "remote_e2e.py"
    spec = importlib.util.spec_from_file_location("remote_e2e", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("remote_e2e", module)  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return sys.modules["remote_e2e"]
