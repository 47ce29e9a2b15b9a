"""Arctic settings derived from verl's config, and the client config built from them.

Defaults live in ``verl/remote_backend/config/backend/arctic.yaml`` (every
key documented there). A ``null`` there means "derive it from verl's config",
done here in one place so the derivation is testable:

==============================  ==================================================
Arctic setting                  derived from
==============================  ==================================================
optimizer lr / betas / wd       ``actor_rollout_ref.actor.optim``
gradient clipping               ``verl_settings.max_grad_norm``
LR warmup / cosine schedule     ``verl_settings.lr_schedule`` (x optimizer steps per step)
samples per optimizer step      ``actor.ppo_mini_batch_size x rollout.n``
micro-batch size                ``actor.ppo_micro_batch_size_per_gpu`` (else 1)
max sequence length             ``data.max_prompt_length + data.max_response_length``
checkpoint directory            ``trainer.default_local_dir``
reference (log-prob) GPUs       1 when ``verl_settings.needs_reference``, else 0
vLLM memory / batching          ``actor_rollout_ref.rollout.*``
==============================  ==================================================

Nothing here imports ``arctic_platform`` at module level; only
:func:`build_client_config` does, when called.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Optional

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.settings.loader import select
from verl.remote_backend.settings.verl_config import lr_schedule, max_grad_norm, model_path, needs_reference
from verl.workers.remote_client.arctic.config import ArcticConfig
from verl.workers.remote_client.arctic.json_data import to_json_safe

if TYPE_CHECKING:
    from arctic_platform.client import ArcticClientConfig
    from omegaconf import DictConfig

__all__ = [
    "derive_ds_config",
    "derive_log_prob_ds_config",
    "log_prob_rows_per_request",
    "check_zero_stage",
    "ZERO_STAGES",
    "derive_ds_worker_config",
    "derive_vllm_config",
    "rollout_logprobs_mode",
    "max_seq_len",
    "resolved_log_prob_gpus",
    "build_client_config",
    "check_loss_compatibility",
    "SUPPORTED_AGG_MODES",
    "optimizer_steps_per_global_step",
]


def optimizer_steps_per_global_step(main_config: "DictConfig") -> int:
    """DeepSpeed optimizer steps per verl global step: ``train_batch_size / ppo_mini_batch_size x ppo_epochs``."""
    train_bs = int(select(main_config, "data.train_batch_size", 1))
    mini_bs = int(select(main_config, "actor_rollout_ref.actor.ppo_mini_batch_size", train_bs))
    epochs = int(select(main_config, "actor_rollout_ref.actor.ppo_epochs", 1))
    return max(1, train_bs // max(1, mini_bs)) * epochs


def derive_ds_config(main_config: "DictConfig", arctic: ArcticConfig, *, n_gpus: int, training: bool = True) -> dict:
    """The DeepSpeed config Arctic's engine gets, from verl's actor/optim settings.

    One DeepSpeed optimizer step == one verl PPO mini-batch, so
    ``train_batch_size = ppo_mini_batch_size x rollout.n``. LR schedules are
    expressed in optimizer steps (verl counts global steps, each holding
    ``ppo_epochs x train_batch_size / ppo_mini_batch_size`` optimizer steps).
    ``remote_backend.arctic.deepspeed`` is merged on top (it wins).
    """
    actor = "actor_rollout_ref.actor"
    rollout_n = int(select(main_config, "actor_rollout_ref.rollout.n", 1))
    mini_bs = int(select(main_config, f"{actor}.ppo_mini_batch_size", 1)) * rollout_n
    micro = int(arctic.micro_batch_size or select(main_config, f"{actor}.ppo_micro_batch_size_per_gpu", 1) or 1)
    if select(main_config, f"{actor}.loss_agg_mode", "token-mean") == "seq-mean-token-mean":
        # The server's loss sees each micro-batch as one packed row [1, T]: its per-sequence mean is a
        # per-micro-batch mean. With one sequence per micro-batch the two coincide.
        if arctic.micro_batch_size not in (None, 1):
            raise ConfigError(
                f"remote_backend.arctic.micro_batch_size={arctic.micro_batch_size} with "
                f"{actor}.loss_agg_mode=seq-mean-token-mean: Arctic's verl_grpo loss averages each micro-batch as "
                "one sequence, so only micro_batch_size=1 trains verl's objective. Fix: set "
                "remote_backend.arctic.micro_batch_size=null (or 1), or use loss_agg_mode=token-mean"
            )
        micro = 1
    if mini_bs % (micro * n_gpus) != 0:
        raise ConfigError(
            f"ppo_mini_batch_size x rollout.n = {mini_bs} samples per optimizer step is not divisible by "
            f"micro-batch size {micro} x {n_gpus} GPU(s); set remote_backend.arctic.micro_batch_size "
            f"(or actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu) to a divisor"
        )
    ds: dict[str, Any] = {
        "train_batch_size": mini_bs,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": mini_bs // (micro * n_gpus),
    }
    if training:
        optim = f"{actor}.optim"
        lr = float(select(main_config, f"{optim}.lr", 1e-6))
        ds["optimizer"] = {
            "type": "AdamW",
            "params": {
                "lr": lr,
                "betas": [float(b) for b in select(main_config, f"{optim}.betas", [0.9, 0.999])],
                "weight_decay": float(select(main_config, f"{optim}.weight_decay", 0.01)),
                "eps": 1e-8,
            },
        }
        ds["gradient_clipping"] = max_grad_norm(main_config)
        scheduler = _derive_scheduler(main_config, lr)
        if scheduler is not None:
            ds["scheduler"] = scheduler
    merged = _deep_merge(ds, to_json_safe(arctic.deepspeed) or {})
    check_zero_stage(merged)
    if not training:
        merged.pop("optimizer", None)
        merged.pop("scheduler", None)
    return merged


#: What DeepSpeed 0.19 accepts as ``zero_optimization.stage``.
ZERO_STAGES = (0, 1, 2, 3)


def check_zero_stage(ds_config: dict) -> int:
    """The training job's ZeRO stage, refused before start-up where DeepSpeed's ``initialize`` would refuse it.

    Arctic loads the model in bf16 (``ModelSpec.from_ds_worker_config``) and defaults gradient accumulation to
    fp32 (``ds_training_config``); DeepSpeed's engine raises ``unsupported mix of model_dtype=torch.bfloat16
    and grad_accum_dtype=torch.float32`` for that mix at stage 0 (stages 1-3 wrap it in their own optimizer).
    """
    key = "remote_backend.arctic.deepspeed"
    stage = (ds_config.get("zero_optimization") or {}).get("stage", 0)
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in ZERO_STAGES:
        raise ConfigError.for_setting(
            f"{key}.zero_optimization.stage",
            stage,
            f"DeepSpeed knows stages {list(ZERO_STAGES)}",
            "set it to 1 (the default)",
        )
    if stage == 0:
        accum = str((ds_config.get("data_types") or {}).get("grad_accum_dtype", "fp32"))
        if accum not in ("bf16", "bfloat16"):
            raise ConfigError(
                f"{key}.zero_optimization.stage=0 with {key}.data_types.grad_accum_dtype={accum}: Arctic trains a bf16 "
                "model, and DeepSpeed's initialize refuses bf16 weights with fp32 gradient accumulation at stage 0 "
                "('unsupported mix of model_dtype=torch.bfloat16 and grad_accum_dtype=torch.float32'). Fix: set "
                f"{key}.zero_optimization.stage=1 (the default), or {key}.data_types.grad_accum_dtype=bf16"
            )
    return int(stage)


def derive_log_prob_ds_config(main_config: "DictConfig", arctic: ArcticConfig) -> dict:
    """The forward-only DeepSpeed config of Arctic's log-prob (reference) job.

    Arctic's ``ds_inference_config`` keeps only the micro-batch size, ``zero_optimization`` and
    ``sequence_parallel_size`` of it. ZeRO stages 1 and 2 shard optimizer state, which a job without an
    optimizer does not have (DeepSpeed asserts ``zero stage 1 requires an optimizer``), so the log-prob job
    gets the training job's stage only at 3 (parameter sharding) and stage 0 otherwise. How many rows one
    request carries is decided client-side (:func:`log_prob_rows_per_request`).
    """
    zero = dict((to_json_safe(arctic.deepspeed) or {}).get("zero_optimization") or {})
    micro = select(main_config, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", None) or 1
    cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": int(micro)}
    if zero.get("stage") == 3:
        zero.pop("offload_optimizer", None)
        cfg["zero_optimization"] = zero
    return cfg


def log_prob_rows_per_request(main_config: "DictConfig", arctic: ArcticConfig, *, ref: bool) -> Optional[int]:
    """Rows of one ``/forward`` request for verl's log-prob micro-batch settings (``None``: no split).

    The server runs a request as ``gradient_accumulation_steps`` micro-batches, each packed into one row
    with full logits: the log-prob job has one (the whole request), the training job ``ppo_mini_batch_size
    x rollout.n / (micro x GPUs)``. Splitting client-side into ``log_prob_micro_batch_size_per_gpu x GPUs``
    rows (x the training job's accumulation steps) bounds the server's memory as verl's micro-batches bound
    its own; each row's result does not depend on which request carried it.
    """
    role = "ref" if ref else "rollout"
    micro = select(main_config, f"actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu", None)
    if not micro:
        return None
    if ref:
        return int(micro) * max(1, resolved_log_prob_gpus(main_config, arctic))
    ds = derive_ds_config(main_config, arctic, n_gpus=int(arctic.training_gpus))
    return int(micro) * int(ds["gradient_accumulation_steps"]) * int(arctic.training_gpus)


def _derive_scheduler(main_config: "DictConfig", lr: float) -> Optional[dict]:
    """verl's schedule (:func:`~verl.remote_backend.settings.verl_config.lr_schedule`) as DeepSpeed's, in optimizer
    steps."""
    schedule = lr_schedule(main_config)
    per_step = optimizer_steps_per_global_step(main_config)
    warmup = schedule.warmup_steps * per_step
    if schedule.style == "cosine":
        if schedule.num_cycles != 0.5:
            raise ConfigError.for_setting(
                "actor_rollout_ref.actor.optim.num_cycles",
                schedule.num_cycles,
                "DeepSpeed's WarmupCosineLR decays over one half-wave only",
                "set it to 0.5 (verl's default), or use lr_scheduler_type=constant",
            )
        return {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": schedule.total_steps * per_step,
                "warmup_num_steps": warmup,
                "warmup_min_ratio": 0.0,
                "cos_min_ratio": schedule.min_lr_ratio,
                "warmup_type": "linear",
            },
        }
    if warmup > 0:
        return {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr, "warmup_num_steps": warmup, "warmup_type": "linear"},
        }
    return None


def derive_ds_worker_config(main_config: "DictConfig", arctic: ArcticConfig) -> dict:
    """Arctic's DeepSpeed worker knobs from ``actor_rollout_ref.model``; the ``ds_worker`` block wins."""
    model = "actor_rollout_ref.model"
    worker: dict[str, Any] = {
        "use_liger": bool(select(main_config, f"{model}.use_liger", False)),
        "enable_gradient_checkpointing": bool(select(main_config, f"{model}.enable_gradient_checkpointing", True)),
        "attn_implementation": select(main_config, f"{model}.override_config.attn_implementation", "flash_attention_2"),
    }
    if arctic.zorro.train:
        data_len = int(select(main_config, "data.max_response_length", 0))
        worker.update(
            zorro_train_enable=True,
            response_len=data_len,
            max_token_len=int(select(main_config, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 16384)),
            rollout_n=int(select(main_config, "actor_rollout_ref.rollout.n", 1)),
            temperature=float(select(main_config, "actor_rollout_ref.rollout.temperature", 1.0)),
            use_unpad=True,
            logits_optimization=arctic.logits.optimization,
            logits_optimization_peak_mem_size_in_gib=arctic.logits.peak_mem_gib,
            logits_compute_from_fp32_inputs=arctic.logits.compute_from_fp32_inputs,
            logits_compute_in_fp32=arctic.logits.compute_in_fp32,
        )
    return _deep_merge(worker, to_json_safe(arctic.ds_worker) or {})


def max_seq_len(main_config: "DictConfig") -> int:
    return int(select(main_config, "data.max_prompt_length", 512)) + int(
        select(main_config, "data.max_response_length", 512)
    )


def derive_vllm_config(main_config: "DictConfig", arctic: ArcticConfig) -> dict:
    """vLLM engine kwargs for Arctic's sampler, from ``actor_rollout_ref.rollout``; ``sampling.vllm`` wins."""
    rollout = "actor_rollout_ref.rollout"
    s = arctic.sampling
    vllm = {
        "tensor_parallel_size": int(s.tensor_parallel_size),
        "gpu_memory_utilization": float(
            s.gpu_memory_utilization or select(main_config, f"{rollout}.gpu_memory_utilization", 0.5)
        ),
        "max_model_len": int(select(main_config, f"{rollout}.max_model_len", None) or max_seq_len(main_config)),
        "max_num_seqs": int(s.max_num_seqs or select(main_config, f"{rollout}.max_num_seqs", 1024)),
        "enforce_eager": bool(
            s.enforce_eager if s.enforce_eager is not None else select(main_config, f"{rollout}.enforce_eager", False)
        ),
        "enable_chunked_prefill": bool(
            s.enable_chunked_prefill
            if s.enable_chunked_prefill is not None
            else select(main_config, f"{rollout}.enable_chunked_prefill", True)
        ),
    }
    merged = _deep_merge(vllm, to_json_safe(s.vllm) or {})
    merged["logprobs_mode"] = rollout_logprobs_mode(main_config, arctic)
    return merged


#: vLLM log-prob modes whose values are log-probabilities (the ``*_logits`` modes return logits).
_LOGPROB_MODES = ("processed_logprobs", "raw_logprobs")


def rollout_logprobs_mode(main_config: "DictConfig", arctic: ArcticConfig) -> str:
    """What Arctic's vLLM returns as rollout log-probs: verl's ``rollout.logprobs_mode`` (``processed_logprobs``).

    vLLM's own default is ``raw_logprobs`` (before temperature, top-k and top-p); verl's vLLM rollout asks for
    ``processed_logprobs``, the log-probs of the distribution it sampled from, which its importance weights
    and rollout-vs-trainer metrics assume. Arctic passes unknown ``vllm`` keys to the engine, so the key is set here.
    """
    key = "actor_rollout_ref.rollout.logprobs_mode"
    mode = str(select(main_config, key, None) or "processed_logprobs")
    if mode not in _LOGPROB_MODES:
        raise ConfigError.for_setting(key, mode, "its values are not log-probabilities", "set it to processed_logprobs")
    override = (arctic.sampling.vllm or {}).get("logprobs_mode")
    if override is not None and override != mode:
        raise ConfigError.for_setting(
            "remote_backend.arctic.sampling.vllm.logprobs_mode",
            override,
            f"rollout log-probs would not mean what verl expects ({key}={mode})",
            f"remove it; set {key} to choose the mode",
        )
    return mode


def _arctic_inference_config(arctic: ArcticConfig) -> Optional[dict]:
    if not arctic.zorro.fca and not arctic.zorro.speculative_model:
        return None
    return {
        "zorro_inference": {"enable": bool(arctic.zorro.fca)},
        "speculative_decoding": {"model": arctic.zorro.speculative_model},
    }


def resolved_log_prob_gpus(main_config: "DictConfig", arctic: ArcticConfig) -> int:
    if arctic.log_prob_gpus is not None:
        return int(arctic.log_prob_gpus)
    return 1 if needs_reference(main_config) else 0


def build_client_config(main_config: "DictConfig", arctic: ArcticConfig) -> "ArcticClientConfig":
    """The ``arctic_platform.client.ArcticClientConfig`` for a fresh backend (jobs not created yet)."""
    from arctic_platform.client import ArcticClientConfig, OnPremConfig, TrainingConfig
    from arctic_platform.client import SamplingConfig as ArcticSamplingConfig

    log_prob_gpus = resolved_log_prob_gpus(main_config, arctic)
    if needs_reference(main_config) and log_prob_gpus == 0:
        raise ConfigError(
            "this run needs reference log-probs (actor.use_kl_loss or algorithm.use_kl_in_reward), but "
            "remote_backend.arctic.log_prob_gpus=0; Arctic computes them on its log-prob job: set it to >= 1"
        )
    checkpoint_dir = arctic.checkpoint_dir or select(main_config, "trainer.default_local_dir", None)
    if not checkpoint_dir:
        raise ConfigError(
            "set remote_backend.arctic.checkpoint_dir or trainer.default_local_dir (Arctic's training job needs one)"
        )
    return ArcticClientConfig(
        model_name=model_path(main_config),
        seed=arctic.seed,
        max_seq_len=max_seq_len(main_config),
        training_gpus=int(arctic.training_gpus),
        sampling_gpus=int(arctic.sampling_gpus),
        log_prob_gpus=log_prob_gpus,
        job_ready_timeout=float(arctic.job_ready_timeout_s),
        request_timeout=float(arctic.request_timeout_s),
        training=TrainingConfig(
            full_determinism=bool(arctic.full_determinism),
            checkpoint_path=str(checkpoint_dir),
            ds_config=derive_ds_config(main_config, arctic, n_gpus=int(arctic.training_gpus)),
            ds_worker_config=derive_ds_worker_config(main_config, arctic),
            cuda_ipc=bool(arctic.weight_sync.cuda_ipc),
            low_memory=bool(arctic.weight_sync.low_memory),
        ),
        sampling=ArcticSamplingConfig(
            vllm=derive_vllm_config(main_config, arctic),
            arctic_inference_config=_arctic_inference_config(arctic),
            log_prob_engine="deepspeed",
            log_prob_ds_config=derive_log_prob_ds_config(main_config, arctic) if log_prob_gpus else None,
        ),
        backend=OnPremConfig(
            protocol=arctic.protocol,
            host=arctic.host,
            port=int(arctic.port),
            colocate=bool(arctic.colocate),
            # We start the server ourselves (bound to `host`), never through the
            # client's launcher, which binds 0.0.0.0.
            launch_local_server=False,
            startup_timeout=float(arctic.startup_timeout_s),
        ),
    )


# Actor settings Arctic 0.1.4's server-side "verl_grpo" loss reads or hard-codes.
_VERL_GRPO_FIXED = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0}
#: loss_agg_mode values that train verl's objective on Arctic's server (see the README's matrix).
SUPPORTED_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
# The "+" (straight-through) variants reach ``kl_penalty_forward`` unchanged there and raise NotImplementedError.
_KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def check_loss_compatibility(main_config: "DictConfig", arctic: ArcticConfig) -> list[str]:
    """Settings for which Arctic's server loss would not train verl's configured objective.

    Arctic 0.1.4's ``verl_grpo`` loss runs on each micro-batch packed into one row
    ``[1, T]`` (prompt + response tokens, all sequences). It implements verl's
    *vanilla* PPO clip with fixed clip ratios (0.2 / 0.2, dual-clip 3.0) and the
    KL loss; measured against verl's objective on Arctic's own code
    (``tests/e2e/test_arctic_parity.py``):

    * ``token-mean`` and ``seq-mean-token-sum`` match; ``seq-mean-token-mean``
      matches with one sequence per micro-batch (:func:`derive_ds_config` sets it);
    * ``seq-mean-token-sum-norm`` divides by the packed length ``T`` where verl
      divides by the response width, and the server fixes ``loss_scale_factor``;
    * the entropy bonus pairs each response token with the entropy of the
      distribution *after* it (the server shifts log-probs to the tokens but not
      entropy), unless ZoRRo computes both token-aligned (``zorro.train``);
    * ``kl_loss_type=full`` and the ``+`` variants (``k3+`` ...) raise ``NotImplementedError`` on the server.

    Returns one message per mismatch (key, value, why, what works); empty when the
    objectives agree. ``ArcticBackend.check_config`` refuses any before Ray starts.
    """
    if arctic.loss_fn != "verl_grpo":
        return []
    actor = "actor_rollout_ref.actor"
    problems = []
    mode = select(main_config, f"{actor}.policy_loss.loss_mode", "vanilla")
    if mode != "vanilla":
        problems.append(f"{actor}.policy_loss.loss_mode={mode!r} (Arctic's verl_grpo loss implements 'vanilla' only)")
    for key, fixed in _VERL_GRPO_FIXED.items():
        value = select(main_config, f"{actor}.{key}", fixed)
        if value is not None and abs(float(value) - fixed) > 1e-12:
            problems.append(f"{actor}.{key}={value} (Arctic's verl_grpo loss uses {fixed})")
    agg = select(main_config, f"{actor}.loss_agg_mode", "token-mean")
    if agg not in SUPPORTED_AGG_MODES:
        why = (
            "the server divides by the packed micro-batch length instead of verl's response width"
            if agg == "seq-mean-token-sum-norm"
            else "unknown to Arctic's verl_grpo loss"
        )
        problems.append(f"{actor}.loss_agg_mode={agg!r}: {why} (supported: {list(SUPPORTED_AGG_MODES)})")
    if select(main_config, f"{actor}.loss_scale_factor", None) is not None:
        problems.append(f"{actor}.loss_scale_factor is set (Arctic's verl_grpo loss ignores it)")
    entropy_coeff = float(select(main_config, f"{actor}.entropy_coeff", 0.0) or 0.0)
    if entropy_coeff != 0.0 and not arctic.zorro.train:
        problems.append(
            f"{actor}.entropy_coeff={entropy_coeff}: without ZoRRo Arctic's loss weights the entropy of the "
            "position after each response token (set entropy_coeff=0, or remote_backend.arctic.zorro.train=true)"
        )
    if bool(select(main_config, f"{actor}.use_kl_loss", False)):
        kl_type = str(select(main_config, f"{actor}.kl_loss_type", "low_var_kl"))
        if kl_type not in _KL_TYPES:
            problems.append(f"{actor}.kl_loss_type={kl_type!r} (Arctic's verl_grpo loss implements {list(_KL_TYPES)})")
    return problems


def _deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
