"""Unit tests of the backend-output checks: each error names the key, the expected and the actual value."""

from __future__ import annotations

import itertools

import pytest
import torch

from verl.remote_backend.errors import BackendOutputError
from verl.remote_backend.forwarder.output_checks import check_log_prob_output, check_token_ids, check_update_output
from verl.remote_backend.results import (
    BackendDevice,
    GenerateResult,
    LogProbResult,
    UpdateResult,
    as_log_prob_result,
    as_update_result,
)
from verl.workers.rollout.remote_rollout.sampling import check_generate_result

LENGTHS = [5, 7]
TOTAL = sum(LENGTHS)


def input_ids():
    offsets = torch.tensor([0, *itertools.accumulate(LENGTHS)])
    return torch.nested.nested_tensor_from_jagged(torch.arange(TOTAL) + 3, offsets=offsets)


def good(**kw):
    fields = {"log_probs": -torch.rand(TOTAL), "entropy": torch.rand(TOTAL)}
    fields.update(kw)
    return LogProbResult(**fields)


def test_well_formed_outputs_pass():
    check_log_prob_output(good(), input_ids(), calculate_entropy=True)
    nested = torch.nested.nested_tensor_from_jagged(-torch.rand(TOTAL), offsets=input_ids().offsets())
    check_log_prob_output(LogProbResult(nested), input_ids(), calculate_entropy=False)


@pytest.mark.parametrize(
    "fields, entropy, pattern",
    [
        ({"entropy": None}, True, r"entropy was asked for \(calculate_entropy=True\) but the result has none"),
        ({"log_probs": torch.zeros(TOTAL - 1)}, False, r"log_probs: expected shape \[12\] .*rows \[5, 7\].*got \[11\]"),
        ({"log_probs": torch.zeros(2, 6)}, False, r"expected shape \[12\].*got \[2, 6\]"),
        ({"entropy": torch.full((TOTAL,), float("inf"))}, True, r"entropy: expected finite values, got 12 NaN/Inf"),
    ],
)
def test_log_probs_that_do_not_fit_the_batch_are_named(fields, entropy, pattern):
    with pytest.raises(BackendOutputError, match=pattern):
        check_log_prob_output(good(**fields), input_ids(), calculate_entropy=entropy)


@pytest.mark.parametrize(
    "fields, pattern",
    [
        (
            {"log_probs": torch.zeros(TOTAL, dtype=torch.long)},
            "LogProbResult.log_probs: expected a floating dtype, got torch.int64",
        ),
        (
            {"log_probs": [0.0] * TOTAL},
            r"LogProbResult.log_probs: expected a float tensor of packed shape \[T\], got a list",
        ),
        ({"compute_s": -1.0}, r"LogProbResult.compute_s must be seconds >= 0, got -1.0"),
        ({"device": {"type": "cuda"}}, "LogProbResult.device must be a BackendDevice or None, got a dict"),
    ],
)
def test_malformed_log_prob_results_are_refused_where_they_are_built(fields, pattern):
    with pytest.raises(BackendOutputError, match=pattern):
        good(**fields)


def test_a_legacy_dict_result_still_works_with_a_deprecation_warning():
    legacy = {
        "model_output": {"log_probs": -torch.rand(TOTAL)},
        "metrics": {},
        "device": {"type": "cpu"},
        "timing": {"compute_s": 0.5},
    }
    with pytest.warns(DeprecationWarning, match="return verl.remote_backend.LogProbResult instead"):
        result = as_log_prob_result(legacy)
    assert result.device == BackendDevice("cpu") and result.compute_s == 0.5
    check_log_prob_output(result, input_ids(), calculate_entropy=False)
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(BackendOutputError, match=r"has no 'log_probs' \(keys present: \['entropy'\]\)"),
    ):
        as_log_prob_result({"model_output": {"entropy": torch.zeros(TOTAL)}})
    with pytest.raises(BackendOutputError, match="expected a LogProbResult, got a list"):
        as_log_prob_result([1.0])


def test_a_nan_is_located_by_row_and_token():
    lp = -torch.rand(TOTAL)
    lp[7] = float("nan")
    with pytest.raises(
        BackendOutputError, match=r"got 1 NaN/Inf \(first at packed index 7: row 1, token 2, value nan\)"
    ):
        check_log_prob_output(LogProbResult(lp), input_ids(), calculate_entropy=False)


def test_finite_values_whose_sum_overflows_still_pass():
    # the finiteness check sums first; an overflowing sum of finite values must not be an error
    huge = torch.full((TOTAL,), 3e38)
    check_log_prob_output(LogProbResult(huge, -huge), input_ids(), calculate_entropy=True)
    huge[3] = float("-inf")
    with pytest.raises(BackendOutputError, match=r"got 1 NaN/Inf \(first at packed index 3: row 0, token 3"):
        check_log_prob_output(LogProbResult(huge), input_ids(), calculate_entropy=False)


def test_nested_output_with_other_row_lengths_is_named():
    wrong = torch.nested.nested_tensor_from_jagged(torch.zeros(TOTAL), offsets=torch.tensor([0, 6, 12]))
    with pytest.raises(BackendOutputError, match=r"expected nested row lengths \[5, 7\] \(the batch's\), got \[6, 6\]"):
        check_log_prob_output(LogProbResult(wrong), input_ids(), calculate_entropy=False)


def test_update_results_are_checked_for_structure():
    check_update_output(
        UpdateResult({"pg_loss": [0.1, 0.2], "grad_norm": float("inf")}, loss=0.3, global_token_num=[5, 7]),
        batch_size=2,
    )
    with pytest.raises(
        BackendOutputError, match=r"UpdateResult.metrics must be a mapping of name -> number\(s\), got a NoneType"
    ):
        UpdateResult(None)
    with pytest.raises(BackendOutputError, match=r"UpdateResult.metrics\['lr'\] must be a number.*got a str"):
        UpdateResult({"lr": "high"})
    with pytest.raises(BackendOutputError, match="one count per sample: expected 2, got 3"):
        check_update_output(UpdateResult({}, global_token_num=[1, 2, 3]), batch_size=2)
    with pytest.raises(BackendOutputError, match="expected an UpdateResult, got a dict"):
        as_update_result({"loss": 1.0})


def test_generated_tokens_must_be_in_the_vocabulary_and_within_max_tokens():
    ok = check_generate_result(GenerateResult([1, 2], [-0.1, -0.2]), max_tokens=2, want_logprobs=True, vocab_size=512)
    assert ok["token_ids"] == [1, 2]
    with pytest.raises(
        BackendOutputError, match=r"token_ids\[1\]=512 is outside the model's vocabulary: expected an id in \[0, 512\)"
    ):
        check_generate_result({"token_ids": [3, 512]}, max_tokens=4, want_logprobs=False, vocab_size=512)
    with pytest.raises(BackendOutputError, match="returned 3 tokens but max_tokens was 2"):
        check_generate_result({"token_ids": [1, 2, 3]}, max_tokens=2, want_logprobs=False, vocab_size=512)
    with pytest.raises(BackendOutputError, match="log_probs: expected finite values, got nan at position 1"):
        check_generate_result(
            {"token_ids": [1, 2], "log_probs": [-1.0, float("nan")]}, max_tokens=2, want_logprobs=True
        )
    with pytest.raises(BackendOutputError, match="must be ints, got 1.5"):
        check_generate_result({"token_ids": [1, 1.5]}, max_tokens=2, want_logprobs=False)
    with pytest.raises(BackendOutputError, match=r"token_ids\[0\]=-1 .* expected an id in >= 0"):
        check_token_ids([-1], vocab_size=None)
    # still ValueErrors, as before
    assert issubclass(BackendOutputError, ValueError)
