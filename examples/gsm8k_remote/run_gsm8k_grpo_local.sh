#!/usr/bin/env bash
# The main job: GRPO on gsm8k with verl driving the bundled `local` backend, CPU only.
#
#   bash examples/gsm8k_remote/run_gsm8k_grpo_local.sh [MODEL_PATH] [extra hydra overrides...]
#
# 1. sets up the Python environment (scripts/setup_env.sh; first run ~4-5 min, then seconds),
# 2. prepares gsm8k as verl parquet (short questions) from ../shared/data/gsm8k or the HF hub,
# 3. builds a tiny Qwen2-style model + tokenizer locally unless MODEL_PATH is given,
# 4. runs a few GRPO steps (verl prints its metrics after every step) and saves a checkpoint,
# 5. prints a per-step summary table.
#
# Every knob is explained in examples/gsm8k_remote/README.md. Environment overrides:
#   WORK_DIR (outputs/gsm8k_grpo_local), STEPS (4), BATCH (4 prompts), ROLLOUT_N (4 samples/prompt),
#   PROMPT_LEN (192), RESPONSE_LEN (64), LR (1e-5), SAVE_FREQ (2: a checkpoint every 2 steps, so Ctrl-C
#   loses at most 2 steps), PYTHON_BIN (use this interpreter instead of
#   the managed environment of step 1).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
model_path="${1:-}"
if [ $# -gt 0 ]; then shift; fi

work="${WORK_DIR:-$repo/outputs/gsm8k_grpo_local}"
steps="${STEPS:-4}"
batch="${BATCH:-4}"
rollout_n="${ROLLOUT_N:-4}"
prompt_len="${PROMPT_LEN:-192}"
response_len="${RESPONSE_LEN:-64}"
lr="${LR:-1e-5}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"

if [ -n "${PYTHON_BIN:-}" ]; then
    python="$PYTHON_BIN"   # an environment you manage, with this project importable
else
    venv="$(bash "$repo/scripts/setup_env.sh")"
    python="$venv/bin/python"
fi

echo "[gsm8k-local] preparing data in $work/data"
"$python" "$repo/examples/gsm8k_remote/prepare_gsm8k.py" --output-dir "$work/data" \
    --max-question-chars 200 --max-train 256 --max-test 32

if [ -z "$model_path" ]; then
    model_path="$work/tiny_model"
    if [ ! -f "$model_path/config.json" ]; then
        echo "[gsm8k-local] building a tiny Qwen2 model in $model_path"
        "$python" -m verl.remote_backend.tiny_model "$model_path" >/dev/null
    fi
fi
echo "[gsm8k-local] model: $model_path"

metrics="$work/metrics.jsonl"
rm -f "$metrics"
export VERL_FILE_LOGGER_PATH="$metrics" HYDRA_FULL_ERROR=1 TOKENIZERS_PARALLELISM=false

cd "$work"
"$python" -m verl.remote_backend.main_ppo \
    hydra.run.dir="$work/hydra" \
    trainer.remote_backend=local \
    algorithm.adv_estimator=grpo \
    data.train_files="$work/data/train.parquet" \
    data.val_files="$work/data/test.parquet" \
    data.train_batch_size="$batch" \
    data.max_prompt_length="$prompt_len" \
    data.max_response_length="$response_len" \
    data.filter_overlong_prompts=true \
    data.truncation=left \
    data.dataloader_num_workers=0 \
    actor_rollout_ref.model.path="$model_path" \
    actor_rollout_ref.actor.optim.lr="$lr" \
    actor_rollout_ref.actor.ppo_mini_batch_size="$batch" \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$((batch * rollout_n))" \
    actor_rollout_ref.rollout.n="$rollout_n" \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$((batch * rollout_n))" \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="$((batch * rollout_n))" \
    actor_rollout_ref.rollout.agent.num_workers=1 \
    reward.num_workers=1 \
    remote_backend.local.device=cpu \
    trainer.logger='[console,file]' \
    trainer.project_name=verl_remote_backend \
    trainer.experiment_name=gsm8k_grpo_local \
    trainer.default_local_dir="$work/checkpoints" \
    trainer.resume_mode=disable \
    trainer.val_before_train=false \
    trainer.test_freq=-1 \
    trainer.save_freq="${SAVE_FREQ:-2}" \
    trainer.total_training_steps="$steps" \
    "$@"

"$python" - "$metrics" "$work/checkpoints" <<'EOF'
import json, os, sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
rows = [row for row in rows if "timing_s/step" in row["data"]]  # training steps (not validation-only logs)
columns = {"critic/score/mean": "score", "response_length/mean": "resp_len", "actor/pg_loss": "pg_loss",
           "actor/grad_norm": "grad_norm", "perf/mfu/actor": "mfu_update", "timing_s/gen": "gen_s",
           "timing_s/update_actor": "update_s", "timing_s/step": "step_s"}
keys = list(columns)
print("\n[gsm8k-local] per-step summary")
print("step " + " ".join(f"{label:>11}" for label in columns.values()))
for row in rows:
    print(f"{row['step']:>4} " + " ".join(f"{row['data'].get(k, float('nan')):>11.4g}" for k in keys))
ckpt = sys.argv[2]
latest = open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read().strip()
print(f"[gsm8k-local] checkpoint: {os.path.join(ckpt, 'global_step_' + latest)}")
EOF
