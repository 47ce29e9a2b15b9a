"""The local engine actor runs all of its torch work on one thread, the one that built the engine,
and hands freed memory back at its ``heap_keep_free_gib`` after each call."""

from __future__ import annotations

import asyncio
import threading

from support.aio import run_async as run
from support.local_backend_helpers import (
    dense_rollout_batch,
    main_config,
    random_rollouts,
    random_update_batch,
    to_no_padding,
)

ENGINE_CALLS = ("compute_log_prob", "update_actor", "decode_step", "sync_sampler_weights", "save_checkpoint")


def test_every_torch_call_of_the_engine_actor_runs_on_the_thread_that_built_the_engine(
    tiny_model_dir, tmp_path, monkeypatch
):
    """torch's OpenMP runtime gives each thread that computes its own team of workers, and more
    teams than cores slowed an update of the main job's shape by 17 % (``EngineActor._compute``): the
    engine's construction, sampling, log-probs, update, weight sync and checkpoint all run on
    one thread, and never on the event loop's."""
    from verl.workers.remote_client.local import actor as actor_module
    from verl.workers.remote_client.local.config import EngineSettings
    from verl.workers.remote_client.local.engine import LocalEngine

    seen: dict[str, set[int]] = {}

    def record(name: str) -> None:
        seen.setdefault(name, set()).add(threading.get_ident())

    class RecordingEngine(LocalEngine):
        def __init__(self, settings):
            record("__init__")
            super().__init__(settings)

    for name in ENGINE_CALLS:

        def recorded(self, *args, _name=name, **kwargs):
            record(_name)
            return getattr(LocalEngine, _name)(self, *args, **kwargs)

        setattr(RecordingEngine, name, recorded)
    monkeypatch.setattr(actor_module, "LocalEngine", RecordingEngine)

    cfg = main_config(tiny_model_dir, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2)
    engine_actor = actor_module.EngineActor(EngineSettings.from_main_config(cfg))
    assert engine_actor.init_error is None, engine_actor.init_error
    prompts, responses = random_rollouts(3, seed=5)
    log_prob_batch = to_no_padding(dense_rollout_batch(prompts, responses), calculate_entropy=True)

    async def every_call() -> int:
        params = {"max_tokens": 4, "temperature": 1.0, "logprobs": True}
        results = await asyncio.gather(*[engine_actor.generate([5, 6, 7, i + 3], params) for i in range(3)])
        assert all(1 <= len(r.token_ids) <= 4 for r in results)
        await engine_actor.compute_log_prob(log_prob_batch, ref=False, calculate_entropy=True, temperature=1.0)
        update = await engine_actor.update_actor(
            random_update_batch(4, seed=3, mini_batch_size=4, advantages=[1.0, -1.0, 0.5, -0.5]),
            actor_config=cfg.actor_rollout_ref.actor,
            temperature=1.0,
        )
        assert len(update.metrics["grad_norm"]) == 1 and update.loss != 0.0  # one optimizer step over 4 rows
        await engine_actor.update_weights()
        await engine_actor.save_checkpoint(str(tmp_path / "ckpt"), 1)
        return threading.get_ident()

    event_loop_thread = run(every_call(), cap_s=120)
    assert set(seen) == {"__init__", *ENGINE_CALLS}, sorted(seen)
    threads = set().union(*seen.values())
    assert len(threads) == 1, {name: sorted(ids) for name, ids in seen.items()}
    assert event_loop_thread not in threads


def test_the_engine_actor_hands_freed_memory_back_only_above_its_heap_keep_free_setting(tiny_model_dir, monkeypatch):
    """``remote_backend.local.heap_keep_free_gib`` is the threshold of every trim the actor makes:
    after a log-prob call, an update, and when its decode batch empties."""
    from omegaconf import open_dict

    from verl.workers.remote_client.local import actor as actor_module
    from verl.workers.remote_client.local.config import EngineSettings

    thresholds: list[int] = []
    monkeypatch.setattr(actor_module, "release_freed_memory", lambda keep: thresholds.append(keep) or False)
    cfg = main_config(tiny_model_dir, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2)
    with open_dict(cfg):
        cfg.remote_backend.local.heap_keep_free_gib = 0.5
    engine_actor = actor_module.EngineActor(EngineSettings.from_main_config(cfg))
    assert engine_actor.init_error is None, engine_actor.init_error
    prompts, responses = random_rollouts(3, seed=5)

    async def calls() -> None:
        await engine_actor.generate([5, 6, 7], {"max_tokens": 3, "temperature": 1.0})
        await engine_actor.compute_log_prob(
            to_no_padding(dense_rollout_batch(prompts, responses)), ref=False, calculate_entropy=False, temperature=1.0
        )
        await engine_actor.update_actor(
            random_update_batch(4, seed=3, mini_batch_size=4), actor_config=cfg.actor_rollout_ref.actor, temperature=1.0
        )

    run(calls(), cap_s=120)
    assert len(thresholds) >= 3 and set(thresholds) == {1 << 29}, thresholds
