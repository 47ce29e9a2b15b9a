"""Settings Arctic's server fails on after the first rollout, or trains wrongly, are refused before Ray starts.

Each refusal is checked against the Arctic code that would fail (its load balancer, its KL estimator) where
that code runs on a CPU; the rest are derivations (log-prob request sizes, the rollout log-prob mode).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from arctic_standin.harness import compose_config

from verl.remote_backend.errors import ConfigError
from verl.workers.remote_client.arctic.bodies import row_chunks
from verl.workers.remote_client.arctic.client import ArcticBackend
from verl.workers.remote_client.arctic.config import load_arctic_config
from verl.workers.remote_client.arctic.derive import (
    derive_log_prob_ds_config,
    derive_vllm_config,
    log_prob_rows_per_request,
)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir


def cfg_with(model_dir, tmp_path, *overrides):
    return compose_config(model_dir, str(tmp_path / "ckpt"), 8000, list(overrides))


def test_lora_is_refused_because_arctic_trains_every_weight(model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"lora_rank=8: .*no LoRA.*Fix: set actor_rollout_ref.model.lora_rank=0"):
        ArcticBackend.check_config(cfg_with(model_dir, tmp_path, "actor_rollout_ref.model.lora_rank=8"))


@pytest.mark.parametrize("kl_type", ["k3+", "low_var_kl+", "kl+", "abs+", "k1+"])
def test_straight_through_kl_variants_fail_in_arctics_loss_and_are_refused(model_dir, tmp_path, kl_type):
    import arctic_platform.rl.processors  # noqa: F401  (the loss module imports back into it)
    from arctic_platform.integrations.verl.grpo_loss import kl_penalty

    with pytest.raises(NotImplementedError):  # what the server does mid-run
        kl_penalty(torch.zeros(3), torch.zeros(3), kl_type)
    cfg = cfg_with(
        model_dir,
        tmp_path,
        "actor_rollout_ref.actor.use_kl_loss=true",
        f"actor_rollout_ref.actor.kl_loss_type={kl_type}",
    )
    with pytest.raises(ConfigError, match=rf"kl_loss_type='{kl_type.replace('+', '[+]')}'"):
        ArcticBackend.check_config(cfg)


def _balancer_batch(rows: int, prompt: int, response: int, n: int) -> dict:
    """A verl-shaped batch: ``rows / n`` prompts, each repeated ``n`` times (as rollout.n does)."""
    prompts = torch.arange(rows // n).repeat_interleave(n).unsqueeze(1).expand(rows, prompt) + 3
    responses = torch.randint(3, 50, (rows, response))
    ids = torch.cat([prompts, responses], 1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "prompts": prompts.contiguous()}


def test_token_budget_below_the_load_balancers_need_fails_there_and_is_refused(model_dir, tmp_path):
    from arctic_platform.rl.zorro_train.seqlen_balancing import reorg_global_batch

    # data.max_prompt_length=16 + response 8 x rollout.n 2 = 32 tokens
    small = cfg_with(model_dir, tmp_path, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=31")
    with pytest.raises(ConfigError, match=r"ppo_max_token_len_per_gpu=31: .*16 \+ 8 x 2 = 32.*raise it to >= 32"):
        ArcticBackend.check_config(small)
    with pytest.raises(ValueError, match="max_token_len=31 is smaller than 32"):
        reorg_global_batch(
            _balancer_batch(4, 16, 8, 2),
            response_length=8,
            world_size=1,
            max_token_len=31,
            max_group_length_threshold=2,
        )
    ArcticBackend.check_config(cfg_with(model_dir, tmp_path, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32"))
    reorg_global_batch(
        _balancer_batch(4, 16, 8, 2), response_length=8, world_size=1, max_token_len=32, max_group_length_threshold=2
    )
    off = cfg_with(
        model_dir,
        tmp_path,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=31",
        "remote_backend.arctic.zorro.load_balancer=false",
    )
    ArcticBackend.check_config(off)


def test_groups_that_cannot_fill_equal_bins_on_several_gpus_fail_there_and_are_refused(model_dir, tmp_path):
    from arctic_platform.rl.zorro_train.seqlen_balancing import reorg_global_batch

    # 3 prompts x n=2 = 6 rows on 2 GPUs: 3 rows per GPU, groups of 2 cannot fill them
    args = [
        "actor_rollout_ref.actor.ppo_mini_batch_size=3",
        "data.train_batch_size=3",
        "remote_backend.arctic.training_gpus=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    ]
    with pytest.raises(ConfigError, match=r"training_gpus=2 .* 6 rows .*groups of 2"):
        ArcticBackend.check_config(cfg_with(model_dir, tmp_path, *args))
    with pytest.raises(ValueError):
        reorg_global_batch(
            _balancer_batch(6, 16, 8, 2),
            response_length=8,
            world_size=2,
            max_token_len=16384,
            max_group_length_threshold=2,
        )
    ok = [
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "data.train_batch_size=4",
        "remote_backend.arctic.training_gpus=2",
    ]
    ArcticBackend.check_config(cfg_with(model_dir, tmp_path, *ok))
    reorg_global_batch(
        _balancer_batch(8, 16, 8, 2), response_length=8, world_size=2, max_token_len=16384, max_group_length_threshold=2
    )


def test_rollout_log_probs_are_the_sampled_distributions_as_verl_expects(model_dir, tmp_path):
    cfg = cfg_with(model_dir, tmp_path)
    assert (
        derive_vllm_config(cfg, load_arctic_config(cfg))["logprobs_mode"] == "processed_logprobs"
    )  # vLLM's default is raw
    raw = cfg_with(model_dir, tmp_path, "remote_backend.arctic.sampling.vllm={logprobs_mode: raw_logprobs}")
    with pytest.raises(ConfigError, match=r"sampling.vllm.logprobs_mode='raw_logprobs'.*Fix: remove it"):
        derive_vllm_config(raw, load_arctic_config(raw))
    logits = cfg_with(model_dir, tmp_path, "actor_rollout_ref.rollout.logprobs_mode=processed_logits")
    with pytest.raises(ConfigError, match=r"logprobs_mode='processed_logits': its values are not log-probabilities"):
        derive_vllm_config(logits, load_arctic_config(logits))


def test_log_prob_requests_follow_verls_log_prob_micro_batches(model_dir, tmp_path):
    cfg = cfg_with(
        model_dir, tmp_path,
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",  # 4 rows per optimizer step -> 4 accumulation steps
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3",
    )  # fmt: skip
    arctic = load_arctic_config(cfg)
    assert log_prob_rows_per_request(cfg, arctic, ref=True) == 3  # the log-prob job runs a request as one micro-batch
    assert log_prob_rows_per_request(cfg, arctic, ref=False) == 2 * 4  # the training job splits it into 4 of 2 rows
    assert derive_log_prob_ds_config(cfg, arctic) == {"train_micro_batch_size_per_gpu": 3}
    unset = cfg_with(model_dir, tmp_path)
    assert log_prob_rows_per_request(unset, load_arctic_config(unset), ref=True) is None
    assert row_chunks(8, 3) == [slice(0, 3), slice(3, 6), slice(6, 8)]
    assert row_chunks(9, 4, min_rows=2) == [slice(0, 4), slice(4, 9)]  # a last request too small to split is merged
    assert row_chunks(5, None) == [slice(0, 5)]


def test_a_zorro_call_at_another_temperature_than_its_model_was_built_with_is_refused(model_dir, tmp_path):
    """ZoRRo's patched model applies rollout.temperature (its build-time value); a call asking for another one
    would silently get rollout.temperature's log-probs, so it is refused before anything is sent."""
    from arctic_standin.harness import make_batch
    from transformers import AutoTokenizer

    cfg = cfg_with(
        model_dir,
        tmp_path,
        "remote_backend.arctic.zorro.train=true",
        "actor_rollout_ref.rollout.temperature=0.7",
        "data.max_response_length=5",
    )
    backend = ArcticBackend(
        cfg, load_arctic_config(cfg), client=None, owner=False
    )  # no server: refused before any call
    tok = AutoTokenizer.from_pretrained(model_dir)
    data = make_batch(prompt_lens=[3, 2], response_lens=[4, 5], prompt_width=6, response_width=5, vocab=len(tok),
                      pad_token_id=tok.pad_token_id, seed=0, with_update_fields=True)  # fmt: skip
    call = dict(ref=False, calculate_entropy=False, rollout_n=2, pad_token_id=tok.pad_token_id)
    with pytest.raises(
        ConfigError, match=r"temperature=0.3, but ZoRRo's model .* built with actor_rollout_ref.rollout.temperature=0.7"
    ):
        asyncio.run(backend.compute_log_prob(data, temperature=0.3, **call))
    with pytest.raises(Exception) as at_built:  # the built temperature passes the check and reaches the (absent) client
        asyncio.run(backend.compute_log_prob(data, temperature=0.7, **call))
    assert not isinstance(at_built.value, ConfigError)
