"""The local sampler's cheaper decode: grouped prefill, per-row KV slots, optional log-probs and
penalty bookkeeping, weights shared with the trainer, and the engine's measured MFU peak."""

from __future__ import annotations

import time

import pytest
import torch
from support.local_backend_helpers import engine_settings

PROMPTS = [[5, 17, 33, 9], [100, 7], [42, 43, 44, 45, 46, 47, 48], [300], list(range(50, 75)), [8, 9, 10]]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from verl.workers.remote_client.local.engine import LocalEngine

    return LocalEngine(engine_settings(tiny_model_dir))


def test_greedy_tokens_equal_transformers_generate(engine):
    params = {"max_tokens": 10, "temperature": 0}
    ours = engine.sample([engine.make_request(p, params) for p in PROMPTS])
    for prompt, res in zip(PROMPTS, ours):
        out = engine.sampler_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=10,
            do_sample=False,
            eos_token_id=engine.eos_token_ids,
            pad_token_id=engine.pad_token_id,
        )
        assert res.token_ids == out[0, len(prompt) :].tolist()


def test_prefill_groups_cover_every_prompt_with_little_padding():
    from verl.workers.remote_client.local.sampler import prefill_groups

    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(60, 330, (64,), generator=gen).tolist()
    groups = prefill_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(64))
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
    assert padded - sum(lengths) <= 0.05 * sum(lengths)


def test_grouped_prefill_gives_the_logits_of_an_unpadded_single_sequence(engine):
    from verl.workers.remote_client.local.sampler import DecodeBatch

    batch = DecodeBatch(engine.sampler_model, eos_token_ids=engine.eos_token_ids, pad_token_id=engine.pad_token_id)
    batch.admit([(i, engine.make_request(p, {"max_tokens": 3, "temperature": 0})) for i, p in enumerate(PROMPTS)])
    assert batch.prefill_slots - batch.prefill_tokens <= 0.05 * batch.prefill_tokens
    for row, key in enumerate(batch.keys):
        with torch.no_grad():
            alone = engine.sampler_model(input_ids=torch.tensor([PROMPTS[key]])).logits[0, -1]
        torch.testing.assert_close(batch.logits[row], alone.float(), atol=1e-4, rtol=1e-4)


def test_samples_of_one_prompt_share_one_prefill_and_draw_what_they_draw_alone(engine):
    # A GRPO group: n seeded samples of each prompt, interleaved as verl repeats them.
    prompts = [PROMPTS[0], PROMPTS[4], PROMPTS[0], PROMPTS[1], PROMPTS[4], PROMPTS[0]]
    params = [{"max_tokens": 6, "temperature": 1.0, "seed": 11 + i, "logprobs": True} for i in range(len(prompts))]
    requests = [engine.make_request(p, sp) for p, sp in zip(prompts, params)]
    batch = engine.decode_batch()
    results = dict(engine.decode_step(batch, list(enumerate(requests))))
    distinct = [PROMPTS[0], PROMPTS[4], PROMPTS[1]]
    assert batch.prefill_tokens == sum(len(p) for p in distinct)  # each distinct prompt prefilled once
    assert batch.prefill_rows_shared == len(prompts) - len(distinct)
    while len(batch):
        results.update(engine.decode_step(batch))
    for i, request in enumerate(requests):
        alone = engine.sample([request])[0]
        assert results[i].token_ids == alone.token_ids
        torch.testing.assert_close(results[i].log_probs, alone.log_probs, atol=1e-5, rtol=0)


def test_a_request_joining_a_running_batch_gets_its_solo_greedy_tokens(engine):
    greedy = {"temperature": 0, "max_tokens": 8}
    batch = engine.decode_batch()
    results = dict(engine.decode_step(batch, [(i, engine.make_request(p, greedy)) for i, p in enumerate(PROMPTS[:4])]))
    results.update(engine.decode_step(batch))
    late = (99, engine.make_request(PROMPTS[4], greedy))  # longer than every running row
    results.update(engine.decode_step(batch, [late]))
    while len(batch):
        results.update(engine.decode_step(batch))
    assert results[99].token_ids == engine.generate(PROMPTS[4], greedy).token_ids
    for i, p in enumerate(PROMPTS[:4]):
        assert results[i].token_ids == engine.generate(p, greedy).token_ids


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_tokens_do_not_depend_on_whether_log_probs_are_asked(engine, temperature):
    def run(logprobs: bool):
        reqs = [
            engine.make_request(
                p, {"max_tokens": 9, "temperature": temperature, "top_k": 40, "seed": 7 + i, "logprobs": logprobs}
            )
            for i, p in enumerate(PROMPTS)
        ]
        return engine.sample(reqs)

    with_lp, without = run(True), run(False)
    assert [r.token_ids for r in with_lp] == [r.token_ids for r in without]
    assert all(r.log_probs is None for r in without) and all(len(r.log_probs) == len(r.token_ids) for r in with_lp)


def test_seen_matrix_exists_only_while_a_row_uses_a_repetition_penalty(engine):
    batch = engine.decode_batch()
    engine.decode_step(batch, [(0, engine.make_request(PROMPTS[0], {"max_tokens": 6, "temperature": 0}))])
    assert batch.seen is None
    penal = {"max_tokens": 2, "temperature": 0, "repetition_penalty": 3.0}
    engine.decode_step(batch, [(1, engine.make_request(PROMPTS[1], penal))])
    assert batch.seen is not None and batch.seen.shape[0] == len(batch)
    while len(batch) == 2:
        engine.decode_step(batch)
    assert batch.seen is None or len(batch) == 0
    # the penalised row decodes as it does alone
    alone = engine.generate(PROMPTS[1], penal).token_ids
    mixed = engine.sample(
        [engine.make_request(PROMPTS[0], {"max_tokens": 6, "temperature": 0}), engine.make_request(PROMPTS[1], penal)]
    )
    assert mixed[1].token_ids == alone


def test_sampler_shares_the_trained_weights_when_dtypes_match(engine):
    assert engine.shares_sampler_weights
    for (name, p), (_, q) in zip(engine.model.named_parameters(), engine.sampler_model.named_parameters()):
        assert p.data_ptr() == q.data_ptr(), name
    assert engine.model.training and not engine.sampler_model.training
    version = engine.policy_version
    assert engine.sync_sampler_weights()["policy_version"] == version + 1


def test_a_sampler_copy_follows_the_trainer_only_after_sync(tiny_model_dir):
    from verl.workers.remote_client.local.config import LocalBackendConfig
    from verl.workers.remote_client.local.engine import LocalEngine

    engine = LocalEngine(engine_settings(tiny_model_dir, backend=LocalBackendConfig(share_sampler_weights=False)))
    assert not engine.shares_sampler_weights
    params = {"max_tokens": 6, "temperature": 0}
    before = engine.generate(PROMPTS[0], params).token_ids
    with torch.no_grad():
        for p in engine.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    assert engine.generate(PROMPTS[0], params).token_ids == before
    engine.sync_sampler_weights()
    assert engine.generate(PROMPTS[0], params).token_ids != before


def _independent_forward_flops(config, seqlens: list[int]) -> float:
    """2 FLOPs per weight per token over every matmul (not the embedding lookup) + causal attention."""
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    per_layer = (
        h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h + 3 * h * config.intermediate_size
    )
    tokens = sum(seqlens)
    # causal attention: scores and weighted values over the lower triangle, s^2 / 2 pairs each
    attention = 2 * sum(s * s for s in seqlens) * head_dim * heads * layers
    return 2 * tokens * (layers * per_layer + vocab * h) + attention


def test_reported_mfu_matches_an_independent_flop_count_over_the_measured_peak(engine, tiny_model_dir):
    from transformers import AutoConfig

    from verl.remote_backend.forwarder.mfu import compute_mfu
    from verl.utils.flops_counter import FlopsCounter

    device = engine.device_report()
    assert device.peak_flops is not None and device.peak_flops > 0
    seqlens = [120, 64, 200, 31]
    ids = torch.nested.nested_tensor_from_jagged(
        torch.randint(3, engine.vocab_size, (sum(seqlens),)),
        torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()]),
    )
    start = time.perf_counter()
    engine.log_probs({"input_ids": ids})
    seconds = time.perf_counter() - start
    config = AutoConfig.from_pretrained(tiny_model_dir)
    reported = compute_mfu(FlopsCounter(config), seqlens, seconds, device, forward_only=True)
    independent = _independent_forward_flops(config, seqlens) / seconds / device.peak_flops
    assert reported == pytest.approx(independent, rel=0.15)


@pytest.mark.parametrize("start, before_training, reported", [(1e9, 5e9, 5e9), (5e9, 1e9, 5e9)])
def test_the_mfu_peak_is_measured_again_before_the_first_training_call_and_the_larger_kept(
    tiny_model_dir, monkeypatch, start, before_training, reported
):
    # At start the job's other processes share the cores, so the start-up rate can read low.
    from verl.workers.remote_client.local import engine as engine_module

    rates = iter([start, before_training])
    calls = []

    def measure(device, dtype):
        calls.append(device)
        return next(rates)

    monkeypatch.setattr(engine_module, "measure_matmul_flops", measure)
    engine = engine_module.LocalEngine(engine_settings(tiny_model_dir))
    assert engine.device_report().peak_flops == start
    ids = torch.nested.nested_tensor_from_jagged(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([0, 2, 5]))
    engine.log_probs({"input_ids": ids})
    engine.log_probs({"input_ids": ids})
    assert engine.device_report().peak_flops == reported
    assert len(calls) == 2  # once at start, once before the first training call, never again


def test_one_token_attention_equals_sdpa_with_grouped_heads_and_a_padding_mask():
    """The sampler's decode attention (query heads stacked against their shared key/value head,
    two matmuls) gives transformers' SDPA result, padding mask included."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from verl.workers.remote_client.local.forward import _decode_attention, _plain_decode

    g = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, length, dim = 3, 6, 2, 11, 8
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, scaling=dim**-0.5, is_causal=True, training=False)
    query = torch.randn(batch, heads, 1, dim, generator=g)
    key, value = (torch.randn(batch, kv_heads, length, dim, generator=g) for _ in range(2))
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    mask[0, ..., 7:] = False  # a shorter row: the end of its slots is padding
    mask[2, ..., :3] = False
    want = sdpa_attention_forward(module, query, key, value, mask, is_causal=False)[0]
    got = _decode_attention(module, query, key, value, mask)
    assert got.shape == want.shape == (batch, 1, heads, dim)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    scaled = sdpa_attention_forward(module, query, key, value, mask, is_causal=False, scaling=0.5)[0]
    torch.testing.assert_close(_decode_attention(module, query, key, value, mask, scaling=0.5), scaled)  # the model's
    unmasked = _decode_attention(module, query, key, value, None)
    assert (unmasked[0] - got[0]).abs().max() > 1e-3  # the mask does hide the padded keys
    assert _plain_decode(module, mask, {}) and _plain_decode(module, None, {})
    assert not _plain_decode(module, mask, {"dropout": 0.1}) and not _plain_decode(module, mask.float(), {})


def test_sampled_tokens_and_log_probs_do_not_change_with_sdpa_for_the_decode_steps(engine, monkeypatch):
    from verl.workers.remote_client.local import forward

    params = {"max_tokens": 12, "temperature": 0.8, "logprobs": True}
    requests = [engine.make_request(p, dict(params, seed=i)) for i, p in enumerate(PROMPTS)]
    ours = engine.sample(requests)
    monkeypatch.setattr(forward, "_plain_decode", lambda *args: False)  # every decode step through SDPA
    theirs = engine.sample(requests)
    for a, b in zip(ours, theirs):
        assert a.token_ids == b.token_ids and len(a.token_ids) > 1
        torch.testing.assert_close(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5, rtol=0)
