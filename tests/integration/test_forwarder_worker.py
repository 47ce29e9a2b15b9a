"""The forwarder worker, in-process, against a backend that reports 8 GPUs of known peak.

MFU must be the model FLOPs of the processed tokens (verl's Qwen2 formula)
divided by the call's duration and by 8 x the *backend's* peak - not by the
forwarder's CPU. The same calls check the packed -> nested rebuild and the
metric normalisation the trainer relies on.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import types
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from support.forwarder import in_process_forwarder
from support.remote_e2e import compose
from support.stub_backend import StubBackend

from verl.remote_backend import BackendDevice, RemoteBackend, RemoteBackendRegistry
from verl.remote_backend.errors import ConfigError, ResumeCheckpointError
from verl.utils import tensordict_utils as tu

PEAK = 989e12  # one device, FLOP/s
GPUS = 8
DEVICE = BackendDevice("cuda", count=GPUS, peak_flops=PEAK, name="NVIDIA H100 80GB HBM3")
SECONDS = 2.5  # the pinned duration of every backend call


#: answers at once with fixed values and reports an 8-GPU device
EightGpuBackend = StubBackend.variant(
    "EightGpuBackend",
    DEVICE=DEVICE,
    UPDATE_LOSS=[0.25, 0.75],
    UPDATE_METRICS={"pg_loss": [0.1, 0.3], "grad_norm": 2.0, "actor/ppo_kl": 0.0},
)


def _checkpoint_calls() -> list:
    return [(op, *payload) for op, payload in EightGpuBackend.calls if op in ("save_checkpoint", "load_checkpoint")]


@pytest.fixture
def forwarder(tiny_model_dir, monkeypatch):
    import verl.remote_backend.forwarder.worker as worker_module

    # every backend call starts at 100 * i and ends SECONDS later
    clock_values = iter(v for pair in ((100.0 * i, 100.0 * i + SECONDS) for i in itertools.count()) for v in pair)
    monkeypatch.setattr(worker_module, "time", types.SimpleNamespace(perf_counter=lambda: next(clock_values)))
    RemoteBackendRegistry.register("test-8gpu")(EightGpuBackend)
    cfg = compose(
        [
            "trainer.remote_backend=test-8gpu",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.temperature=0.9",
        ]
    )
    owner = EightGpuBackend.from_config(cfg)  # what the trainer creates; the forwarder re-attaches
    worker = in_process_forwarder(cfg, owner.reconnect_handle(), monkeypatch, role="actor_rollout_ref")
    yield worker
    asyncio.run(owner.destroy())
    RemoteBackendRegistry.unregister("test-8gpu")


def _batch(lengths=(5, 7), epochs=2, response_width=3):
    values = torch.arange(sum(lengths)) % 50 + 3
    offsets = torch.tensor([0, *itertools.accumulate(lengths)])
    td = tu.get_tensordict(
        {
            "input_ids": torch.nested.nested_tensor_from_jagged(values, offsets=offsets),
            "position_ids": torch.nested.nested_tensor_from_jagged(
                torch.cat([torch.arange(n) for n in lengths]), offsets=offsets
            ),
            # what an update needs besides the tokens (the last `response_width` of each row)
            "advantages": torch.ones(len(lengths), response_width),
            "response_mask": torch.ones(len(lengths), response_width, dtype=torch.long),
        },
        {"epochs": epochs, "temperature": 0.9, "calculate_entropy": True},
    )
    return td


def _hand_computed_flops(model_dir: str, seqlens: list[int]) -> float:
    """verl's Qwen2 count without the embedding lookup, written out: 6 * matmul params * tokens +
    6 * sum(s^2) * head_dim * heads * layers (matmul params: the layers' and the output head's)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    h, v, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    heads, kv_heads, inter = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
    head_dim = h // heads
    attn_linear = h * (heads * head_dim + 2 * kv_heads * head_dim + heads * head_dim)
    dense = (3 * h * inter + attn_linear) * layers + v * h
    return 6 * dense * sum(seqlens) + 6 * sum(s * s for s in seqlens) * head_dim * heads * layers


def test_update_mfu_uses_the_backends_eight_gpus_and_peak(forwarder, tiny_model_dir):
    out = asyncio.run(forwarder.update_actor(_batch(epochs=2)))
    metrics = tu.get(out, "metrics")
    # two PPO epochs: every token was processed twice
    expected = _hand_computed_flops(tiny_model_dir, [5, 7, 5, 7]) / SECONDS / (GPUS * PEAK)
    assert metrics["mfu"] == pytest.approx(expected, rel=1e-9)
    # against the forwarder's own CPU (verl's 448 GFLOP/s, one device) it would be ~17,700x larger
    assert metrics["mfu"] < 1e-6
    from verl.utils.metric import reduce_metrics

    reduced = reduce_metrics({k: v for k, v in metrics.items()})
    assert reduced["pg_loss"] == pytest.approx(0.2) and reduced["grad_norm"] == 2.0
    assert reduced["loss"] == pytest.approx(0.5) and "ppo_kl" in reduced


def test_log_prob_mfu_is_a_third_and_outputs_are_nested(forwarder, tiny_model_dir):
    out = asyncio.run(forwarder.compute_log_prob(_batch()))
    expected = _hand_computed_flops(tiny_model_dir, [5, 7]) / SECONDS / (GPUS * PEAK) / 3
    metrics = tu.get(out, "metrics")
    assert isinstance(metrics["mfu"], float)  # logged as is by the trainer
    assert metrics["mfu"] == pytest.approx(expected, rel=1e-9)
    log_probs, entropy = out["log_probs"], out["entropy"]
    assert log_probs.is_nested and log_probs.offsets().diff().tolist() == [5, 7]
    assert entropy.values().tolist() == [
        0.0,
        1.0,
        2.0,
        3.0,
        0.0,
        5.0,
        6.0,
        7.0,
        8.0,
        9.0,
        10.0,
        0.0,
    ]  # rows' last slots 0
    ref = asyncio.run(forwarder.compute_ref_log_prob(_batch()))
    assert ref["log_probs"].values().tolist() == [-2.0] * 4 + [0.0] + [-2.0] * 6 + [
        0.0
    ]  # the reference's, last slots 0


def test_forwarder_passes_verls_values_to_the_backend(forwarder, tiny_model_dir):
    from transformers import AutoTokenizer

    assert forwarder._temperature(_batch()) == pytest.approx(0.9)
    assert forwarder._pad_token_id == AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    assert OmegaConf.select(forwarder.config, "rollout.n") == 2


def test_checkpoints_are_forwarded_with_verls_path_and_step_and_pruned(forwarder, tmp_path):
    EightGpuBackend.calls.clear()
    paths = [str(tmp_path / f"global_step_{i}" / "actor") for i in (1, 2, 3)]
    for step, path in enumerate(paths, start=1):
        assert asyncio.run(forwarder.save_checkpoint(path, None, step, max_ckpt_to_keep=2)) == path
    assert _checkpoint_calls() == [("save_checkpoint", p, i) for i, p in enumerate(paths, start=1)]
    # verl's retention: only the newest two actor checkpoints this worker wrote remain
    assert [Path(p).exists() for p in paths] == [False, True, True]
    asyncio.run(forwarder.load_checkpoint(paths[2]))
    assert _checkpoint_calls()[-1] == ("load_checkpoint", paths[2], 3)
    with pytest.raises(ResumeCheckpointError, match="global_step_<N>"):
        asyncio.run(forwarder.load_checkpoint(str(tmp_path / "latest" / "actor")))


def test_resume_without_the_capability_is_a_clear_error(forwarder, monkeypatch):
    monkeypatch.setattr(EightGpuBackend, "load_checkpoint", RemoteBackend.load_checkpoint)
    with pytest.raises(ConfigError, match="resume_mode=disable"):
        asyncio.run(forwarder.load_checkpoint("/x/global_step_1/actor"))


def test_a_forwarder_without_a_backend_says_how_it_gets_one(forwarder):
    asyncio.run(forwarder.detach_backend())
    with pytest.raises(RuntimeError, match="attach_backend"):
        asyncio.run(forwarder.update_actor(_batch()))
