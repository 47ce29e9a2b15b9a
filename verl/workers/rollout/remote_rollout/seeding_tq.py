"""Per-sample random streams for verl 0.9.1's V1 trainer, whose agent loop writes to TransferQueue.

The V1 agent loop (``AgentLoopWorkerTQ``) does not repeat a prompt ``rollout.n`` times: it runs
``n`` sessions of one prompt, numbered by ``session_id``, and all of them share one trajectory
record whose ``rollout_n`` is 0. Seeding by ``rollout_n`` (``seeding.py``'s worker) would give the
``n`` samples of a GRPO group one seed, hence one response and zero advantage; these classes seed
by ``session_id`` instead - the same number the legacy agent loop calls ``rollout_n``, so both
trainers give a sample the same seed. Importing this module needs verl 0.9.1 and TransferQueue.
"""

from __future__ import annotations

from typing import Any

import ray

from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.workers.rollout.remote_rollout.seeding import with_sample_seed

__all__ = ["seeded_worker_class", "SeededAgentLoopManagerTQ"]


def seeded_worker_class() -> type:
    """verl's TransferQueue agent-loop worker class, adding each sample's own ``seed`` to its
    sampling parameters (:func:`~.seeding.with_sample_seed` with the session's ``session_id`` as the
    rollout index).

    verl's class is reachable only through its ``ray.remote`` wrapper, so Ray ships it to the worker
    process by value, methods and all; a subclass importable by name would arrive by reference and
    extend verl's class as imported there, not the copy its shipped methods' ``super()`` refers to
    (``TypeError: super(type, obj)``). Built here, per call, the subclass travels by value with it."""

    class SeededAgentLoopWorkerTQ(AgentLoopWorkerTQ.__ray_actor_class__):
        async def _run_agent_loop(
            self, sampling_params: dict[str, Any], trajectory: dict[str, Any], **kwargs: Any
        ) -> Any:
            sampling_params = with_sample_seed(self.config, sampling_params, trajectory, kwargs.get("session_id", 0))
            return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)

    return SeededAgentLoopWorkerTQ


class SeededAgentLoopManagerTQ(AgentLoopManagerTQ):
    """verl's ``AgentLoopManagerTQ`` whose workers are :func:`seeded_worker_class`'s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # sets verl's worker class; the workers start in create()
        self.agent_loop_workers_class = ray.remote(seeded_worker_class())
