"""The local engine actor runs all of its torch work on one thread: the one that built the engine."""

from __future__ import annotations

import asyncio
import threading

import torch
from local_backend_helpers import dense_rollout_batch, main_config, random_rollouts, to_no_padding
from support.aio import run_async as run

TEST_TIER = "integration"  # starts Ray, a server, an engine or a model (tiers: tests/conftest.py)

ENGINE_CALLS = ("compute_log_prob", "update_actor", "decode_step", "sync_sampler_weights", "save_checkpoint")


def _update_batch():
    prompts, responses = random_rollouts(4, seed=3)
    dense = dense_rollout_batch(prompts, responses)
    mask = dense["response_mask"].float()
    dense["old_log_probs"] = -6.2 * mask
    dense["advantages"] = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * mask  # rewards that vary
    return to_no_padding(
        dense,
        mini_batch_size=4,
        global_batch_size=4,
        epochs=1,
        seed=0,
        dataloader_kwargs={"shuffle": False},
        calculate_entropy=False,
        temperature=1.0,
    )


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
            _update_batch(), actor_config=cfg.actor_rollout_ref.actor, temperature=1.0
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
