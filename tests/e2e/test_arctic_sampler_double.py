"""The CPU double of Arctic's vLLM ``ReplicaPool`` is at least as strict as the real one.

What the real pool does (arctic_inference ``server/replica_pool.py``, ``server/worker.py``,
``server/scheduler.py``; arctic_platform ``common/http_server.py``, ``wire.py``):

* ``/generate`` log-probs: one dict per generated token, ``{token_id: {"logprob", "rank"}}``
  (the worker's ``_serialize_logprobs_position``), ids turned into strings by the JSON wire;
* the values are vLLM's ``logprobs_mode``: ``raw_logprobs`` by default (before temperature,
  penalties, top-k/top-p), ``processed_logprobs`` when the engine is configured so;
* ``sleep`` pauses the scheduler (new requests fail), drains in-flight requests (they finish),
  then sleeps the workers; ``generate`` fails while asleep; wake stages follow the worker's
  ``ready -> sleeping -> weights_ready -> ready`` machine and refuse a KV-only wake from sleep.

Each test checks the double against an independent computation or the rule itself, and the
adapter's ``parse_result`` against the real shape (and against the shapes it must refuse).
"""

from __future__ import annotations

import asyncio
import os
import pathlib

import pytest
import torch
from arctic_platform import wire
from arctic_standin import cpu_sampler
from arctic_standin.cpu_sampler import CpuReplicaPool, SamplerReplica, build_model_config, check_sampling_params

from verl.workers.remote_client.arctic.errors import ArcticResponseError
from verl.workers.remote_client.arctic.generation import parse_result

# The tests on the pool start Ray and a replica actor (~30 s on 2 cores); the others are instant.
SLOW = pytest.mark.slow
TESTS_DIR = str(pathlib.Path(__file__).resolve().parents[1])
PROMPT = "how many apples"
T = 0.7


@pytest.fixture(scope="module")
def loop():
    """One event loop for the module, as the server has (the pool's lock belongs to one loop)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def raw_replica(tiny_model_dir, loop):
    """A replica in vLLM's default mode, in this process (no pool): the raw side of comparisons."""
    mode = build_model_config(tiny_model_dir, {}).logprobs_mode
    assert mode == "raw_logprobs"  # vLLM's default when the sampling job's vllm config says nothing
    replica = SamplerReplica(tiny_model_dir, 8, 0, mode, torch_threads=None)
    yield replica
    batcher = replica.actor._batcher  # the engine actor's batching task lives on the module's loop
    if batcher is not None:
        batcher.cancel()
        loop.run_until_complete(asyncio.gather(batcher, return_exceptions=True))


@pytest.fixture(scope="module")
def pool(tiny_model_dir, loop):
    """The pool as Arctic's server builds it, for a vllm config asking for processed log-probs."""
    import ray

    started = not ray.is_initialized()
    if started:  # replica actors import arctic_standin, as in the stand-in server
        path = os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path}})  # fmt: skip
    pool = CpuReplicaPool()
    cfg = build_model_config(tiny_model_dir, {"logprobs_mode": "processed_logprobs", "max_num_seqs": 8})
    loop.run_until_complete(pool.initialize(cfg, num_replicas=1))
    yield pool
    loop.run_until_complete(pool.shutdown())
    if started:
        ray.shutdown()


def awake(pool, loop):
    if pool.sleeping:
        loop.run_until_complete(pool.wake_up(tags=None))
    return pool


def over_the_wire(results):
    """What the adapter's client reads: the results through the server's DSSST1 response body."""
    return wire.loads(wire.dumps({"job_id": 1, "results": results}))["results"]


def next_token_logits(model, tok, tokens):
    ids = tok(PROMPT)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + tokens[:-1]])).logits[0, len(ids) - 1 :].float()
    return ids, logits


def sampled(entries, tokens):
    return [entry[str(t) if str(t) in entry else t] for entry, t in zip(entries, tokens)]


def assert_rank(rank, values, value):
    """vLLM's rank (#tokens scoring >= the sampled one), up to float noise between two forwards."""
    lo = int((values > value + 1e-4).sum()) + 1
    hi = int((values >= value - 1e-4).sum())
    assert lo <= rank <= hi


@SLOW
def test_processed_log_probs_are_of_the_sampled_distribution_and_raw_ones_are_not(pool, raw_replica, hf, loop):
    model, tok = hf
    params = {"max_tokens": 10, "temperature": T, "top_p": 1.0, "top_k": -1, "logprobs": 0, "seed": 11}
    processed = over_the_wire(loop.run_until_complete(awake(pool, loop).generate([PROMPT], params)))[0]
    raw = loop.run_until_complete(raw_replica.generate(PROMPT, check_sampling_params(params)))
    tokens = processed["token_ids"]
    assert raw["token_ids"] == tokens and len(tokens) >= 2  # same seed and weights: same tokens

    _, logits = next_token_logits(model, tok, tokens)
    ref_processed = torch.log_softmax(logits / T, dim=-1)
    ref_raw = torch.log_softmax(logits, dim=-1)
    got_p, got_r = sampled(processed["logprobs"], tokens), sampled(raw["logprobs"], tokens)
    for j, t in enumerate(tokens):
        assert got_p[j]["logprob"] == pytest.approx(float(ref_processed[j, t]), abs=1e-4)
        assert got_r[j]["logprob"] == pytest.approx(float(ref_raw[j, t]), abs=1e-4)
        assert_rank(got_p[j]["rank"], ref_processed[j], got_p[j]["logprob"])
        assert_rank(got_r[j]["rank"], ref_raw[j], got_r[j]["logprob"])
    gap = max(abs(p["logprob"] - r["logprob"]) for p, r in zip(got_p, got_r))
    assert gap > 1e-2  # at T=0.7 the two modes really differ: a double ignoring the mode fails here


@SLOW
def test_processed_log_probs_include_penalty_and_top_k_and_top_entries_come_ranked(pool, raw_replica, hf, loop):
    model, tok = hf
    k, penalty = 8, 1.5
    params = {"max_tokens": 8, "temperature": 0.9, "top_k": k, "repetition_penalty": penalty, "logprobs": 3, "seed": 5}
    processed = over_the_wire(loop.run_until_complete(awake(pool, loop).generate([PROMPT], params)))[0]
    raw = loop.run_until_complete(raw_replica.generate(PROMPT, check_sampling_params(params)))
    tokens = processed["token_ids"]
    assert raw["token_ids"] == tokens

    ids, logits = next_token_logits(model, tok, tokens)
    seen = set(ids)
    for j, t in enumerate(tokens):
        row = logits[j].clone()
        for s in seen:
            row[s] = row[s] / penalty if row[s] > 0 else row[s] * penalty
        row = row / 0.9
        kept = row.topk(k).indices
        assert t in kept.tolist()  # the sampler sampled from the top-k
        masked = torch.full_like(row, float("-inf"))
        masked[kept] = row[kept]
        ref = torch.log_softmax(masked, dim=-1)
        entry = processed["logprobs"][j]
        assert entry[str(t)]["logprob"] == pytest.approx(float(ref[t]), abs=1e-4)
        assert 1 <= entry[str(t)]["rank"] <= k
        assert len(entry) in (3, 4)  # the top 3, and the sampled token unless it is one of them (like vLLM)
        top = sorted((e["rank"], float(ref[int(i)]), e["logprob"]) for i, e in entry.items() if e["rank"] <= 3)
        assert [r for r, _, _ in top] == [1, 2, 3]
        assert [v for _, _, v in top] == pytest.approx([ref_v for _, ref_v, _ in top], abs=1e-4)
        assert [v for _, _, v in top] == pytest.approx(ref.topk(3).values.tolist(), abs=1e-4)
        raw_ref = torch.log_softmax(logits[j], dim=-1)  # raw: no penalty, temperature or top-k
        assert raw["logprobs"][j][t]["logprob"] == pytest.approx(float(raw_ref[t]), abs=1e-4)
        seen.add(t)


@SLOW
def test_the_wire_shape_is_token_id_strings_to_logprob_and_rank_and_parse_result_reads_it(pool, loop):
    params = {"max_tokens": 6, "temperature": T, "logprobs": 0, "seed": 3}
    before = loop.run_until_complete(awake(pool, loop).generate([PROMPT], params))[0]
    result = over_the_wire([before])[0]
    assert set(result) >= {"text", "token_ids", "finish_reason", "logprobs"}
    assert len(result["logprobs"]) == len(result["token_ids"]) > 0
    for entry, t in zip(result["logprobs"], result["token_ids"]):
        assert list(entry) == [str(t)]  # logprobs=0: the sampled token only, its id a string
        item = entry[str(t)]
        assert set(item) == {"logprob", "rank"} and isinstance(item["logprob"], float) and type(item["rank"]) is int
    assert all(isinstance(k, int) for e in before["logprobs"] for k in e)  # int ids before the JSON wire
    parsed = parse_result(result, want_logprobs=True)
    assert parsed.token_ids == result["token_ids"]
    assert parsed.log_probs == [e[str(t)]["logprob"] for e, t in zip(result["logprobs"], result["token_ids"])]


GOOD = {"token_ids": [7, 9], "logprobs": [{"7": {"logprob": -0.5, "rank": 1}}, {"9": {"logprob": -1.25, "rank": 2}}]}


@pytest.mark.parametrize(
    "logprobs, pattern",
    [
        (
            [-0.5, -1.25],
            r"logprobs\[0\] is float -0\.5, expected a dict mapping token ids",
        ),  # the old lax double's shape
        (
            [{"8": {"logprob": -0.5, "rank": 1}}, GOOD["logprobs"][1]],
            r"no entry for the sampled token 7 \(token ids present: 8\)",
        ),
        ([{7: {"logprob": -0.5, "rank": 1}}, GOOD["logprobs"][1]], r"int key 7; token ids arrive as strings"),
        ([{"7": -0.5}, GOOD["logprobs"][1]], r"for the sampled token 7 is -0\.5, expected \{'logprob'"),
        ([{"7": {"logprob": float("nan"), "rank": 1}}, GOOD["logprobs"][1]], r"sampled token 7 is .*nan"),
        ([{"7": {"logprob": 2.5, "rank": 1}}, GOOD["logprobs"][1]], r"'logprob' 2\.5 > 0, not a log-probability"),
        ([{"7": {"logprob": -0.5, "rank": 0}}, GOOD["logprobs"][1]], r"rank 0, expected an int >= 1"),
        (GOOD["logprobs"][:1], r"is list of length 1, expected 2 entries"),
    ],
)
def test_parse_result_refuses_what_the_server_does_not_send(logprobs, pattern):
    assert parse_result(GOOD, want_logprobs=True).log_probs == [-0.5, -1.25]
    with pytest.raises(ArcticResponseError, match=pattern):
        parse_result({**GOOD, "logprobs": logprobs}, want_logprobs=True)


def test_an_unknown_logprobs_mode_fails_when_the_engines_start_and_the_pool_stays_taken(tiny_model_dir, loop):
    pool = CpuReplicaPool()
    cfg = build_model_config(tiny_model_dir, {"logprobs_mode": "processed"})
    with pytest.raises(ValueError, match=r"logprobs_mode='processed' is not a vLLM logprobs mode.*processed_logprobs"):
        loop.run_until_complete(pool.initialize(cfg))
    assert pool._config is cfg and pool.num_replicas == 0  # as ReplicaPool: the server then answers 409
    with pytest.raises(RuntimeError, match="Already initialized"):
        loop.run_until_complete(pool.initialize(build_model_config(tiny_model_dir, {})))


@pytest.mark.parametrize(
    "params, error, pattern",
    [
        ({"logprobs": 21}, ValueError, "greater than max allowed: 20"),
        ({"logprobs": -2}, ValueError, "non-negative or -1"),
        ({"min_p": 0.1}, ValueError, "does not implement it"),
        ({"prompt_logprobs": 1}, ValueError, "does not implement it"),
        ({"max_new_tokens": 4}, TypeError, "Unexpected keyword argument 'max_new_tokens'"),
    ],
)
def test_sampling_parameters_vllm_refuses_or_the_double_cannot_honour_are_refused(params, error, pattern):
    with pytest.raises(error, match=pattern):
        check_sampling_params(params)
    assert check_sampling_params({})["max_tokens"] == cpu_sampler.DEFAULT_MAX_TOKENS == 16  # vLLM's default
    assert check_sampling_params({"logprobs": False, "n": 1, "stop": []})["logprobs"] == 0  # vLLM: False is 0


@SLOW
def test_sleep_drains_the_request_in_flight_and_then_generate_fails(pool, loop):
    params = {"max_tokens": 48, "temperature": T, "logprobs": 0, "seed": 1}

    async def scenario():
        in_flight = asyncio.ensure_future(pool.generate([PROMPT], params))
        await asyncio.sleep(0)  # it is accepted and dispatched to the replica
        assert pool._inflight == 1 and not in_flight.done()

        async def sleeper():
            result = await pool.sleep(level=1)
            return result, in_flight.done()  # was the in-flight request answered before sleep returned?

        sleeping = asyncio.ensure_future(sleeper())
        await asyncio.sleep(0)  # sleep has paused the scheduler and waits for the drain
        with pytest.raises(RuntimeError, match="Scheduler is paused"):
            await pool.generate([PROMPT], params)
        slept, drained = await sleeping
        return slept, drained, await in_flight

    slept, drained, results = loop.run_until_complete(scenario())
    assert slept["status"] == "sleeping" and drained  # drained: the request finished first, not aborted
    assert len(results[0]["logprobs"]) == len(results[0]["token_ids"]) > 0
    with pytest.raises(RuntimeError, match="Model is sleeping"):
        loop.run_until_complete(pool.generate([PROMPT], params))
    assert loop.run_until_complete(pool.sleep())["status"] == "already_sleeping"
    assert loop.run_until_complete(pool.wake_up(tags=None))["status"] == "ready"


@SLOW
def test_wake_stages_follow_the_workers_state_machine(pool, loop, hf, tmp_path):
    import ray

    run = loop.run_until_complete
    worker = pool._workers[0]
    params = {"max_tokens": 3, "temperature": 0.0}
    awake(pool, loop)
    assert run(pool.wake_up(tags=["kv_cache"]))["status"] == "already_ready"  # an awake pool: nothing to do
    run(pool.sleep(level=1))
    with pytest.raises(RuntimeError, match=r"Cannot wake kv_cache only from sleeping; wake weights first"):
        run(pool.wake_up(tags=["kv_cache"]))
    assert pool.sleeping and ray.get(worker.get_state.remote()) == "sleeping"
    with pytest.raises(ValueError, match="wake_up tags"):
        run(pool.wake_up(tags=["weights", "cuda_graphs"]))

    model, _ = hf
    weights = tmp_path / "weights.pt"
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, weights)
    with pytest.raises(ray.exceptions.RayTaskError, match="cannot load weights into a sleeping replica"):
        ray.get(worker.load_weights_from_shm_path.remote(str(weights)))

    assert run(pool.wake_up(tags=["weights"]))["status"] == "weights_ready"  # the colocated weight-sync stage
    assert pool.sleeping and ray.get(worker.get_state.remote()) == "weights_ready"
    with pytest.raises(RuntimeError, match="Model is sleeping"):
        run(pool.generate([PROMPT], params))
    assert ray.get(worker.load_weights_from_shm_path.remote(str(weights)))["num_params"] > 0
    assert run(pool.wake_up(tags=["weights"]))["workers"] == [{"status": "already_weights_ready"}]
    assert run(pool.wake_up(tags=["kv_cache"]))["status"] == "ready"
    assert len(run(pool.generate([PROMPT], params))[0]["token_ids"]) > 0

    run(pool.sleep(level=2))  # level 2 forgets the weights: waking alone does not bring them back
    run(pool.wake_up(tags=None))
    with pytest.raises(ray.exceptions.RayTaskError, match="discarded by sleep\\(level=2\\)"):
        run(pool.generate([PROMPT], params))
    ray.get(worker.load_weights_from_shm_path.remote(str(weights)))
    assert len(run(pool.generate([PROMPT], params))[0]["token_ids"]) > 0


def test_parse_result_over_ray_takes_the_samplers_int_ids_and_refuses_json_strings():
    """Arctic's Ray server returns the sampler's result unserialized: token ids stay ints there."""
    over_ray = {
        "token_ids": [7, 9],
        "logprobs": [{7: {"logprob": -0.5, "rank": 1}}, {9: {"logprob": -1.25, "rank": 2}}],
    }
    assert parse_result(over_ray, want_logprobs=True, wire="ray").log_probs == [-0.5, -1.25]
    with pytest.raises(ArcticResponseError, match=r"str key '7'; token ids arrive as ints from Arctic's Ray server"):
        parse_result(GOOD, want_logprobs=True, wire="ray")
