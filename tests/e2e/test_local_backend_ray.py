"""``LocalBackend`` through its real Ray actor: the contract end to end, re-attach, destroy."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from support.aio import run_async as run
from support.local_backend_helpers import (
    dense_rollout_batch,
    engine_info,
    main_config,
    random_rollouts,
    random_update_batch,
    to_no_padding,
)

from verl.remote_backend.errors import BackendClosedError

pytestmark = pytest.mark.slow

#: not the default (4), so the malloc test sees the setting reach the engine's process
HEAP_KEEP_FREE_GIB = 0.75


@pytest.fixture(scope="module")
def cfg(tiny_model_dir):
    from omegaconf import open_dict

    cfg = main_config(tiny_model_dir, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, use_kl_loss=True)
    with open_dict(cfg):
        cfg.remote_backend.local.heap_keep_free_gib = HEAP_KEEP_FREE_GIB
    return cfg


@pytest.fixture(scope="module")
def backend(ray_session, cfg):
    from verl.remote_backend.registry import RemoteBackendRegistry

    b = RemoteBackendRegistry.create("local", cfg)
    yield b
    asyncio.run(b.destroy())


def test_contract_ops_through_the_ray_actor(backend, cfg, tiny_model_dir):
    from support.local_backend_helpers import engine_settings

    from verl.remote_backend.base import supports_resume
    from verl.workers.remote_client.local.engine import LocalEngine

    assert backend.requires_single_forwarder() is True
    assert supports_resume(backend)
    prompts, responses = random_rollouts(5, seed=4)
    td = to_no_padding(dense_rollout_batch(prompts, responses), calculate_entropy=True)

    out = run(
        backend.compute_log_prob(td, ref=False, calculate_entropy=True, rollout_n=1, temperature=1.0, pad_token_id=0)
    )
    local = LocalEngine(engine_settings(tiny_model_dir)).log_probs(td, calculate_entropy=True)
    torch.testing.assert_close(out.log_probs, local["log_probs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(out.entropy, local["entropy"], atol=1e-5, rtol=0)
    assert out.device.type == "cpu" and out.compute_s > 0
    ref = run(
        backend.compute_log_prob(td, ref=True, calculate_entropy=False, rollout_n=1, temperature=1.0, pad_token_id=0)
    )
    assert ref.entropy is None

    batch = random_update_batch(8, seed=0, mini_batch_size=4, with_ref=True)
    # actor_config as verl's worker passes it: the DictConfig block
    upd = run(
        backend.update_actor(
            batch, actor_config=cfg.actor_rollout_ref.actor, pad_token_id=0, rollout_n=1, temperature=1.0
        )
    )
    assert isinstance(upd.loss, float)
    assert {"pg_loss", "pg_clipfrac", "ppo_kl", "grad_norm", "lr", "entropy", "kl_loss"} <= set(upd.metrics)
    for key, val in upd.metrics.items():
        assert isinstance(val, float) or all(isinstance(v, float) for v in val), key
    assert len(upd.metrics["grad_norm"]) == 2
    assert upd.global_token_num == batch["input_ids"].offsets().diff().tolist()
    assert upd.device.count == 1

    version = run(backend.update_weights())["policy_version"]
    assert run(backend.update_weights())["policy_version"] == version + 1


def test_concurrent_generate_requests_are_batched(backend):
    params = {"max_tokens": 12, "temperature": 1.0, "top_p": 0.95, "logprobs": True}

    async def burst():
        before = (await engine_info(backend))["batches_run"]
        results = await asyncio.gather(*[backend.generate([5, 6, 7, i + 3], params) for i in range(64)])
        after = (await engine_info(backend))["batches_run"]
        return results, after - before

    results, batches = run(burst())
    assert len(results) == 64 and batches <= 8, f"64 concurrent requests took {batches} batches"
    for res in results:
        assert 1 <= len(res.token_ids) <= 12 and len(res.log_probs) == len(res.token_ids)
        assert res.stop_reason == "completed"


def test_samples_of_one_prompt_in_a_burst_are_prefilled_once_and_the_next_update_reports_it(backend, cfg):
    params = {"max_tokens": 4, "temperature": 1.0}
    prompts = [[9, 8, 7, p] for p in range(4) for _ in range(4)]  # 4 prompts x 4 samples, as verl repeats them

    async def burst():
        before = await engine_info(backend)
        await asyncio.gather(*[backend.generate(prompt, params) for prompt in prompts])
        after = await engine_info(backend)
        return {k: after[k] - before[k] for k in ("batches_run", "prefill_tokens", "prefill_rows_shared")}

    delta = run(burst())
    # an admission holds at most the 4 distinct prompts: every other row reuses a prefill
    assert delta["prefill_rows_shared"] >= len(prompts) - 4 * delta["batches_run"] > 0, delta
    assert delta["prefill_tokens"] == 4 * (len(prompts) - delta["prefill_rows_shared"]), delta
    # the update reports the sampler's prefill work since the previous update (this burst included)
    upd = run(
        backend.update_actor(
            random_update_batch(8, seed=0, mini_batch_size=4, with_ref=True),
            actor_config=cfg.actor_rollout_ref.actor,
            pad_token_id=0,
            rollout_n=1,
            temperature=1.0,
        )
    )
    assert upd.metrics["sampler_rows_sharing_a_prefill"] >= delta["prefill_rows_shared"]
    assert upd.metrics["sampler_prefill_tokens"] >= delta["prefill_tokens"]
    again = run(
        backend.update_actor(
            random_update_batch(8, seed=0, mini_batch_size=4, with_ref=True),
            actor_config=cfg.actor_rollout_ref.actor,
            pad_token_id=0,
            rollout_n=1,
            temperature=1.0,
        )
    )
    assert again.metrics["sampler_prefill_tokens"] == again.metrics["sampler_rows_sharing_a_prefill"] == 0.0


def test_invalid_generate_input_raises_value_error_through_ray(backend):
    with pytest.raises(ValueError, match="temperature"):
        run(backend.generate([1, 2], {"max_tokens": 3, "temperature": -1}))
    with pytest.raises(ValueError, match="longer than the model context"):
        run(backend.generate([5] * 5000, {"max_tokens": 3}))


def test_save_and_load_checkpoint_through_ray(backend, tmp_path):
    path = str(tmp_path / "global_step_2" / "actor")
    assert run(backend.save_checkpoint(path, 2)) == path
    run(backend.load_checkpoint(path, 2))
    assert run(engine_info(backend))["global_step"] == 2


def test_reattach_from_another_process_uses_the_same_engine_and_never_kills_it(backend, cfg):
    import ray

    from verl.workers.remote_client.local.backend import LocalBackend

    handle = backend.reconnect_handle()
    engine_pid = run(engine_info(backend))["pid"]

    @ray.remote(num_cpus=0)
    def attached_client(handle, cfg):
        import asyncio
        import os

        attached = LocalBackend.from_config(cfg, handle=handle)
        info = ray.get(attached.reconnect_handle()["actor"].info.remote())  # the engine it reached
        out = asyncio.run(attached.generate([5, 6, 7], {"max_tokens": 4, "temperature": 0}))
        asyncio.run(attached.destroy())
        asyncio.run(attached.destroy())
        return os.getpid(), info["pid"], out.token_ids

    client_pid, seen_pid, tokens = ray.get(attached_client.remote(handle, cfg))
    assert client_pid != engine_pid and seen_pid == engine_pid and len(tokens) <= 4
    assert run(engine_info(backend))["pid"] == engine_pid  # still alive after the attached destroy


def test_owner_destroy_is_idempotent_and_stops_the_engine(ray_session, cfg):
    import ray

    from verl.workers.remote_client.local.backend import LocalBackend

    b = LocalBackend.from_config(cfg)
    actor = b.reconnect_handle()["actor"]
    assert ray.get(actor.info.remote())["pid"]
    asyncio.run(b.destroy())
    asyncio.run(b.destroy())
    # ray.kill is asynchronous: a call sent right after it may still be served, so poll until the
    # actor is gone (a live actor keeps answering and the deadline fails the test).
    deadline = time.monotonic() + 60
    with pytest.raises(ray.exceptions.RayActorError):
        while time.monotonic() < deadline:
            ray.get(actor.info.remote(), timeout=60)
            time.sleep(0.2)
    with pytest.raises(BackendClosedError, match="destroyed"):
        run(b.update_weights())


def test_weight_sync_waits_for_in_flight_requests_and_admits_the_rest_after(backend):
    params = {"max_tokens": 20, "temperature": 0}

    async def mixed():
        before = (await engine_info(backend))["policy_version"]
        first = [asyncio.ensure_future(backend.generate([9, 8, 7, i + 3], params)) for i in range(8)]
        await asyncio.sleep(0.05)
        sync = asyncio.ensure_future(backend.update_weights())
        later = [asyncio.ensure_future(backend.generate([4, 5, i + 3], params)) for i in range(8)]
        results = await asyncio.gather(*first, sync, *later)
        return before, results

    before, results = run(mixed())
    assert results[8]["policy_version"] == before + 1
    assert all(len(r.token_ids) <= 20 for r in results[:8] + results[9:])


def test_engine_start_failure_surfaces_the_engine_error(ray_session, tiny_model_dir, tmp_path):
    """A model that fails to load inside the actor raises the engine's ConfigError, not Ray's 'actor died'."""
    import shutil

    from omegaconf import OmegaConf

    from verl.remote_backend.errors import ConfigError
    from verl.workers.remote_client.local.backend import LocalBackend

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"junk")
    cfg = OmegaConf.create({"actor_rollout_ref": {"model": {"path": str(broken)}, "actor": {"optim": {"lr": 1e-3}}}})
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path.*not a loadable"):
        LocalBackend.from_config(cfg)


@pytest.mark.parametrize("threads", [None, 1])
def test_the_engine_reports_the_threads_it_was_sized_to(backend, cfg, threads):
    """``remote_backend.local.threads`` reaches the engine's process: null = every core it may run
    on (its CPU affinity), a number = that many. (The speed effect is measured on the main job,
    not timed here.)"""
    import copy
    import os

    from omegaconf import open_dict

    from verl.remote_backend.registry import RemoteBackendRegistry

    own = None
    if threads is not None:
        sized = copy.deepcopy(cfg)
        with open_dict(sized):
            sized.remote_backend.local.threads = threads
        own = RemoteBackendRegistry.create("local", sized)
    try:
        info = run(engine_info(own or backend))
        assert info["threads"] == (threads or len(os.sched_getaffinity(0)))
    finally:
        if own is not None:
            run(own.destroy())


def test_the_engine_process_starts_with_the_malloc_settings_and_keeps_the_callers_own(backend, monkeypatch):
    """glibc reads ``MALLOC_*`` only when a process starts, so Ray must start the engine's process
    with them (``ENGINE_MALLOC_ENV``, the trim threshold at ``heap_keep_free_gib``; the memory they
    save is measured on the main job, not here); a value the caller's environment already sets wins."""
    import os
    from pathlib import Path

    from verl.workers.remote_client.local.malloc import ENGINE_MALLOC_ENV, engine_malloc_env

    info = run(engine_info(backend))
    raw = Path(f"/proc/{info['pid']}/environ").read_bytes().decode(errors="replace")
    env = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
    expected = {**ENGINE_MALLOC_ENV, "MALLOC_TRIM_THRESHOLD_": str(int(HEAP_KEEP_FREE_GIB * (1 << 30)))}
    for key, value in expected.items():
        assert env.get(key) == os.environ.get(key, value), (key, env.get(key))
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert "MALLOC_ARENA_MAX" not in engine_malloc_env()
    assert engine_malloc_env()["MALLOC_MMAP_MAX_"] == ENGINE_MALLOC_ENV["MALLOC_MMAP_MAX_"]
