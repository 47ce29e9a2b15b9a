"""Unit tests of the Arctic payload mapping (pure tensor functions, no server)."""

from __future__ import annotations

import json

import pytest
import torch
from arctic_standin.harness import make_batch

from verl.remote_backend.update_schedule import UpdateSchedule
from verl.workers.remote_client.arctic import bodies
from verl.workers.remote_client.arctic.config import ArcticConfig
from verl.workers.remote_client.arctic.errors import PayloadError
from verl.workers.remote_client.arctic.json_data import to_json_safe
from verl.workers.remote_client.arctic.metrics import aggregate_update_metrics, map_step_metrics
from verl.workers.remote_client.arctic.payload import dense_to_packed, full_to_response, njt_to_dense, response_to_full

PAD = 7


def _batch(**kw):
    args = dict(
        prompt_lens=[3, 5, 1, 4],
        response_lens=[4, 1, 6, 0],
        prompt_width=5,
        response_width=6,
        vocab=50,
        pad_token_id=PAD,
    )
    args.update(kw)
    return make_batch(**args)


def _dense_reference(data):
    """cat(prompts, responses): what verl unpadded to build the NJT."""
    return torch.cat([data["prompts"], data["responses"]], dim=1)


def test_njt_to_dense_restores_left_right_padded_rows():
    data = _batch()
    mask = data["attention_mask"]
    dense = njt_to_dense(data["input_ids"], mask, PAD)
    ref = _dense_reference(data)
    assert torch.equal(dense[mask.bool()], ref[mask.bool()])
    assert (dense[~mask.bool()] == PAD).all()
    # prompt left-padded, response right-padded: row 2 has 1 prompt token at column 4.
    assert mask[2].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
    pos = njt_to_dense(data["position_ids"], mask, 0, name="position_ids")
    assert torch.equal(pos, (mask.cumsum(-1) - 1).clamp(min=0) * mask)


def test_njt_to_dense_rejects_length_mismatch_naming_the_field():
    data = _batch()
    mask = data["attention_mask"].clone()
    mask[0, -1] = 1  # one more real token than the NJT row has
    with pytest.raises(PayloadError, match="input_ids: row lengths"):
        njt_to_dense(data["input_ids"], mask, PAD)
    with pytest.raises(PayloadError, match="position_ids: expected 1-D"):
        njt_to_dense(torch.zeros(3, 4), mask, 0, name="position_ids")


def test_dense_to_packed_keeps_slots_and_zeroes_each_rows_last_slot():
    data = _batch()
    mask = data["attention_mask"].bool()
    b, s = mask.shape
    dense = torch.arange(b * s, dtype=torch.float32).reshape(b, s) + 1.0  # distinct, non-zero
    dense[~mask] = float("nan")  # padding filler must never be read
    packed = dense_to_packed(dense, mask)
    lengths = mask.sum(-1)
    ends = lengths.cumsum(0) - 1
    expected = dense[mask].clone()
    expected[ends] = 0.0
    assert packed.dtype == torch.float32 and packed.shape == (int(lengths.sum()),)
    assert torch.equal(packed, expected)


def test_dense_to_packed_errors_on_shape_and_non_finite():
    mask = _batch()["attention_mask"]
    with pytest.raises(PayloadError, match=r"logprobs: expected shape \(4, 11\)"):
        dense_to_packed(torch.zeros(4, 10), mask)
    bad = torch.zeros(mask.shape)
    bad[0, 4] = float("inf")  # a real, non-last token of row 0
    with pytest.raises(PayloadError, match="non-finite"):
        dense_to_packed(bad, mask)


def test_shift_is_applied_once_end_to_end():
    """Arctic's predict-next dense log-probs, mapped to packed and sliced by verl's
    own no_padding_2_padding, give log p(response token j | prefix) per row."""
    from verl.workers.utils.padding import no_padding_2_padding

    torch.manual_seed(0)
    vocab = 50
    data = _batch(vocab=vocab)
    mask = data["attention_mask"].bool()
    table = torch.randn(vocab, vocab)  # bigram "model": logits of next token given current

    def row_logprobs(tokens):  # predict-next on one unpadded row
        lp = torch.log_softmax(table[tokens[:-1]], -1)
        return lp.gather(-1, tokens[1:, None]).squeeze(-1)

    # What Arctic's server returns: [B, S], column t = log p(x[t+1]) for real tokens.
    dense_ids = njt_to_dense(data["input_ids"], mask, PAD)
    server = torch.full(mask.shape, 123.0)
    truth = torch.zeros(data["responses"].shape)
    for i in range(mask.shape[0]):
        cols = mask[i].nonzero().squeeze(-1)
        tokens = dense_ids[i, cols]
        lp = row_logprobs(tokens)
        server[i, cols[:-1]] = lp
        server[i, cols[-1]] = -55.0  # garbage in the last slot, as the real server's packed buffer
        p_len = int(mask[i, : data["prompts"].shape[1]].sum())
        r_len = int(mask[i, data["prompts"].shape[1] :].sum())
        truth[i, :r_len] = lp[p_len - 1 : p_len - 1 + r_len]
    packed = dense_to_packed(server, mask)
    verl_view = no_padding_2_padding(packed, data)
    assert torch.allclose(verl_view, truth, atol=0, rtol=0)


def test_response_to_full_places_token_j_at_column_p_plus_j():
    resp = torch.arange(12, dtype=torch.float32).reshape(2, 6) + 1
    full = response_to_full(resp, 5)
    assert full.shape == (2, 11)
    assert (full[:, :5] == 0).all() and torch.equal(full[:, 5:], resp)
    assert torch.equal(full_to_response(full, 5), resp)
    with pytest.raises(PayloadError):
        response_to_full(torch.zeros(3), 2)


def test_metric_mapping_to_verl_names():
    fwd_bwd = {
        "actor/pg_loss": 0.5,
        "actor/pg_clipfrac": 0.1,
        "actor/pg_loss.sum": 5.0,
        "actor/pg_loss.tokens": 10.0,
        "kl_loss": 0.01,
        "kl_coef": 0.001,
        "loss": 0.6,
        "_profile_ms": {"x": 1},
    }
    step = {"last_lr": 1e-6, "grad_norm": [2.0, 4.0]}  # a per-rank list from a 2-GPU server
    assert map_step_metrics(fwd_bwd) == {
        "pg_loss": 0.5,
        "pg_clipfrac": 0.1,
        "kl_loss": 0.01,
        "kl_coef": 0.001,
        "loss": 0.6,
    }
    assert map_step_metrics(step) == {"lr": 1e-6, "grad_norm": 3.0}
    agg = aggregate_update_metrics([{"pg_loss": 1.0, "lr": 0.1}, {"pg_loss": 2.0, "lr": 0.2}])
    assert agg == {"pg_loss": [1.0, 2.0], "lr": 0.2}


def test_to_json_safe_handles_verl_actor_config():
    from omegaconf import OmegaConf

    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    actor = FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=2,
        rollout_n=2,
        policy_loss=PolicyLossConfig(loss_mode="vanilla"),
    )
    safe = to_json_safe(actor)
    json.dumps(safe)
    assert safe["policy_loss"]["loss_mode"] == "vanilla" and safe["clip_ratio_c"] == 3.0
    assert to_json_safe(OmegaConf.create({"a": [1, 2.5, float("inf")], "_target_": "x"})) == {"a": [1, 2.5, None]}


def test_update_minibatches_bodies():
    data = _batch(with_update_fields=True)
    meta = {"temperature": 1.0}
    mbs = list(
        bodies.update_minibatches(
            data,
            arctic=ArcticConfig(),
            actor_config={"use_kl_loss": True, "policy_loss": {"loss_mode": "vanilla"}},
            meta=meta,
            pad_token_id=PAD,
            use_kl_loss=True,
            schedule=UpdateSchedule(mini_batch_size=2, epochs=1, seed=0, shuffle=False),
        )
    )
    assert [mb.rows.tolist() for mb in mbs] == [[0, 1], [2, 3]]
    b0 = mbs[0].body
    batch = b0["batch"]
    assert set(batch) == {
        "input_ids", "attention_mask", "prompts", "responses", "response_mask", "old_log_probs",
        "advantages", "ref_log_prob", "loss_mask",
    }  # fmt: skip
    assert "position_ids" not in batch  # dropped on the wire: the server rebuilds them
    for key in ("response_mask", "old_log_probs", "advantages", "ref_log_prob", "loss_mask"):
        assert batch[key].shape == (2, 11)
        assert (batch[key][:, :5] == 0).all()
        assert torch.equal(
            batch[key][:, 5:], data["response_mask" if key == "loss_mask" else key][:2].to(batch[key].dtype)
        )
    assert b0["meta"]["batch_num_tokens"] == int(data["response_mask"][:2].sum())
    assert b0["meta"]["global_batch_size"] == 2
    assert b0["meta"]["policy_loss_config"] == {"loss_mode": "vanilla"}
    json.dumps(b0["meta"])  # meta rides as JSON in the safetensors header
    assert meta == {"temperature": 1.0}  # caller's dict untouched
