"""The rollout server's rules: token budget, sampling params handed to the backend, result checks."""

from __future__ import annotations

import pytest

from verl.remote_backend.results import GenerateResult
from verl.workers.rollout.remote_rollout.sampling import (
    backend_sampling_params,
    cap_max_tokens,
    check_generate_result,
)


@pytest.mark.parametrize(
    "requested, prompt_len, max_model_len, expected",
    [
        (None, 100, None, 32),  # default budget: response_length
        (1000, 100, None, 32),  # a request never exceeds response_length
        (8, 100, None, 8),  # a smaller request is honoured
        (None, 140, None, 20),  # prompt over prompt_length: prompt + response stays within 128 + 32
        (None, 100, 110, 10),  # context budget
        (64, 200, 150, 0),  # prompt already beyond the context: nothing to generate
    ],
)
def test_max_tokens_is_capped_at_response_length_and_context(requested, prompt_len, max_model_len, expected):
    got = cap_max_tokens(requested, prompt_len, response_length=32, prompt_length=128, max_model_len=max_model_len)
    assert got == expected


def test_sampling_params_keep_the_contract_keys_and_switch_top_k_off():
    verl_params = {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "repetition_penalty": 1.0, "logprobs": True}
    assert backend_sampling_params(verl_params, 16) == {
        "max_tokens": 16,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "logprobs": True,
        "repetition_penalty": 1.0,
    }
    assert backend_sampling_params({"top_k": 50}, 4)["top_k"] == 50
    assert backend_sampling_params({}, 4) == {
        "max_tokens": 4,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "logprobs": False,
    }


def test_generate_result_becomes_token_output_fields():
    out = check_generate_result(
        {"token_ids": [5, 6, 7], "log_probs": [-0.1, -0.2, -0.3], "stop_reason": "completed"},
        max_tokens=3,
        want_logprobs=True,
    )
    assert out == {"token_ids": [5, 6, 7], "log_probs": [-0.1, -0.2, -0.3], "stop_reason": "completed"}
    # log-probs that were not asked for are dropped (verl would otherwise treat them as rollout log-probs)
    assert check_generate_result({"token_ids": [5], "log_probs": [-1.0]}, max_tokens=2, want_logprobs=False) == {
        "token_ids": [5],
        "log_probs": None,
        "stop_reason": "completed",
    }


@pytest.mark.parametrize(
    "result, message",
    [
        ({"ids": [1]}, "expected a GenerateResult, got a dict"),
        (lambda: GenerateResult([1, 2, 3]), "3 tokens but max_tokens was 2"),
        (lambda: GenerateResult([1.5]), "GenerateResult.token_ids must be ints, got 1.5"),
        (lambda: GenerateResult([1, 2], [-1.0]), "GenerateResult has 1 log-probs for 2 tokens"),
        (lambda: GenerateResult([1], stop_reason="length"), "stop_reason must be 'completed' or 'aborted'"),
        ({"token_ids": [1.5]}, "GenerateResult.token_ids must be ints"),  # a legacy dict, same check
    ],
)
def test_bad_generate_results_are_rejected(result, message):
    with pytest.raises(ValueError, match=message):
        check_generate_result(result() if callable(result) else result, max_tokens=2, want_logprobs=False)


def test_missing_logprobs_when_asked_is_an_error():
    with pytest.raises(ValueError, match="logprobs=True"):
        check_generate_result({"token_ids": [1]}, max_tokens=2, want_logprobs=True)
