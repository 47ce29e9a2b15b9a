"""The tinker backend's start-up rules and batch mapping, without a server (fast)."""

from __future__ import annotations

import pytest
import torch
from support.local_backend_helpers import dense_rollout_batch, to_no_padding
from support.remote_e2e import compose, small_ci_overrides

from verl.remote_backend.errors import ConfigError
from verl.workers.remote_client.tinker import batch as tb
from verl.workers.remote_client.tinker.config import adam_params, check_config, load_tinker_config

OK = [
    "actor_rollout_ref.model.lora_rank=4",
    "actor_rollout_ref.model.lora_alpha=32",
    "actor_rollout_ref.actor.grad_clip=1e9",
    "remote_backend.tinker.max_lora_rank=8",
]


def cfg(*extra):
    ov = small_ci_overrides(model="m", train="t", test="v", ckpt_dir="c", steps=1, backend="tinker")
    return compose(ov + OK + list(extra))


def test_supported_settings_pass():
    check_config(cfg())
    check_config(cfg("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"))
    check_config(cfg("remote_backend.tinker.loss_fn=importance_sampling"))  # one mini-batch, one epoch


@pytest.mark.parametrize(
    "override, needles",
    [
        ("actor_rollout_ref.model.lora_rank=0", ["actor_rollout_ref.model.lora_rank=0", "unset", "1..8"]),
        ("actor_rollout_ref.model.lora_rank=9", ["lora_rank=9", "1..8"]),
        ("actor_rollout_ref.model.lora_alpha=16", ["lora_alpha=16", "32"]),
        ("actor_rollout_ref.actor.use_kl_loss=true", ["use_kl_loss=True", "supported: false", "no reference-KL"]),
        ("actor_rollout_ref.actor.entropy_coeff=0.01", ["entropy_coeff=0.01", "supported: 0"]),
        ("actor_rollout_ref.actor.grad_clip=1.0", ["grad_clip=1.0", "does not clip"]),
        ("actor_rollout_ref.rollout.temperature=0.7", ["temperature=0.7", "supported: 1.0"]),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=gspo", ["loss_mode='gspo'", "supported: vanilla"]),
        (
            "actor_rollout_ref.actor.optim.lr_warmup_steps=5",
            ["lr_warmup_steps", "5 warm-up steps", "supported: constant / no warm-up"],
        ),
        ("remote_backend.tinker.loss_fn=cispo", ["loss_fn='cispo'", "ppo"]),
        ("+remote_backend.tinker.nonsense=1", ["remote_backend.tinker.nonsense", "unknown key"]),
    ],
)
def test_refusals_name_key_value_and_support(override, needles):
    with pytest.raises(ConfigError) as err:
        check_config(cfg(override))
    for needle in needles:
        assert needle in str(err.value), str(err.value)


def test_importance_sampling_refused_off_policy():
    with pytest.raises(ConfigError, match="importance_sampling"):
        check_config(cfg("remote_backend.tinker.loss_fn=importance_sampling", "actor_rollout_ref.actor.ppo_epochs=2"))


def test_adam_params_from_verl_optim():
    c = cfg("actor_rollout_ref.actor.optim.lr=0.003", "actor_rollout_ref.actor.optim.weight_decay=0.1")
    assert adam_params(c.actor_rollout_ref.actor) == {
        "learning_rate": 0.003,
        "beta1": 0.9,
        "beta2": 0.999,
        "eps": 1e-8,
        "weight_decay": 0.1,
    }
    assert load_tinker_config(c).base_url == "http://127.0.0.1:8000"


def test_rows_put_response_fields_on_predict_next_slots():
    dense = dense_rollout_batch([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]])
    dense["advantages"] = torch.tensor([[1.0, 2.0, 0.0], [3.0, 4.0, 5.0]])
    dense["old_log_probs"] = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, -4.0, -5.0]])
    rows = tb.rows_of(to_no_padding(dense), with_update_fields=True)
    assert rows[0].tokens == [5, 6, 7, 9, 10] and rows[1].tokens == [8, 11, 12, 13]
    # slot j predicts token j+1: response token k sits at slot prompt_len + k - 1
    assert (
        rows[0].weights == [0, 0, 1, 1]
        and rows[0].advantages == [0, 0, 1, 2]
        and rows[0].old_log_probs == [0, 0, -1, -2]
    )
    assert rows[1].weights == [1, 1, 1] and rows[1].advantages == [3, 4, 5]
    packed = tb.packed_from_slots(rows, [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7]])
    assert packed.tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.0, 0.5, 0.6, 0.7, 0.0])


def test_advantage_scales_turn_seq_mean_token_mean_into_verl_modes():
    rows = [tb.Row([0] * 4, 1, 3, [1, 1, 1], [1] * 3, [0] * 3), tb.Row([0] * 2, 1, 1, [1], [1], [0])]
    # server: (1/N) sum_s (1/W_s) sum_t c_s l_t ; verl token-mean: sum / 4 -> c = N * W_s / 4
    assert tb.advantage_scales(rows, "token-mean", response_width=3) == [2 * 3 / 4, 2 * 1 / 4]
    assert tb.advantage_scales(rows, "seq-mean-token-mean", response_width=3) == [1, 1]
    assert tb.advantage_scales(rows, "seq-mean-token-sum", response_width=3) == [3, 1]
    assert tb.advantage_scales(rows, "seq-mean-token-sum-norm", response_width=3) == [1, 1 / 3]
