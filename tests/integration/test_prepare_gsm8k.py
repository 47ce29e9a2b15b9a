"""The gsm8k preparation script writes what verl's dataset and gsm8k scorer expect."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from support.remote_e2e import GSM8K_DIR, REPO_ROOT, load_example

prepare = load_example("prepare_gsm8k")
SCRIPT = REPO_ROOT / "examples" / "gsm8k_remote" / "prepare_gsm8k.py"


@pytest.mark.parametrize(
    "solution, expected",
    [("She has 3 + 4 = 7.\n#### 7", "7"), ("#### 1,234", "1234"), ("#### -5", "-5"), ("x\n####  2.5", "2.5")],
)
def test_final_answer_is_the_number_after_the_hashes(solution, expected):
    assert prepare.extract_final_answer(solution) == expected


def test_a_solution_without_an_answer_is_rejected():
    with pytest.raises(ValueError, match="####"):
        prepare.extract_final_answer("no answer here")


def test_row_layout_routes_to_verls_gsm8k_scorer():
    from verl.utils.reward_score import default_compute_score

    row = prepare.to_verl_row("What is 3 + 4?", "3 + 4 = 7\n#### 7", "train", 5)
    assert row["data_source"] == "openai/gsm8k"
    assert row["prompt"] == [{"role": "user", "content": f"What is 3 + 4? {prepare.INSTRUCTION}"}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": "7"}
    assert row["extra_info"]["index"] == 5 and row["ability"] == "math"
    assert default_compute_score(row["data_source"], "so #### 7", row["reward_model"]["ground_truth"]) == 1.0
    assert default_compute_score(row["data_source"], "so #### 8", row["reward_model"]["ground_truth"]) == 0.0


def test_the_worked_example_precedes_the_question_and_keeps_the_question_for_the_reward():
    row = prepare.to_verl_row("What is 3 + 4?", "3 + 4 = 7\n#### 7", "train", 5, worked_example=True)
    content = row["prompt"][0]["content"]
    assert content == f"{prepare.WORKED_EXAMPLE}What is 3 + 4? {prepare.INSTRUCTION}"
    assert "#### " in prepare.WORKED_EXAMPLE and row["extra_info"]["question"] == "What is 3 + 4?"


def test_cli_writes_filtered_parquet_from_the_jsonl_files(tmp_path):
    subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--output-dir",
            str(tmp_path),
            "--input-dir",
            str(GSM8K_DIR),
            "--max-train",
            "10",
            "--max-test",
            "3",
            "--max-question-chars",
            "120",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    train = pq.read_table(tmp_path / "train.parquet").to_pylist()
    test = pq.read_table(tmp_path / "test.parquet").to_pylist()
    assert len(train) == 10 and len(test) == 3
    assert all(len(r["extra_info"]["question"]) <= 120 for r in train + test)
    with gzip.open(GSM8K_DIR / "train.jsonl.gz", "rt") as f:
        source = {r["question"]: r["answer"] for r in map(json.loads, f)}
    for row in train:
        assert (
            prepare.extract_final_answer(source[row["extra_info"]["question"]]) == row["reward_model"]["ground_truth"]
        )


def test_plain_jsonl_input_works_too(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for split in ("train", "test"):
        (src / f"{split}.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    assert prepare.main(["--input-dir", str(src), "--output-dir", str(tmp_path / "out")]) == 0
    assert pq.read_table(tmp_path / "out" / "test.parquet").to_pylist()[0]["reward_model"]["ground_truth"] == "2"
