"""Per-sample random streams for rollouts: same seeds -> same samples, whatever the arrival order.

verl's agent loop sends rollout requests with no seed, so a sampler serving concurrent requests
from one random generator gives results that depend on arrival order and batching. This module
seeds every sample from the run seed and the sample's identity, so that backends honouring
``sampling_params["seed"]`` make two runs with the same seeds, and a resumed run, sample alike.
"""

from __future__ import annotations

import hashlib
from typing import Any

import ray

from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker

__all__ = ["run_seed", "sample_seed", "SeededAgentLoopWorker", "SeededAgentLoopManager", "MANAGER_FQN"]

MANAGER_FQN = f"{__name__}.SeededAgentLoopManager"


def run_seed(config: Any) -> int:
    """The run's sampling seed: ``data.seed`` when set, else ``actor_rollout_ref.actor.data_loader_seed`` (42)."""
    from verl.remote_backend.settings.loader import select

    seed = select(config, "data.seed")
    if seed is None:
        seed = select(config, "actor_rollout_ref.actor.data_loader_seed", 42)
    return int(seed)


def sample_seed(seed: int, step: Any, sample_index: Any, rollout_n: Any, validate: Any) -> int:
    """A stable 63-bit seed for one sample (same inputs -> same seed on every machine and run)."""
    key = repr((int(seed), int(step), str(sample_index), int(rollout_n), bool(validate))).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


class SeededAgentLoopWorker(AgentLoopWorker):
    """verl's agent-loop worker, adding each sample's own ``seed`` to its sampling parameters.

    The seed is :func:`sample_seed` of the run seed and the sample's identity (training step,
    dataset index, rollout index within the prompt's group, validation or not); a ``seed``
    already in the sampling parameters is kept."""

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], **kwargs: Any) -> Any:
        if sampling_params.get("seed") is None:
            seed = sample_seed(
                run_seed(self.config), trajectory["step"], trajectory["sample_index"], trajectory["rollout_n"],
                trajectory.get("validate", False),
            )  # fmt: skip
            sampling_params = {**sampling_params, "seed": seed}
        return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)


class SeededAgentLoopManager(AgentLoopManager):
    """verl's ``AgentLoopManager`` whose workers are :class:`SeededAgentLoopWorker`."""

    agent_loop_workers_class = ray.remote(SeededAgentLoopWorker)
