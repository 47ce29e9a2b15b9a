"""What the adapter sends Arctic starts Arctic's real DeepSpeed jobs; what the real engine refuses is refused first.

Each job config below is the adapter's own (``build_client_config(...).to_onprem(job_type)``, what Arctic's
``/initialize`` hands its workers), started by Arctic's ``DeepSpeedWorker.initialize`` on DeepSpeed 0.19's CPU
engine (``tests/arctic_standin/engine_probe.py``) in Arctic's own number format (bf16 model, fp32 gradient
accumulation) unless a test says float32. Where the stand-in still replaces a part (ZoRRo's patched forward,
flash-attention's varlen kernel), a test shows it fails on the input where the real part fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from arctic_standin.harness import compose_config

PROBE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "arctic_standin", "engine_probe.py")


def probe(jobs: list[dict], **request) -> list[dict]:
    """Run the jobs in a fresh process (one gloo rank); one result dict per job."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "ARCTIC_STANDIN_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, PROBE, json.dumps({"jobs": jobs, **request})],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    results = [json.loads(line[len("PROBE ") :]) for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert len(results) == len(jobs), f"probe exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return results


def adapter_jobs(cfg) -> dict[str, dict]:
    """The /initialize payloads of the adapter's training and (when configured) log-prob jobs."""
    from verl.workers.remote_client.arctic.config import load_arctic_config
    from verl.workers.remote_client.arctic.derive import build_client_config

    client_cfg = build_client_config(cfg, load_arctic_config(cfg))
    jobs = {"training": client_cfg.to_onprem("training")}
    if client_cfg.log_prob_gpus:
        jobs["log_prob"] = client_cfg.to_onprem("log_prob")
    return jobs


def _cfg(tiny_model_dir, tmp_path, *overrides):
    return compose_config(
        tiny_model_dir, str(tmp_path / "ckpt"), 8000, ["actor_rollout_ref.actor.use_kl_loss=true", *overrides]
    )


@pytest.mark.slow
@pytest.mark.parametrize("stage", [None, 2, 3])
def test_adapter_configs_start_the_real_training_and_log_prob_jobs_and_checkpoints_resolve(
    tiny_model_dir, tmp_path, stage
):
    from verl.workers.remote_client.arctic import checkpoint

    overrides = [] if stage is None else [f"remote_backend.arctic.deepspeed.zero_optimization.stage={stage}"]
    jobs = adapter_jobs(_cfg(tiny_model_dir, tmp_path, *overrides))
    train, log_prob = probe(
        [jobs["training"], jobs["log_prob"]], dtype="bfloat16", step=True, save_dir=str(tmp_path / "save")
    )
    assert train["ok"], train
    assert log_prob["ok"], log_prob
    assert train["stage"] == (1 if stage is None else stage)  # the shipped default is stage 1
    assert log_prob["stage"] == (3 if stage == 3 else 0)  # stages 1/2 shard optimizer state the log-prob job lacks
    assert train["dtype"] == "torch.bfloat16"  # Arctic's own number format, untouched
    assert train["global_steps"] == 1 and train["grad_norm"] is not None and train["grad_norm"] > 0
    # the adapter's resume check finds DeepSpeed's model states at every stage (ZeRO-3 names them per rank)
    saved = str(tmp_path / "save" / "job0")
    tag = open(os.path.join(saved, "latest")).read().strip()
    assert checkpoint.model_states_file(os.path.join(saved, tag)) is not None, train["files"]
    if stage == 3:
        assert f"{tag}/zero_pp_rank_0_mp_rank_00_model_states.pt" in train["files"]


@pytest.mark.slow
def test_stage_0_with_arctics_bf16_defaults_fails_in_deepspeed_and_is_refused_before_start(tiny_model_dir, tmp_path):
    from verl.remote_backend.errors import ConfigError
    from verl.workers.remote_client.arctic.client import ArcticBackend

    bad = _cfg(tiny_model_dir, tmp_path, "remote_backend.arctic.deepspeed.zero_optimization.stage=0")
    with pytest.raises(
        ConfigError, match=r"zero_optimization\.stage=0 .*grad_accum_dtype=fp32.*stage=1 \(the default\)"
    ):
        ArcticBackend.check_config(bad)
    # what the real engine does with that payload (built without the adapter's check)
    good = adapter_jobs(_cfg(tiny_model_dir, tmp_path))["training"]
    real = {**good, "ds_config": {**good["ds_config"], "zero_optimization": {"stage": 0}}}
    fixed = {**real, "ds_config": {**real["ds_config"], "data_types": {"grad_accum_dtype": "bf16"}}}
    ArcticBackend.check_config(
        _cfg(tiny_model_dir, tmp_path, "remote_backend.arctic.deepspeed.zero_optimization.stage=0",
             "remote_backend.arctic.deepspeed.data_types.grad_accum_dtype=bf16")
    )  # fmt: skip
    refused, accepted = probe([real, fixed], dtype="bfloat16")
    assert (
        not refused["ok"]
        and "unsupported mix of model_dtype=torch.bfloat16 and grad_accum_dtype=torch.float32" in refused["error"]
    )
    assert accepted["ok"], accepted


@pytest.mark.slow
def test_log_prob_job_never_inherits_a_zero_stage_it_cannot_run(tiny_model_dir, tmp_path):
    jobs = adapter_jobs(_cfg(tiny_model_dir, tmp_path, "remote_backend.arctic.deepspeed.zero_optimization.stage=1"))
    assert "zero_optimization" not in jobs["log_prob"]["log_prob_config"]
    inherited = {
        **jobs["log_prob"],
        "log_prob_config": {**jobs["log_prob"]["log_prob_config"], "zero_optimization": {"stage": 1}},
    }
    (real,) = probe([inherited], dtype="bfloat16")
    assert not real["ok"] and "zero stage 1 requires an optimizer" in real["error"]


@pytest.mark.slow
def test_float32_stage_0_reports_no_grad_norm_and_the_adapter_reports_none_not_zero(tiny_model_dir, tmp_path):
    from verl.workers.remote_client.arctic.metrics import aggregate_update_metrics, map_step_metrics

    good = adapter_jobs(_cfg(tiny_model_dir, tmp_path))["training"]
    stage0 = {**good, "ds_config": {**good["ds_config"], "zero_optimization": {"stage": 0}}}
    (res,) = probe([stage0], dtype="float32", step=True)
    assert res["ok"] and res["global_steps"] == 1
    assert res["grad_norm"] is None  # DeepSpeed's fp32 stage-0 engine keeps no global norm
    # Arctic's step() then leaves grad_norm out; the adapter must not invent one
    per_minibatch = [map_step_metrics({"last_lr": 1e-3}), map_step_metrics({"last_lr": 1e-3})]
    assert "grad_norm" not in aggregate_update_metrics(per_minibatch)


@pytest.mark.slow
def test_non_flash_attention_lets_packed_sequences_see_each_other_here_as_on_a_gpu(tiny_model_dir, tmp_path):
    from verl.remote_backend.errors import ConfigError
    from verl.workers.remote_client.arctic.client import ArcticBackend

    with pytest.raises(ConfigError, match=r"attn_implementation='sdpa'.*flash_attention_2"):
        ArcticBackend.check_config(
            _cfg(tiny_model_dir, tmp_path, "actor_rollout_ref.model.override_config.attn_implementation=sdpa")
        )
    job = adapter_jobs(_cfg(tiny_model_dir, tmp_path))["training"]
    sdpa = {**job, "ds_worker_config": {**job["ds_worker_config"], "attn_implementation": "sdpa"}}
    packed = {"a": [5, 6, 7, 8, 9], "b": [10, 11, 12, 13]}
    flash, other = probe([job, sdpa], dtype="float32", packed=packed)
    assert flash["packed_gap"] < 1e-5  # flash-attention varlen: the second sequence sees only itself
    assert other["packed_gap"] > 1e-3  # any other kernel: it attends to the first, as on Arctic's GPUs


@pytest.mark.slow
def test_zorro_double_refuses_non_qwen3_and_uses_the_temperature_it_was_built_with(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from verl.remote_backend.errors import ConfigError
    from verl.remote_backend.testing.tiny_model import build_tiny_model
    from verl.workers.remote_client.arctic.client import ArcticBackend

    qwen2 = tiny_model_dir  # the session's tiny model is a Qwen2
    qwen3 = build_tiny_model(str(tmp_path / "qwen3"), architecture="qwen3")
    zorro = [
        "remote_backend.arctic.zorro.train=true",
        "actor_rollout_ref.rollout.temperature=0.7",
        "data.max_response_length=4",
    ]
    with pytest.raises(ConfigError, match=r"zorro.train=true with a model of model_type='qwen2'.*Qwen3"):
        ArcticBackend.check_config(_cfg(qwen2, tmp_path, *zorro))
    ArcticBackend.check_config(_cfg(qwen3, tmp_path, *zorro))
    jobs = [adapter_jobs(_cfg(m, tmp_path, *zorro))["training"] for m in (qwen2, qwen3)]
    ids = [3, 4, 5, 6, 7, 8, 9, 10]
    refused, built = probe(jobs, dtype="float32", zorro={"ids": ids, "call_temperature": 0.3})
    assert not refused["ok"] and "Unsupported model_type=qwen2" in refused["error"]  # Arctic's own check
    assert built["ok"], built
    model = AutoModelForCausalLM.from_pretrained(qwen3, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, 3:7]
    for temperature, should_match in ((0.7, True), (0.3, False)):
        want = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(ids[4:]).unsqueeze(-1)).reshape(-1)
        gap = (torch.tensor(built["zorro_logprobs"]) - want).abs().max().item()
        assert (gap < 1e-5) == should_match, (temperature, gap)


@pytest.mark.slow
def test_an_all_zero_gradient_still_counts_as_an_optimizer_step_on_the_real_engine(tiny_model_dir, tmp_path):
    """Arctic's ``_engine_step`` skips a step only on BF16_Optimizer's zero-norm assert; DeepSpeed 0.19's engine
    at the stages the adapter accepts does not raise it, so the engine's step count stays verl's (what the
    adapter's resume check, ``step x optimizer steps per step`` without a save record, relies on)."""
    jobs = [
        adapter_jobs(_cfg(tiny_model_dir, tmp_path, f"remote_backend.arctic.deepspeed.zero_optimization.stage={s}"))[
            "training"
        ]
        for s in (1, 3)
    ]
    for res in probe(jobs, dtype="bfloat16", step=True, zero_grad=True):
        assert res["ok"], res
        assert res["grad_norm"] == 0.0 and res["global_steps"] == 1, res


@pytest.mark.slow
def test_the_example_scripts_settings_start_the_real_jobs(tiny_model_dir, tmp_path):
    """``examples/gsm8k_remote/run_gsm8k_grpo_arctic.sh`` (model and paths swapped for the tiny model) passes
    the start-up checks, and its training and log-prob jobs start on the real engine in bf16."""
    import re

    from verl.workers.remote_client.arctic.client import ArcticBackend

    script = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        "examples",
        "gsm8k_remote",
        "run_gsm8k_grpo_arctic.sh",
    )
    values = {
        "$MODEL": tiny_model_dir,
        "$CKPT_DIR": str(tmp_path / "ckpt"),
        "$ARCTIC_HOST": "127.0.0.1",
        "$ARCTIC_PORT": "8000",
        "$LAUNCH_SERVER": "false",
        "$GPU_MEM": "0.4",
        "$PEAK_FLOPS": "9.89e+14",
        "$STEPS": "20",
    }
    overrides = []
    for key, value in re.findall(r"^\s+([a-z_][\w.]*)=(\S+) \\$", open(script).read(), flags=re.M):
        if key.startswith(("data.train_files", "data.val_files", "trainer.logger")):
            continue
        value = value.strip('"')
        overrides.append(f"{key}={values.get(value, value)}")
    assert any(o.startswith("remote_backend.arctic.log_prob_gpus=1") for o in overrides), overrides
    cfg = compose_config(tiny_model_dir, str(tmp_path / "ckpt"), 8000, overrides)
    ArcticBackend.check_config(cfg)
    jobs = adapter_jobs(cfg)
    assert jobs["training"]["ds_config"]["train_batch_size"] == 32 * 4
    for res in probe([jobs["training"], jobs["log_prob"]], dtype="bfloat16"):
        assert res["ok"], res
