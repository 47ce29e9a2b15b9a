"""The forwarder's pure helpers: packed outputs -> NJT, metrics -> verl Metric, MFU, checkpoint paths."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from verl.remote_backend.checkpoints import checkpoints_to_prune, parse_global_step
from verl.remote_backend.forwarder.metrics import aggregation_for, normalise_metrics
from verl.remote_backend.forwarder.mfu import compute_mfu, model_tflops, resolve_peak_flops
from verl.remote_backend.launch.cpu_compat import flash_attn_fallback_installed, install_flash_attn_fallback
from verl.remote_backend.results import BackendDevice
from verl.remote_backend.transport.layout import packed_to_nested, sequence_lengths


def _padded_batch() -> TensorDict:
    """3 samples: left-padded prompts (width 4), right-padded responses (width 3)."""
    prompts = torch.tensor([[0, 0, 5, 6], [0, 7, 8, 9], [1, 2, 3, 4]])
    prompt_mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]])
    responses = torch.tensor([[10, 11, 0], [12, 0, 0], [13, 14, 15]])
    response_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return TensorDict(
        {
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "attention_mask": attention_mask,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        },
        batch_size=[3],
    )


def _no_padding_batch() -> TensorDict:
    install_flash_attn_fallback()
    from verl.workers.utils.padding import left_right_2_no_padding

    return left_right_2_no_padding(_padded_batch())


def test_flash_attn_fallback_lets_verl_unpad_on_cpu():
    assert install_flash_attn_fallback() is True  # no flash_attn on this machine
    assert flash_attn_fallback_installed()
    batch = _no_padding_batch()
    assert batch["input_ids"].is_nested
    assert sequence_lengths(batch["input_ids"]).tolist() == [4, 4, 7]
    assert batch["input_ids"].values().tolist() == [5, 6, 10, 11, 7, 8, 9, 12, 1, 2, 3, 4, 13, 14, 15]


def test_packed_outputs_become_njt_that_verl_pads_back_to_responses():
    from verl.workers.utils.padding import no_padding_2_padding

    batch = _no_padding_batch()
    input_ids = batch["input_ids"]
    # slot t of a row = "log-prob of token t+1": use the next token id as the value to check alignment
    ids = input_ids.values()
    packed = torch.cat([ids[1:], ids[:1]]).float()
    nested = packed_to_nested(packed, input_ids, key="log_probs")
    assert nested.is_nested and nested.dtype == torch.float32
    assert torch.equal(nested.offsets(), input_ids.offsets())
    padded = no_padding_2_padding(nested, batch)
    # each response token's value is the token itself, zero-padded to the response width
    assert padded.tolist() == [[10.0, 11.0, 0.0], [12.0, 0.0, 0.0], [13.0, 14.0, 15.0]]


def test_packed_to_nested_accepts_an_njt_with_the_same_rows():
    input_ids = _no_padding_batch()["input_ids"]
    values = torch.arange(15, dtype=torch.float64)
    njt = torch.nested.nested_tensor_from_jagged(values, offsets=input_ids.offsets())
    out = packed_to_nested(njt, input_ids)
    assert out.values().tolist() == values.tolist() and out.dtype == torch.float32


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (torch.zeros(14), ValueError, "expected packed shape [15]"),
        (torch.zeros(3, 5), ValueError, "expected packed shape [15]"),
        (torch.zeros(15, dtype=torch.long), TypeError, "floating-point"),
        ([0.0] * 15, TypeError, "expected a torch.Tensor"),
    ],
)
def test_packed_to_nested_rejects_wrong_outputs_with_the_key_name(bad, error, message):
    input_ids = _no_padding_batch()["input_ids"]
    with pytest.raises(error, match="log_probs") as info:
        packed_to_nested(bad, input_ids, key="log_probs")
    assert message in str(info.value)


def test_packed_to_nested_rejects_an_njt_with_other_row_lengths():
    input_ids = _no_padding_batch()["input_ids"]
    other = torch.nested.nested_tensor_from_jagged(torch.zeros(15), offsets=torch.tensor([0, 5, 8, 15]))
    with pytest.raises(ValueError, match="row lengths"):
        packed_to_nested(other, input_ids, key="entropy")


def test_metrics_are_normalised_into_verl_metric_objects_verl_reduces():
    from verl.utils.metric import reduce_metrics
    from verl.utils.metric.utils import AggregationType, Metric

    raw = {
        "actor/pg_loss": [0.5, 1.5],  # per mini-batch; prefix dropped
        "grad_norm": 2.0,
        "pg_clipfrac": torch.tensor([0.1, 0.3]),
        "ppo_kl_max": [1.0, 4.0],
        "ppo_kl_min": [1.0, 4.0],
        "lr": Metric("mean", 1e-6),
        "empty": [],
    }
    out = normalise_metrics(raw)
    assert set(out) == {"pg_loss", "grad_norm", "pg_clipfrac", "ppo_kl_max", "ppo_kl_min", "lr"}
    assert all(isinstance(v, Metric) for v in out.values())
    assert out["ppo_kl_max"].aggregation is AggregationType.MAX
    reduced = reduce_metrics(out)
    assert reduced["pg_loss"] == pytest.approx(1.0)
    assert reduced["grad_norm"] == pytest.approx(2.0)
    assert reduced["pg_clipfrac"] == pytest.approx(0.2)
    assert reduced["ppo_kl_max"] == 4.0 and reduced["ppo_kl_min"] == 1.0
    assert reduced["lr"] == pytest.approx(1e-6)


def test_metric_with_a_non_numeric_value_names_the_metric():
    with pytest.raises(TypeError, match="'note'"):
        normalise_metrics({"note": "hello"})


def test_aggregation_follows_verls_name_rule():
    assert aggregation_for("response_length/max") == "max"
    assert aggregation_for("x/min") == "min"
    assert aggregation_for("pg_loss") == "mean"


def test_peak_flops_prefers_the_backend_value_then_verls_table():
    assert resolve_peak_flops(BackendDevice("cuda", 8, peak_flops=1.5e15)) == 1.5e15
    assert resolve_peak_flops(BackendDevice("cuda", 1, name="NVIDIA H100 80GB HBM3")) == pytest.approx(989e12)
    # CPU: verl's entry, whatever the processor string says
    assert resolve_peak_flops(BackendDevice("cpu", 1, name="x86_64")) == pytest.approx(448e9)
    assert math.isinf(resolve_peak_flops(BackendDevice("cuda", 1, name="Mystery GPU")))
    with pytest.raises(ValueError, match="peak_flops"):
        resolve_peak_flops(BackendDevice("cuda", 1, peak_flops=0.0))


def _small_llama_flops():
    """verl's FlopsCounter for a small Llama (the forwarder builds one from the model's config)."""
    from transformers import LlamaConfig

    from verl.utils.flops_counter import FlopsCounter

    return FlopsCounter(
        LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4)
    )


@pytest.mark.every_verl  # verl 0.9.1's FlopsCounter asks CUDA for a device name on CPU
def test_mfu_divides_model_flops_by_the_backends_devices_not_the_local_cpu():
    device = BackendDevice("cuda", count=8, peak_flops=1e15)
    pass_tflops = model_tflops(_small_llama_flops(), [400, 600])
    assert pass_tflops > 0
    # the pass's FLOPs over 2 s, against 8 devices * 1e15 peak (never this machine's CPU)
    expected = pass_tflops * 1e12 / 2.0 / 8e15
    assert compute_mfu(_small_llama_flops(), [400, 600], 2.0, device, forward_only=False) == pytest.approx(expected)
    assert compute_mfu(_small_llama_flops(), [400, 600], 2.0, device, forward_only=True) == pytest.approx(expected / 3)


@pytest.mark.every_verl  # verl 0.9.1's FlopsCounter asks CUDA for a device name on CPU
def test_mfu_is_zero_when_undefined():
    device = BackendDevice("cuda", count=1, name="Mystery GPU")
    assert compute_mfu(_small_llama_flops(), [10], 1.0, device, forward_only=False) == 0.0
    good = BackendDevice("cuda", count=1, peak_flops=1e15)
    assert compute_mfu(_small_llama_flops(), [], 1.0, good, forward_only=False) == 0.0
    assert compute_mfu(_small_llama_flops(), [10], 0.0, good, forward_only=False) == 0.0


def test_global_step_is_parsed_from_verls_checkpoint_path():
    assert parse_global_step("/ckpt/global_step_12/actor") == 12
    assert parse_global_step("runs/global_step_3/global_step_40/actor") == 40
    assert parse_global_step("/ckpt/latest/actor") is None


def test_checkpoint_retention_follows_max_ckpt_to_keep():
    saved = ["a", "b", "c", "d"]
    assert checkpoints_to_prune(saved, 2) == ["a", "b"]
    assert checkpoints_to_prune(saved, None) == []
    assert checkpoints_to_prune(saved, 0) == []
    assert checkpoints_to_prune(saved, 5) == []
