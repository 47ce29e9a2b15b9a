"""Write GSM8K as verl's RL parquet files (train.parquet, test.parquet).

Each row is what verl's gsm8k reward and RLHFDataset expect:

* ``data_source = "openai/gsm8k"`` - routes scoring to verl's gsm8k scorer;
* ``prompt`` - one chat message: the question plus an instruction to end with ``#### <answer>``;
* ``reward_model = {"style": "rule", "ground_truth": "<number after ####>"}``;
* ``ability = "math"`` and ``extra_info`` (split, index, original question/answer).

Sources, first found wins: ``--input-dir`` with ``{train,test}.jsonl[.gz]``
(default: ``../shared/data/gsm8k`` next to the repository), else the Hugging
Face hub (``openai/gsm8k``, config ``main``; needs ``datasets`` and network).

Small, fast CI subsets: ``--max-question-chars 200 --max-train 64 --max-test 16``.

Usage::

    python examples/gsm8k_remote/prepare_gsm8k.py --output-dir data/gsm8k [--input-dir DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator
from typing import Any, Optional

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_INPUT_DIR = os.path.join(REPO_ROOT, "..", "shared", "data", "gsm8k")
SPLITS = ("train", "test")

#: A worked example put before the question with ``--worked-example``: it shows a 135M model the
#: ``#### <number>`` ending (written for this project, not a gsm8k row).
WORKED_EXAMPLE = (
    "Example: A farm has 17 cows, buys 26 more and sells 8. How many cows does it have now?\n"
    "17 + 26 = 43 cows. 43 - 8 = 35 cows.\n#### 35\n\nQuestion: "
)

_FINAL_ANSWER = re.compile(r"####\s*(-?[0-9.,]+)")


def extract_final_answer(solution: str) -> str:
    """The number after ``####`` in a GSM8K solution, without thousands separators.

    Raises:
        ValueError: the solution has no ``#### <number>`` line.
    """
    match = _FINAL_ANSWER.search(solution)
    if match is None:
        raise ValueError(f"GSM8K solution has no '#### <number>' line: {solution[-80:]!r}")
    return match.group(1).replace(",", "").rstrip(".")


def to_verl_row(question: str, answer: str, split: str, index: int, *, worked_example: bool = False) -> dict[str, Any]:
    """One GSM8K record in verl's RL dataset layout (the question preceded by
    :data:`WORKED_EXAMPLE` when ``worked_example``)."""
    prefix = WORKED_EXAMPLE if worked_example else ""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{prefix}{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": extract_final_answer(answer)},
        "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
    }


def _read_jsonl(path: str) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _local_split(input_dir: str, split: str) -> Optional[str]:
    for name in (f"{split}.jsonl.gz", f"{split}.jsonl"):
        path = os.path.join(input_dir, name)
        if os.path.exists(path):
            return path
    return None


def load_records(split: str, input_dir: Optional[str]) -> Iterable[dict[str, Any]]:
    """``{"question", "answer"}`` records of one split, from ``input_dir`` or the hub."""
    if input_dir:
        path = _local_split(input_dir, split)
        if path is not None:
            print(f"[prepare_gsm8k] {split}: reading {path}")
            return _read_jsonl(path)
    print(f"[prepare_gsm8k] {split}: no local file in {input_dir!r}; downloading openai/gsm8k from the hub")
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit("GSM8K files not found and the `datasets` package is missing; pass --input-dir") from exc
    return datasets.load_dataset("openai/gsm8k", "main", split=split)


def build_rows(
    records: Iterable[dict[str, Any]],
    split: str,
    *,
    max_rows: Optional[int],
    max_question_chars: Optional[int],
    worked_example: bool = False,
) -> list[dict[str, Any]]:
    """Convert records, keeping the first ``max_rows`` whose question fits ``max_question_chars``."""
    rows: list[dict[str, Any]] = []
    for index, record in enumerate(records):
        if max_rows is not None and len(rows) >= max_rows:
            break
        if max_question_chars is not None and len(record["question"]) > max_question_chars:
            continue
        rows.append(to_verl_row(record["question"], record["answer"], split, index, worked_example=worked_example))
    return rows


def write_parquet(rows: list[dict[str, Any]], path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True, help="where train.parquet and test.parquet are written")
    parser.add_argument("--input-dir", default=DEFAULT_INPUT_DIR, help="folder with {train,test}.jsonl[.gz]")
    parser.add_argument("--max-train", type=int, default=None, help="keep at most this many train rows")
    parser.add_argument("--max-test", type=int, default=None, help="keep at most this many test rows")
    parser.add_argument(
        "--max-question-chars", type=int, default=None, help="drop questions longer than this (short prompts for CI)"
    )
    parser.add_argument(
        "--worked-example",
        action="store_true",
        help="put a short worked example with the '#### <number>' ending before each question",
    )
    args = parser.parse_args(argv)
    limits = {"train": args.max_train, "test": args.max_test}
    for split in SPLITS:
        rows = build_rows(
            load_records(split, args.input_dir),
            split,
            max_rows=limits[split],
            max_question_chars=args.max_question_chars,
            worked_example=args.worked_example,
        )
        if not rows:
            print(f"[prepare_gsm8k] {split}: no rows left after filtering", file=sys.stderr)
            return 1
        out = os.path.join(args.output_dir, f"{split}.parquet")
        write_parquet(rows, out)
        print(f"[prepare_gsm8k] {split}: wrote {len(rows)} rows to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
