"""The step-floor benchmark's arithmetic (``benchmarks/bench_step_floor.py``): each phase's
floor from the model's size, the step's shape and the machine's rates."""

from __future__ import annotations

import pytest
from support.remote_e2e import REPO_ROOT

RATES = dict(matmul_flops=100e9, read_bytes_per_s=10e9)


@pytest.fixture()
def floor(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from benchmarks import bench_step_floor

    return bench_step_floor


@pytest.fixture()
def llama(tmp_path):
    """A small Llama config (no weights): 2 layers, hidden 64, MLP 128, vocab 1000, tied."""
    from transformers import LlamaConfig

    LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=1000, tie_word_embeddings=True,
    ).save_pretrained(tmp_path)  # fmt: skip
    return str(tmp_path)


def test_each_phase_floor_is_its_flops_or_weight_reads_over_the_machine_rate(floor, llama):
    rates = floor.MachineRates(**RATES)
    shape = floor.StepShape(samples=8, prompt_tokens=100, response_tokens=50, decode_steps=60)
    floors = floor.phase_floors(llama, shape, rates, recompute=True)
    # parameters: embedding 1000*64 (tied head) + per layer 4*64*64 attention + 3*64*128 MLP + 2*64 norms, + final norm
    weights = 1000 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    decode_step = max(2 * weights * 8 / RATES["matmul_flops"], weights * 4 / RATES["read_bytes_per_s"])
    assert floors["gen"] > 60 * decode_step  # the decode plus a prefill
    assert floors["gen"] - 60 * decode_step == pytest.approx(floors["old_log_prob"] * 100 / 150, rel=0.05)
    assert floors["update_actor"] == pytest.approx(3 * floors["old_log_prob"])  # forward+backward = 3 forwards
    # the update over T = 8 * 150 tokens is at least 6 FLOPs per non-embedding weight and token
    assert floors["update_actor"] * RATES["matmul_flops"] >= 6 * (weights - 1000 * 64) * 8 * 150
    assert "old_log_prob" not in floor.phase_floors(llama, shape, rates, recompute=False)


def test_the_step_line_compares_the_step_without_checkpoint_and_validation_to_the_sum_of_floors(floor, llama):
    rates = floor.MachineRates(**RATES)
    step = {
        "perf/total_num_tokens": 8 * 150, "prompt_length/mean": 100, "response_length/mean": 50,
        "response_length/max": 60, "timing_s/gen": 3.0, "timing_s/update_actor": 4.0,
        "timing_s/save_checkpoint": 2.0, "timing_s/step": 9.5,
    }  # fmt: skip
    results = floor.compare("after", [{"step": 1, "data": step}, {"step": 2, "data": step}], llama, rates)
    by_case = {r.case.split(" (")[0]: r for r in results}
    floors = floor.phase_floors(llama, floor.StepShape(8, 100, 50, 60), rates, recompute=False)
    assert by_case["after: gen"].ratio == pytest.approx(3.0 / floors["gen"])
    # the note's stricter floor counts each prompt once for its 4 samples (the default rollout.n)
    repeated = floor.prefill_floor(llama, floor.StepShape(8, 100, 50, 60), rates) * 3 / 4  # 3 of 4 prompt copies
    shared = floors["gen"] - repeated
    assert f"{shared:.2f} s = {3.0 / shared:.2f}x" in by_case["after: gen"].note
    assert shared < floors["gen"]
    shared_update = floors["update_actor"] - 3 * repeated  # forward and backward over them
    assert f"{shared_update:.2f} s = {4.0 / shared_update:.2f}x" in by_case["after: update_actor"].note
    whole = by_case["after: step without checkpoint/validation"]
    assert whole.a == pytest.approx(7.5) and whole.b == pytest.approx(sum(floors.values()))
    assert whole.met is (whole.ratio <= floor.TARGET)  # the floor: every sample's prompt counts
    assert f"prompt run once: {shared + shared_update:.2f} s = {7.5 / (shared + shared_update):.2f}x" in whole.note


def test_checkpoint_and_validation_seconds_come_off_only_the_steps_that_spent_them(floor, llama):
    """A run that saves every second step and validates at its last: the step line is the median
    over steps of each step's own compute seconds, not the median step less the median save."""
    rates = floor.MachineRates(**RATES)
    base = {
        "perf/total_num_tokens": 8 * 150, "prompt_length/mean": 100, "response_length/mean": 50,
        "response_length/max": 60, "timing_s/gen": 3.0, "timing_s/update_actor": 4.0,
    }  # fmt: skip
    seconds = [(9.0, {}), (12.0, {"timing_s/save_checkpoint": 4.0}), (8.0, {}), (40.0, {"timing_s/testing": 30.0})]
    steps = [{"step": 0, "data": dict(base, **{"timing_s/step": 99.0})}]  # warm-up step, left out
    steps += [{"step": i + 1, "data": dict(base, **{"timing_s/step": t}, **io)} for i, (t, io) in enumerate(seconds)]
    whole = next(r for r in floor.compare("after", steps, llama, rates) if "step without" in r.case)
    assert whole.a == pytest.approx(8.5)  # median of 9, 8, 8, 10
    assert "34.0 s over 4 steps not counted" in whole.note


def test_the_gemm_passes_run_every_linear_layer_at_the_rows_the_engine_feeds_it(floor, llama):
    shape = floor.StepShape(samples=8, prompt_tokens=100, response_tokens=50, decode_steps=60, samples_per_prompt=4)
    passes = floor.gemm_passes(llama, shape, micro_rows=2, shared_prompts=False)
    layer = [(64, 64)] * 4 + [(128, 64), (128, 64), (64, 128)]  # q k v o, gate up down (out, in)
    body = 2 * layer
    decode = passes["gen_decode"]
    assert decode.gemms == tuple((8, o, i) for o, i in body) + ((8, 1000, 64),) and decode.times == 60
    prefill = passes["gen_prefill"]  # 2 distinct prompts of 100 tokens; logits for their last token only
    assert prefill.gemms == tuple((200, o, i) for o, i in body) + ((2, 1000, 64),) and prefill.times == 1
    update = passes["update_actor"]  # 4 micro-batches of 2 x 150 tokens; logits for the 2 x 50 response tokens
    assert update.gemms == tuple((300, o, i) for o, i in body) + ((100, 1000, 64),)
    assert update.times == 4 and update.backward and not decode.backward
    per_pass = sum(2 * r * o * i for r, o, i in update.gemms)
    assert floor.gemm_flops(update) == 3 * 4 * per_pass  # forward + the gradient's two GEMMs, per micro-batch
    # use_prefix_grouper: a micro-batch of one prompt's samples holds the prompt once
    shared = floor.gemm_passes(llama, shape, micro_rows=4)["update_actor"]  # 100 + 4 x 50 tokens, 2 micro-batches
    assert shared.gemms == tuple((300, o, i) for o, i in body) + ((200, 1000, 64),) and shared.times == 2
    halves = floor.gemm_passes(llama, shape, micro_rows=2)["update_actor"]  # half a group: its prompt + 2 responses
    assert halves.gemms[0] == (200, 64, 64) and halves.times == 4
    assert floor.gemm_flops(decode) == 60 * sum(2 * r * o * i for r, o, i in decode.gemms)


def test_gemm_seconds_times_one_pass_and_scales_it_by_its_repeats(floor):
    once = floor.GemmPass(gemms=((64, 256, 256), (64, 256, 256)), times=1, backward=True)
    assert 0 < floor.gemm_seconds(once, repeats=2) < 1.0
    # a pass repeated 1000 times is counted 1000 times, not timed 1000 times
    assert floor.gemm_seconds(
        floor.GemmPass(once.gemms, times=1000, backward=True), repeats=2
    ) > 100 * floor.gemm_seconds(once, repeats=2)
