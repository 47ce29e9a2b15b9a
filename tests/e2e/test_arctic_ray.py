"""``remote_backend.arctic.protocol=ray``: the adapter on Arctic's own in-process Ray server, on CPU.

The owner builds arctic-platform's ``AsyncArcticRLClient`` with ``protocol="ray"``; its
``RayTransport`` starts ``ArcticRLRayServerState`` in this test's Ray cluster, which creates the
jobs, Arctic's ``DeepSpeedWorker`` actors (the stand-in's ``CpuDeepSpeedWorker``: the real
``initialize`` and DeepSpeed engine on CPU) in its colocated placement groups, and the replica
pool (the stand-in's CPU double), and wraps it in ``ArcticRLRayServer``. The cluster declares
logical GPUs and patches Arctic's Ray server module in each worker (``arctic_standin/ray_setup.py``).
The HTTP side of the parity test is the session's stand-in HTTP server (Arctic's FastAPI app).
"""

from __future__ import annotations

import os
import pickle
import sys
import time

import pytest
import torch
from arctic_standin.harness import FOUR_ROWS, compose_config, make_batch
from arctic_standin.ray_setup import own_ray_cluster
from support.aio import run_async

pytestmark = pytest.mark.slow

TEMPERATURE = 0.7


def run(coro):
    return run_async(coro, cap_s=300)


@pytest.fixture(scope="module")
def ray_cluster():
    with own_ray_cluster(logical_gpus=1) as ray:
        yield ray


def _cfg(model, root, port, protocol, *extra):
    return compose_config(
        model,
        str(root / protocol / "ckpt"),
        port,
        [
            f"remote_backend.arctic.protocol={protocol}",
            "remote_backend.arctic.seed=7",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            *extra,
        ],
    )


def _batch(tok, seed=0):
    from verl.utils import tensordict_utils as tu

    data = make_batch(
        **FOUR_ROWS,
        vocab=len(tok),
        pad_token_id=tok.pad_token_id,
        seed=seed,
        with_update_fields=True,
    )
    tu.assign_non_tensor(data, mini_batch_size=4, epochs=1, seed=0, dataloader_kwargs={"shuffle": False})
    return data


def _log_probs(backend, data, tok):
    out = run(
        backend.compute_log_prob(
            data.copy(), ref=False, calculate_entropy=True, rollout_n=2, temperature=TEMPERATURE,
            pad_token_id=tok.pad_token_id,
        )
    )  # fmt: skip
    return out


def _update(backend, data, tok, cfg):
    from verl.utils.config import omega_conf_to_dataclass

    return run(
        backend.update_actor(
            data.copy(),
            actor_config=omega_conf_to_dataclass(cfg.actor_rollout_ref.actor),
            pad_token_id=tok.pad_token_id,
            rollout_n=2,
            temperature=TEMPERATURE,
        )
    )


PROMPT = "Count: one two"
SAMPLING = {"max_tokens": 6, "temperature": 1.0, "seed": 11, "logprobs": True}


def _basic_ops(backend, cfg, tok, root):
    """compute_log_prob, update_actor, update_weights, generate, save, another update, load: the results."""
    data = _batch(tok)
    out = {"lp0": _log_probs(backend, data, tok)}
    out["update"] = _update(backend, data, tok, cfg)
    out["lp1"] = _log_probs(backend, data, tok)
    out["version"] = run(backend.update_weights())
    out["generate"] = run(backend.generate(tok(PROMPT)["input_ids"], dict(SAMPLING)))
    actor_dir = str(root / "global_step_1" / "actor")
    os.makedirs(actor_dir, exist_ok=True)
    out["saved"] = run(backend.save_checkpoint(actor_dir, 1))
    out["update2"] = _update(backend, _batch(tok, seed=5), tok, cfg)
    out["lp_moved"] = _log_probs(backend, data, tok)
    run(backend.load_checkpoint(actor_dir, 1))
    out["lp_restored"] = _log_probs(backend, data, tok)
    out["generate_restored"] = run(backend.generate(tok(PROMPT)["input_ids"], dict(SAMPLING)))
    return out


def _max_diff(a, b):
    return float((a - b).abs().max())


def test_basic_ops_over_ray_equal_the_http_path_on_the_same_batch_and_seed(
    ray_cluster, standin_server, tiny_model_dir, tmp_path
):
    from transformers import AutoTokenizer

    from verl.remote_backend import RemoteBackendRegistry

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    results = {}
    for protocol in ("http", "ray"):
        cfg = _cfg(tiny_model_dir, tmp_path, standin_server.port, protocol)
        backend = RemoteBackendRegistry.create("arctic", cfg)
        try:
            if protocol == "ray":
                assert backend._ray_state is not None and "ArcticRLRayServerState" in backend._address
            results[protocol] = _basic_ops(backend, cfg, tok, tmp_path / protocol / "ckpt")
        finally:
            run(backend.destroy())
    http, ray_ = results["http"], results["ray"]
    diffs = {
        "log_probs before update": _max_diff(http["lp0"].log_probs, ray_["lp0"].log_probs),
        "entropy before update": _max_diff(http["lp0"].entropy, ray_["lp0"].entropy),
        "log_probs after update": _max_diff(http["lp1"].log_probs, ray_["lp1"].log_probs),
        "log_probs after load": _max_diff(http["lp_restored"].log_probs, ray_["lp_restored"].log_probs),
        "update loss": abs(http["update"].loss - ray_["update"].loss),
        "generate log_probs": _max_diff(
            torch.tensor(http["generate"].log_probs), torch.tensor(ray_["generate"].log_probs)
        ),
    }
    print("\nparity http vs ray (max abs diff):", {k: f"{v:.3e}" for k, v in diffs.items()})
    print("update loss http/ray:", http["update"].loss, ray_["update"].loss)
    print("grad_norm http/ray:", http["update"].metrics.get("grad_norm"), ray_["update"].metrics.get("grad_norm"))
    assert all(v <= 1e-6 for v in diffs.values()), diffs
    assert http["update"].metrics.keys() == ray_["update"].metrics.keys()
    for key, value in http["update"].metrics.items():
        assert torch.allclose(torch.tensor(value, dtype=torch.float64), torch.tensor(ray_["update"].metrics[key],
                              dtype=torch.float64), rtol=1e-6, atol=1e-7), key  # fmt: skip
    assert http["generate"].token_ids == ray_["generate"].token_ids
    assert http["version"] == ray_["version"] == {"policy_version": 1}
    for out in (http, ray_):
        assert out["saved"].endswith(os.path.join("global_step_1", "actor", "checkpoint-1"))
        assert _max_diff(out["lp_moved"].log_probs, out["lp1"].log_probs) > 1e-4  # the second update moved it
        assert torch.equal(out["lp_restored"].log_probs, out["lp1"].log_probs)  # load restored step 1
        assert out["generate_restored"].token_ids == out["generate"].token_ids  # and synced the sampler
    # the owner's destroy ended Arctic's state actor and freed its placement groups' GPUs
    import ray

    deadline = time.monotonic() + 30  # Ray returns a removed group's resources asynchronously
    while ray.available_resources().get("GPU", 0) != ray.cluster_resources().get("GPU") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("GPU", 0) == ray.cluster_resources().get("GPU")


@pytest.fixture(scope="module")
def owner(ray_cluster, tiny_model_dir, tmp_path_factory):
    from verl.remote_backend import RemoteBackendRegistry

    root = tmp_path_factory.mktemp("arctic_ray")
    cfg = _cfg(tiny_model_dir, root, 8000, "ray")
    backend = RemoteBackendRegistry.create("arctic", cfg)
    try:
        yield {"backend": backend, "cfg": cfg, "root": root}
    finally:
        run(backend.destroy())


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _attached_ops(cfg, handle, model_dir):
    """In another Ray worker process: re-attach with the handle, run ops, detach; returns what it saw."""
    from transformers import AutoTokenizer

    from verl.remote_backend import RemoteBackendRegistry

    tok = AutoTokenizer.from_pretrained(model_dir)
    backend = RemoteBackendRegistry.get("arctic").from_config(cfg, handle=handle)
    try:
        lp = _log_probs(backend, _batch(tok, seed=2), tok)
        gen = run(backend.generate(tok(PROMPT)["input_ids"], dict(SAMPLING)))
        return {"pid": os.getpid(), "log_probs": lp.log_probs.numpy(), "tokens": gen.token_ids,
                "owner": backend._owner, "handle_keys": sorted(backend.reconnect_handle())}  # fmt: skip
    finally:
        run(backend.destroy())
        run(backend.destroy())  # idempotent


def test_reattach_from_another_ray_worker_process_runs_ops_and_never_destroys_the_shared_server(owner, tok):
    import ray

    backend = owner["backend"]
    handle = backend.reconnect_handle()
    assert set(handle) == {"backend", "client_config", "server_log", "server_state"}
    state = handle["server_state"]
    assert type(pickle.loads(pickle.dumps(handle))["server_state"]).__name__ == "ActorHandle"
    jobs_before = ray.get(state.get_jobs.remote())
    model = owner["cfg"].actor_rollout_ref.model.path
    # this module is not importable in Ray's workers (its folder is not on their path): ship it by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    seen = ray.get(ray.remote(num_cpus=0)(_attached_ops).remote(owner["cfg"], handle, model))
    assert seen["pid"] != os.getpid() and seen["owner"] is False
    assert "server_state" in seen["handle_keys"]
    mine = _log_probs(backend, _batch(tok, seed=2), tok).log_probs
    assert torch.equal(torch.from_numpy(seen["log_probs"].copy()), mine)
    assert len(seen["tokens"]) >= 1
    # the re-attached client's destroy left the jobs, the workers and the state actor alone
    assert ray.get(state.get_jobs.remote()) == jobs_before
    assert _log_probs(backend, _batch(tok, seed=2), tok).log_probs.shape == mine.shape


def test_colocated_wake_and_weight_sync_empty_the_training_cache_on_arctics_ray_server(owner, tok):
    """Arctic's state actor empties the training workers' cache before every wake (the adapter adds no call)."""
    import ray

    backend = owner["backend"]
    workers = ray.get(backend._ray_state.get_training_workers.remote())

    def emptied():
        return sum(ray.get(w.standin_calls.remote()).get("empty_cache", 0) for w in workers)

    _log_probs(backend, _batch(tok, seed=8), tok)  # colocated: the sampler goes to sleep
    before = emptied()
    run(backend.update_weights())  # wake(weights) -> sync (its own wake) -> wake(kv_cache)
    after_sync = emptied()
    assert after_sync >= before + 1
    _log_probs(backend, _batch(tok, seed=8), tok)  # asleep again
    run(backend.generate(tok(PROMPT)["input_ids"], dict(SAMPLING)))  # wakes it
    assert emptied() >= after_sync + 1


def test_health_and_log_location_name_arctics_state_actor(owner):
    backend = owner["backend"]
    run(backend.health())
    where = backend.log_location()
    assert "ArcticRLRayServerState" in where and "logs" in where
