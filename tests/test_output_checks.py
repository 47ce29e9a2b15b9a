"""Unit tests of the backend-output checks: each error names the key, the expected and the actual value."""

from __future__ import annotations

import itertools

import pytest
import torch

from verl.remote_backend.output_checks import check_log_prob_output, check_token_ids, check_update_output
from verl.remote_backend.errors import BackendOutputError
from verl.workers.rollout.remote_rollout.sampling import check_generate_result

LENGTHS = [5, 7]
TOTAL = sum(LENGTHS)


def input_ids():
    offsets = torch.tensor([0, *itertools.accumulate(LENGTHS)])
    return torch.nested.nested_tensor_from_jagged(torch.arange(TOTAL) + 3, offsets=offsets)


def good(**kw):
    out = {"log_probs": -torch.rand(TOTAL), "entropy": torch.rand(TOTAL)}
    out.update(kw)
    return out


def test_well_formed_outputs_pass():
    check_log_prob_output(good(), input_ids(), calculate_entropy=True)
    nested = torch.nested.nested_tensor_from_jagged(-torch.rand(TOTAL), offsets=input_ids().offsets())
    check_log_prob_output({"log_probs": nested}, input_ids(), calculate_entropy=False)


@pytest.mark.parametrize(
    "output, entropy, pattern",
    [
        ({"entropy": torch.zeros(TOTAL)}, False, r"model_output\['log_probs'\] is missing; expected a float tensor of shape \[12\]"),
        (good(entropy=None), True, r"model_output\['entropy'\] is missing"),
        (good(log_probs=torch.zeros(TOTAL - 1)), False, r"expected shape \[12\] .*rows \[5, 7\].*got \[11\]"),
        (good(log_probs=torch.zeros(2, 6)), False, r"expected shape \[12\].*got \[2, 6\]"),
        (good(log_probs=torch.zeros(TOTAL, dtype=torch.long)), False, "expected a floating dtype, got torch.int64"),
        (good(log_probs=[0.0] * TOTAL), False, "expected a float tensor of shape \\[12\\], got a list"),
        (good(entropy=torch.full((TOTAL,), float("inf"))), True, r"'entropy'\]: expected finite values, got 12 NaN/Inf"),
    ],
)
def test_malformed_log_prob_outputs_are_named(output, entropy, pattern):
    with pytest.raises(BackendOutputError, match=pattern):
        check_log_prob_output(output, input_ids(), calculate_entropy=entropy)


def test_a_nan_is_located_by_row_and_token():
    lp = -torch.rand(TOTAL)
    lp[7] = float("nan")
    with pytest.raises(BackendOutputError, match=r"got 1 NaN/Inf \(first at packed index 7: row 1, token 2, value nan\)"):
        check_log_prob_output({"log_probs": lp}, input_ids(), calculate_entropy=False)


def test_finite_values_whose_sum_overflows_still_pass():
    # the finiteness check sums first; an overflowing sum of finite values must not be an error
    huge = torch.full((TOTAL,), 3e38)
    check_log_prob_output({"log_probs": huge, "entropy": -huge}, input_ids(), calculate_entropy=True)
    huge[3] = float("-inf")
    with pytest.raises(BackendOutputError, match=r"got 1 NaN/Inf \(first at packed index 3: row 0, token 3"):
        check_log_prob_output({"log_probs": huge}, input_ids(), calculate_entropy=False)


def test_nested_output_with_other_row_lengths_is_named():
    wrong = torch.nested.nested_tensor_from_jagged(torch.zeros(TOTAL), offsets=torch.tensor([0, 6, 12]))
    with pytest.raises(BackendOutputError, match=r"expected nested row lengths \[5, 7\] \(the batch's\), got \[6, 6\]"):
        check_log_prob_output({"log_probs": wrong}, input_ids(), calculate_entropy=False)


def test_update_results_are_checked_for_structure():
    check_update_output({"metrics": {"pg_loss": [0.1, 0.2], "grad_norm": float("inf")}, "loss": 0.3,
                         "global_token_num": [5, 7]}, batch_size=2)
    with pytest.raises(BackendOutputError, match=r"result\['metrics'\] must be a mapping .* got nothing \(keys present: \['loss'\]\)"):
        check_update_output({"loss": 1.0}, batch_size=2)
    with pytest.raises(BackendOutputError, match=r"result\['metrics'\]\['lr'\] must be a number.*got a str"):
        check_update_output({"metrics": {"lr": "high"}}, batch_size=2)
    with pytest.raises(BackendOutputError, match="one count per sample: expected 2, got 3"):
        check_update_output({"metrics": {}, "global_token_num": [1, 2, 3]}, batch_size=2)


def test_generated_tokens_must_be_in_the_vocabulary_and_within_max_tokens():
    ok = check_generate_result({"token_ids": [1, 2], "log_probs": [-0.1, -0.2]}, max_tokens=2, want_logprobs=True, vocab_size=512)
    assert ok["token_ids"] == [1, 2]
    with pytest.raises(BackendOutputError, match=r"token_ids\[1\]=512 is outside the model's vocabulary: expected an id in \[0, 512\)"):
        check_generate_result({"token_ids": [3, 512]}, max_tokens=4, want_logprobs=False, vocab_size=512)
    with pytest.raises(BackendOutputError, match="returned 3 tokens but max_tokens was 2"):
        check_generate_result({"token_ids": [1, 2, 3]}, max_tokens=2, want_logprobs=False, vocab_size=512)
    with pytest.raises(BackendOutputError, match="log_probs: expected finite values, got nan at position 1"):
        check_generate_result({"token_ids": [1, 2], "log_probs": [-1.0, float("nan")]}, max_tokens=2, want_logprobs=True)
    with pytest.raises(BackendOutputError, match="expected ints, got 1.5"):
        check_generate_result({"token_ids": [1, 1.5]}, max_tokens=2, want_logprobs=False)
    with pytest.raises(BackendOutputError, match=r"token_ids\[0\]=-1 .* expected an id in >= 0"):
        check_token_ids([-1], vocab_size=None)
    # still ValueErrors, as before
    assert issubclass(BackendOutputError, ValueError)
