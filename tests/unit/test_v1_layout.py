"""The V1 trainer's batch layout (all jagged, no attention mask) -> the dense layout backends read.

The reference is verl's own legacy path: a dense, padded batch as verl's agent loop builds it,
unpadded by verl's ``left_right_2_no_padding`` exactly as the legacy trainer does before it calls a
worker. The same samples in V1's layout (one jagged row per sample, as verl 0.9.1's TransferQueue
agent loop stores them) must convert to the same tensors.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from verl.remote_backend.forwarder.v1_layout import is_v1_layout, to_dense_layout
from verl.remote_backend.launch.cpu_compat import install_flash_attn_fallback
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

pytestmark = pytest.mark.every_verl  # CI runs it on both releases (.ci/run)

install_flash_attn_fallback()  # verl's unpadding imports flash_attn otherwise (absent on a CPU machine)

PAD = 7
PROMPT_LEN, RESPONSE_LEN = 5, 4
PROMPTS = [[11, 12], [21, 22, 23, 24, 25], [31, 32, 33]]
RESPONSES = [[41, 42, 43, 44], [51], [61, 62, 63]]
# a zero inside a response (a tool's tokens in a multi-turn rollout) must stay where it is
RESPONSE_MASKS = [[1, 1, 0, 1], [1], [1, 1, 1]]
RESPONSE_FIELDS = ("old_log_probs", "ref_log_prob", "advantages", "rollout_log_probs")


def _response_values(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(len(r), generator=gen) for r in RESPONSES]


def _legacy_batch() -> TensorDict:
    """verl's dense layout (prompt left-padded to P, response right-padded to R), unpadded by verl."""
    rows = len(PROMPTS)
    prompts = torch.full((rows, PROMPT_LEN), PAD)
    responses = torch.full((rows, RESPONSE_LEN), PAD)
    attention_mask = torch.zeros(rows, PROMPT_LEN + RESPONSE_LEN, dtype=torch.int64)
    response_mask = torch.zeros(rows, RESPONSE_LEN, dtype=torch.int64)
    dense = {field: torch.zeros(rows, RESPONSE_LEN) for field in RESPONSE_FIELDS}
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        prompts[i, PROMPT_LEN - len(p) :] = torch.tensor(p)
        responses[i, : len(r)] = torch.tensor(r)
        attention_mask[i, PROMPT_LEN - len(p) : PROMPT_LEN + len(r)] = 1
        response_mask[i, : len(r)] = torch.tensor(RESPONSE_MASKS[i])
        for seed, field in enumerate(RESPONSE_FIELDS):
            dense[field][i, : len(r)] = _response_values(seed)[i]
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    batch = TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": response_mask,
            **dense,
        },
        batch_size=[rows],
    )
    return left_right_2_no_padding(batch)


def _jagged(rows: list) -> torch.Tensor:
    return torch.nested.as_nested_tensor([torch.as_tensor(r) for r in rows], layout=torch.jagged)


def _v1_batch() -> TensorDict:
    """The same samples as verl 0.9.1's TransferQueue agent loop stores them: one jagged row each."""
    sequences = [p + r for p, r in zip(PROMPTS, RESPONSES)]
    fields = {
        "prompts": _jagged(PROMPTS),
        "responses": _jagged(RESPONSES),
        "input_ids": _jagged(sequences),
        "position_ids": _jagged([list(range(len(s))) for s in sequences]),
        "response_mask": _jagged(RESPONSE_MASKS),
        "loss_mask": _jagged(RESPONSE_MASKS),
        **{field: _jagged(_response_values(seed)) for seed, field in enumerate(RESPONSE_FIELDS)},
    }
    # a per-sample non-tensor field (a list becomes verl's NonTensorStack) and a scalar knob
    return tu.get_tensordict(tensor_dict={**fields, "uid": ["a", "b", "c"]}, non_tensor_dict={"temperature": 0.7})


def test_a_v1_batch_converts_to_what_the_legacy_trainer_sends_for_the_same_samples():
    legacy, v1 = _legacy_batch(), _v1_batch()
    assert is_v1_layout(v1) and not is_v1_layout(legacy)
    dense = to_dense_layout(v1, prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN, pad_token_id=PAD)
    for key in ("prompts", "responses", "attention_mask", "response_mask", "loss_mask", *RESPONSE_FIELDS):
        assert dense[key].shape == legacy[key].shape, key
        assert torch.equal(dense[key].to(legacy[key].dtype), legacy[key]), key
    for key in ("input_ids", "position_ids"):  # jagged in both layouts, passed through
        assert torch.equal(dense[key].offsets(), legacy[key].offsets().to(dense[key].offsets().dtype))
        assert torch.equal(dense[key].values(), legacy[key].values())
    for key in ("max_seq_len", "max_response_len"):
        assert tu.get(dense, key) == tu.get(legacy, key), key
    assert tu.get(dense, "temperature") == 0.7 and dense.get("uid").tolist() == ["a", "b", "c"]
    assert is_v1_layout(v1)  # the trainer's batch itself is left as it was


def test_a_per_token_output_pads_back_the_same_way_on_both_layouts():
    """What a backend does with an output over the whole sequence (verl's ``no_padding_2_padding``,
    used by the local engine's loss) reads the converted batch like the legacy one."""
    legacy, v1 = _legacy_batch(), _v1_batch()
    dense = to_dense_layout(v1, prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN, pad_token_id=PAD)
    output = torch.nested.nested_tensor_from_jagged(
        torch.arange(legacy["input_ids"].values().numel(), dtype=torch.float32), offsets=legacy["input_ids"].offsets()
    )
    assert torch.equal(no_padding_2_padding(output, dense), no_padding_2_padding(output, legacy))


def test_rows_longer_than_the_configured_lengths_widen_the_dense_fields():
    dense = to_dense_layout(_v1_batch(), prompt_length=2, response_length=1, pad_token_id=PAD)
    assert dense["prompts"].shape == (3, 5) and dense["responses"].shape == (3, 4)
    assert dense["attention_mask"].shape == (3, 9) and tu.get(dense, "max_response_len") == 4
    assert dense["attention_mask"].sum(dim=1).tolist() == [6, 6, 6]


def test_a_batch_without_jagged_responses_is_refused():
    v1 = _v1_batch()
    with pytest.raises(ValueError, match="expects a V1 batch"):
        to_dense_layout(v1.exclude("responses"), prompt_length=5, response_length=4, pad_token_id=PAD)
