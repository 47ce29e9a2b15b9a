"""Row 2 - layout conversion: NJT <-> left/right-padded dense, vectorised vs a per-row loop.

The vectorised side is what the Arctic adapter runs on every call
(``verl.workers.remote_client.arctic.payload``):

* ``njt_to_dense(input_ids, attention_mask, pad)`` - verl's packed tokens into
  Arctic's ``[B, S]`` rows (prompt left-padded, response right-padded);
* ``dense_to_packed(logprobs, attention_mask)`` - Arctic's ``[B, S]`` output back
  into verl's packed ``[T]`` (last slot of each row zeroed, finiteness checked).

The baseline is the same function written per row, as verl's own padding
helpers are (``left_right_2_no_padding``'s position-id loop): for each row,
its attention-mask row selects the columns (``out[i, mask[i]] = row`` /
``dense[i][mask[i]]``), then ``torch.cat`` for the packed direction. Both sides
take the same inputs, handle any mask, and produce identical tensors (checked).
ratio = loop / vectorised (target >= 20x at B=1024).

An informative second baseline, "slice loop", is handed each row's run
(start, length) for free and does one slice copy per row: it is as close to a
memcpy as a Python loop gets, and shows where the memory-bound floor is.

Timed single-threaded (``torch.set_num_threads(1)``): Ray gives the forwarder
one CPU, and on a shared 2-core machine multi-threaded kernels mostly measure
the neighbours' load.

Usage: ``python -m benchmarks.bench_layout [--quick]``.
"""

from __future__ import annotations

import argparse
from typing import Sequence

import torch

from benchmarks.common import Result, format_table, left_right_lengths, time_interleaved

TARGET = 20.0

#: (batch, prompt width, response width): B*S up to ~1M tokens, S up to 4096.
SIZES = [(1024, 64, 192), (1024, 128, 384), (1024, 256, 768), (256, 1024, 3072)]
QUICK_SIZES = [(1024, 64, 192), (1024, 256, 768), (256, 1024, 3072)]
SMOKE_SIZES = [(8, 16, 16)]


def loop_njt_to_dense(values: torch.Tensor, mask: torch.Tensor, pad: int) -> torch.Tensor:
    """Baseline: each row's mask picks the columns its tokens go to."""
    out = values.new_full(mask.shape, pad)
    offset = 0
    for i in range(mask.shape[0]):
        row_mask = mask[i].bool()
        length = int(row_mask.sum())
        out[i, row_mask] = values[offset : offset + length]
        offset += length
    return out


def loop_dense_to_packed(dense: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Baseline: each row's real tokens by its mask (last slot zeroed), concatenated, checked finite."""
    rows = []
    for i in range(dense.shape[0]):
        row = dense[i][mask[i].bool()].to(torch.float32)
        if row.numel():
            row[-1] = 0.0
        rows.append(row)
    packed = torch.cat(rows)
    if not torch.isfinite(packed).all():
        raise ValueError("non-finite")
    return packed


def slice_loop_njt_to_dense(
    values: torch.Tensor, starts: list[int], lengths: list[int], shape, pad: int
) -> torch.Tensor:
    """Informative floor: runs given, one slice copy per row."""
    out = values.new_full(shape, pad)
    offset = 0
    for i, (start, length) in enumerate(zip(starts, lengths)):
        out[i, start : start + length] = values[offset : offset + length]
        offset += length
    return out


def slice_loop_dense_to_packed(dense: torch.Tensor, starts: list[int], lengths: list[int]) -> torch.Tensor:
    """Informative floor: runs given, one slice per row, concatenated."""
    rows = []
    for i, (start, length) in enumerate(zip(starts, lengths)):
        row = dense[i, start : start + length].to(torch.float32)
        row[-1] = 0.0
        rows.append(row)
    packed = torch.cat(rows)
    if not torch.isfinite(packed).all():
        raise ValueError("non-finite")
    return packed


def _case(batch: int, prompt_width: int, response_width: int):
    prompt_len, response_len = left_right_lengths(batch, prompt_width, response_width)
    width = prompt_width + response_width
    cols = torch.arange(width)
    in_prompt = (cols >= prompt_width - prompt_len[:, None]) & (cols < prompt_width)
    in_response = (cols >= prompt_width) & (cols < prompt_width + response_len[:, None])
    attention_mask = (in_prompt | in_response).to(torch.int64)
    lengths = prompt_len + response_len
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    values = torch.randint(3, 50_000, (int(offsets[-1]),))
    input_ids = torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
    logprobs = -torch.rand(batch, width)
    return input_ids, attention_mask, logprobs, (prompt_width - prompt_len).tolist(), lengths.tolist()


def run(sizes: Sequence[tuple[int, int, int]], *, repeats: int = 9) -> list[Result]:
    from verl.workers.remote_client.arctic.payload import dense_to_packed, njt_to_dense

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    results: list[Result] = []
    try:
        for batch, prompt_width, response_width in sizes:
            input_ids, mask, logprobs, starts, lengths = _case(batch, prompt_width, response_width)
            values, shape = input_ids.values(), tuple(mask.shape)
            dense = njt_to_dense(input_ids, mask, 0)
            packed = dense_to_packed(logprobs, mask)
            assert torch.equal(dense, loop_njt_to_dense(values, mask, 0))
            assert torch.equal(dense, slice_loop_njt_to_dense(values, starts, lengths, shape, 0))
            assert torch.equal(packed, loop_dense_to_packed(logprobs, mask))
            assert torch.equal(packed, slice_loop_dense_to_packed(logprobs, starts, lengths))
            times = time_interleaved(
                {
                    "vec_dense": lambda: njt_to_dense(input_ids, mask, 0),
                    "loop_dense": lambda: loop_njt_to_dense(values, mask, 0),
                    "slice_dense": lambda: slice_loop_njt_to_dense(values, starts, lengths, shape, 0),
                    "vec_packed": lambda: dense_to_packed(logprobs, mask),
                    "loop_packed": lambda: loop_dense_to_packed(logprobs, mask),
                    "slice_packed": lambda: slice_loop_dense_to_packed(logprobs, starts, lengths),
                },
                repeats=repeats,
            )
            size = f"B={batch} S={prompt_width + response_width} T={values.numel()}"
            for op, kind in (
                ("NJT -> left/right dense (njt_to_dense)", "dense"),
                ("left/right dense -> packed (dense_to_packed)", "packed"),
            ):
                vec, loop, floor = times[f"vec_{kind}"], times[f"loop_{kind}"], times[f"slice_{kind}"]
                ratio = loop / vec
                target_applies = batch == 1024
                results.append(
                    Result(
                        row="2 layout",
                        case=f"{op} {size}",
                        a=vec,
                        a_label="vectorised s",
                        b=loop,
                        b_label="per-row loop s",
                        ratio=ratio,
                        target=f">= {TARGET:g}x" if target_applies else None,
                        met=(ratio >= TARGET) if target_applies else None,
                        note=f"slice-loop floor {floor * 1e3:.2f} ms = {floor / vec:.1f}x",
                        extra={"slice_loop_s": floor},
                    )
                )
    finally:
        torch.set_num_threads(threads)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    print(format_table(run(QUICK_SIZES if args.quick else SIZES, repeats=args.repeats)))


if __name__ == "__main__":
    main()
