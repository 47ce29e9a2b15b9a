#!/usr/bin/env bash
# GRPO on gsm8k with verl driving a real Arctic RL server (arctic-platform 0.1.4) on ONE GPU.
#
# verl keeps the algorithm (data, rewards, advantages); Arctic does the compute:
# DeepSpeed training, vLLM sampling and a DeepSpeed reference model, colocated on
# the same GPU. verl itself runs CPU-only (one forwarder, one rollout replica).
#
# Needs, on the GPU machine:
#   pip install 'verl-remote-backend[arctic]'      # arctic-platform[sft] + this plugin
#   Arctic's server extras (vLLM + ArcticInference; see arctic-platform's docs: its "rl" extra)
#   python examples/gsm8k_remote/prepare_gsm8k.py --output-dir "$DATA_DIR"
#
# Two ways to get a server:
#   LAUNCH_SERVER=true  (default) the backend starts `python -m arctic_platform.common.http_server`
#                       bound to $ARCTIC_HOST:$ARCTIC_PORT and stops it at the end;
#   LAUNCH_SERVER=false attach to one you started yourself, e.g.
#       python -m arctic_platform.common.http_server --host 127.0.0.1 --port 8000 \
#           --training-gpus 1 --sampling-gpus 1 --log-prob-gpus 1 --log-prob-engine deepspeed --colocate
#
# ---- settings you must / may change -------------------------------------------------
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}        # MUST be a local path or a hub id the server can load
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}             # MUST contain train.parquet / test.parquet (prepare_gsm8k.py)
CKPT_DIR=${CKPT_DIR:-$PWD/checkpoints/gsm8k_grpo_arctic}   # verl + Arctic checkpoints land here
ARCTIC_HOST=${ARCTIC_HOST:-127.0.0.1}              # server address (keep 127.0.0.1 for a launched server)
ARCTIC_PORT=${ARCTIC_PORT:-8000}
LAUNCH_SERVER=${LAUNCH_SERVER:-true}
GPU_MEM=${GPU_MEM:-0.4}                            # vLLM share of the GPU; DeepSpeed + the reference use the rest
PEAK_FLOPS=${PEAK_FLOPS:-989e12}                   # one GPU's dense bf16 peak (H100 SXM), for verl's MFU
STEPS=${STEPS:-20}
# --------------------------------------------------------------------------------------

set -euo pipefail

python -m verl.remote_backend.main_ppo \
    trainer.remote_backend=arctic \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_DIR/train.parquet" \
    data.val_files="$DATA_DIR/test.parquet" \
    data.train_batch_size=64 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    data.filter_overlong_prompts=true \
    data.truncation=error \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_MEM" \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.agent.num_workers=4 \
    remote_backend.arctic.host="$ARCTIC_HOST" \
    remote_backend.arctic.port="$ARCTIC_PORT" \
    remote_backend.arctic.launch_server="$LAUNCH_SERVER" \
    remote_backend.arctic.training_gpus=1 \
    remote_backend.arctic.sampling_gpus=1 \
    remote_backend.arctic.log_prob_gpus=1 \
    remote_backend.arctic.colocate=true \
    remote_backend.arctic.device.type=cuda \
    remote_backend.arctic.device.peak_flops="$PEAK_FLOPS" \
    trainer.logger='[console]' \
    trainer.project_name=verl_remote_backend \
    trainer.experiment_name=gsm8k_grpo_arctic \
    trainer.default_local_dir="$CKPT_DIR" \
    trainer.save_freq=10 \
    trainer.test_freq=10 \
    trainer.total_training_steps="$STEPS" \
    "$@"
