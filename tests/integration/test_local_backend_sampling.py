"""The local engine's sampler: limits, EOS, greedy determinism, log-probs, batching, bad input."""

from __future__ import annotations

import pytest
import torch
from support.local_backend_helpers import engine_settings


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from verl.workers.remote_client.local.engine import LocalEngine

    return LocalEngine(engine_settings(tiny_model_dir))


PROMPTS = [[5, 17, 33, 9], [100, 7], [42, 43, 44, 45, 46, 47, 48], [300]]


def _forward_log_probs(engine, prompt, tokens, temperature):
    """log p(token) under a plain forward pass of prompt + tokens, at ``temperature``."""
    ids = torch.nested.nested_tensor_from_jagged(
        torch.tensor(prompt + tokens), torch.tensor([0, len(prompt) + len(tokens)])
    )
    lp = engine.log_probs({"input_ids": ids}, temperature=temperature)["log_probs"]
    return lp[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]


@pytest.mark.parametrize("max_tokens", [0, 1, 5, 13])
def test_generation_stops_at_max_tokens(engine, max_tokens):
    reqs = [engine.make_request(p, {"max_tokens": max_tokens, "temperature": 1.0}) for p in PROMPTS]
    for res in engine.sample(reqs):
        assert len(res.token_ids) <= max_tokens
        if len(res.token_ids) < max_tokens:  # stopped early: only at EOS
            assert res.token_ids[-1] in engine.eos_token_ids
        assert res.stop_reason == "completed"


def test_generation_stops_at_eos(engine):
    """Make EOS the only likely token (a hook biasing the sampler's lm_head) and check decoding stops there."""
    eos = engine.eos_token_ids[0]
    head = engine.sampler_model.get_output_embeddings()
    bias = torch.zeros(head.weight.shape[0])
    bias[eos] = 50.0
    hook = head.register_forward_hook(lambda mod, inp, out: out + bias)
    try:
        reqs = [engine.make_request(p, {"max_tokens": 10, "temperature": 1.0}) for p in PROMPTS]
        for res in engine.sample(reqs):
            assert res.token_ids == [eos]
    finally:
        hook.remove()


def test_greedy_is_deterministic_and_independent_of_batch_mates(engine):
    params = {"max_tokens": 12, "temperature": 0, "logprobs": True}
    alone = [engine.sample([engine.make_request(p, params)])[0].token_ids for p in PROMPTS]
    together = [r.token_ids for r in engine.sample([engine.make_request(p, params) for p in PROMPTS])]
    again = [r.token_ids for r in engine.sample([engine.make_request(p, params) for p in PROMPTS])]
    assert alone == together == again
    # greedy = argmax of a plain forward pass at every step
    for prompt, tokens in zip(PROMPTS, alone):
        seq = list(prompt)
        for tok in tokens:
            with torch.no_grad():
                logits = engine.sampler_model(input_ids=torch.tensor([seq])).logits[0, -1]
            assert int(logits.argmax()) == tok
            seq.append(tok)


def test_top_k_one_is_greedy(engine):
    greedy = engine.sample([engine.make_request(p, {"max_tokens": 8, "temperature": 0}) for p in PROMPTS])
    top1 = engine.sample([engine.make_request(p, {"max_tokens": 8, "temperature": 1.3, "top_k": 1}) for p in PROMPTS])
    assert [r.token_ids for r in greedy] == [r.token_ids for r in top1]


@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
def test_returned_log_probs_match_a_forward_pass(engine, temperature):
    params = {"max_tokens": 10, "temperature": temperature, "top_p": 0.9, "top_k": 50, "logprobs": True}
    results = engine.sample([engine.make_request(p, params) for p in PROMPTS])
    for prompt, res in zip(PROMPTS, results):
        assert len(res.log_probs) == len(res.token_ids)
        expected = _forward_log_probs(engine, prompt, res.token_ids, temperature or 1.0)
        torch.testing.assert_close(torch.tensor(res.log_probs), expected, atol=1e-4, rtol=0)


def test_log_probs_only_when_asked(engine):
    res = engine.generate(PROMPTS[0], {"max_tokens": 3})
    assert res.log_probs is None and len(res.token_ids) <= 3


def test_top_p_restricts_to_the_nucleus(engine):
    """With a tiny top_p every sampled token is the most likely one."""
    params = {"max_tokens": 8, "temperature": 1.0, "top_p": 1e-6}
    greedy = engine.sample([engine.make_request(p, {"max_tokens": 8, "temperature": 0}) for p in PROMPTS])
    nucleus = engine.sample([engine.make_request(p, params) for p in PROMPTS])
    assert [r.token_ids for r in greedy] == [r.token_ids for r in nucleus]


@pytest.mark.parametrize(
    "params, name",
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": 4, "temperature": -0.1}, "temperature"),
        ({"max_tokens": 4, "top_p": 0.0}, "top_p"),
        ({"max_tokens": 4, "top_p": 1.5}, "top_p"),
        ({"max_tokens": 4, "top_k": 0.5}, "top_k"),
        ({"max_tokens": 4, "repetition_penalty": 0}, "repetition_penalty"),
        ({"max_tokens": 4, "seed": -1}, "seed"),
        ({"max_tokens": 4, "seed": "7"}, "seed"),
    ],
)
def test_invalid_sampling_params_are_rejected_by_name(engine, params, name):
    with pytest.raises(ValueError, match=name):
        engine.make_request([1, 2, 3], params)


def test_prompt_longer_than_the_context_is_rejected(engine):
    with pytest.raises(ValueError, match="longer than the model context"):
        engine.make_request([5] * (engine.max_model_len + 1), {"max_tokens": 1})
    with pytest.raises(ValueError, match="empty"):
        engine.make_request([], {"max_tokens": 1})
    with pytest.raises(ValueError, match="vocabulary"):
        engine.make_request([engine.vocab_size + 3], {"max_tokens": 1})


def test_max_tokens_is_capped_at_the_context_left(engine):
    req = engine.make_request([5] * (engine.max_model_len - 3), {"max_tokens": 100})
    assert req.params.max_tokens == 3


def test_repetition_penalty_changes_greedy_output(engine):
    base = engine.generate(PROMPTS[0], {"max_tokens": 12, "temperature": 0}).token_ids
    penal = engine.generate(PROMPTS[0], {"max_tokens": 12, "temperature": 0, "repetition_penalty": 5.0}).token_ids
    assert len(set(penal)) >= len(set(base))


def test_rows_leaving_the_batch_early_do_not_disturb_the_others(engine):
    """Per-row max_tokens (and sampling params) in one batch: each row decodes as if it were alone."""
    limits = [1, 9, 4, 6]
    temps = [0, 0, 1.0, 0]
    reqs = [engine.make_request(p, {"max_tokens": m, "temperature": t}) for p, m, t in zip(PROMPTS, limits, temps)]
    together = engine.sample(reqs)
    for prompt, m, t, res in zip(PROMPTS, limits, temps, together):
        assert len(res.token_ids) <= m
        if t == 0:
            alone = engine.generate(prompt, {"max_tokens": m, "temperature": 0}).token_ids
            assert res.token_ids == alone


def test_requests_joining_a_running_batch_decode_as_if_alone(engine):
    """Continuous batching: rows admitted mid-flight (shorter and longer prompts than the running
    rows' cache) produce exactly their solo greedy output, and so do the rows already running."""
    greedy = {"temperature": 0, "logprobs": True}
    plan = [  # (step at which it joins, prompt, max_tokens)
        (0, PROMPTS[0], 9),
        (0, PROMPTS[3], 3),
        (2, PROMPTS[1], 7),
        (2, list(range(50, 70)), 5),  # longer than the running cache: the running rows get left-padded
        (5, PROMPTS[2], 6),
    ]
    batch = engine.decode_batch()
    results, step = {}, 0
    while step < 50 and (len(results) < len(plan)):
        admit = [
            (i, engine.make_request(p, {**greedy, "max_tokens": m})) for i, (s, p, m) in enumerate(plan) if s == step
        ]
        results.update(engine.decode_step(batch, admit))
        step += 1
    assert len(batch) == 0 and len(results) == len(plan)
    for i, (_, prompt, m) in enumerate(plan):
        alone = engine.generate(prompt, {**greedy, "max_tokens": m})
        assert results[i].token_ids == alone.token_ids, i
        torch.testing.assert_close(torch.tensor(results[i].log_probs), torch.tensor(alone.log_probs), atol=1e-5, rtol=0)


def test_a_seeded_request_samples_the_same_tokens_whatever_its_batch_mates_and_order(engine):
    """Each seeded request draws from its own stream: batch composition and arrival order do not matter."""
    params = {"max_tokens": 12, "temperature": 1.0}
    seeded = [dict(params, seed=1000 + i) for i in range(len(PROMPTS))]
    alone = [engine.sample([engine.make_request(p, s)])[0].token_ids for p, s in zip(PROMPTS, seeded)]
    order = [2, 0, 3, 1]
    shuffled = engine.sample([engine.make_request(PROMPTS[i], seeded[i]) for i in order])
    mixed = engine.sample(
        [engine.make_request([77, 78], params)] + [engine.make_request(p, s) for p, s in zip(PROMPTS, seeded)]
    )  # an unseeded batch mate draws from the shared stream
    assert [shuffled[order.index(i)].token_ids for i in range(len(PROMPTS))] == alone
    assert [r.token_ids for r in mixed[1:]] == alone
    # and the seed matters: another seed gives another sample for at least one prompt
    other = [
        engine.sample([engine.make_request(p, dict(params, seed=5000 + i))])[0].token_ids for i, p in enumerate(PROMPTS)
    ]
    assert other != alone
