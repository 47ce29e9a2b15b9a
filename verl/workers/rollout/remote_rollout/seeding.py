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

__all__ = [
    "run_seed",
    "sample_seed",
    "with_sample_seed",
    "SeededAgentLoopWorker",
    "SeededAgentLoopManager",
    "MANAGER_FQN",
    "MANAGER_TQ_FQN",
]

MANAGER_FQN = f"{__name__}.SeededAgentLoopManager"
#: The same for verl 0.9.1's V1 trainer (its agent loop writes to TransferQueue; ``seeding_tq.py``).
MANAGER_TQ_FQN = f"{__name__}_tq.SeededAgentLoopManagerTQ"


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


def with_sample_seed(
    config: Any, sampling_params: dict[str, Any], trajectory: dict[str, Any], rollout_index: Any
) -> dict[str, Any]:
    """``sampling_params`` plus the sample's own ``seed``: :func:`sample_seed` of the run seed and the
    sample's identity (``trajectory``'s training step, dataset index and validation flag, and its
    ``rollout_index`` within the prompt's group). A ``seed`` already there is kept (same dict)."""
    if sampling_params.get("seed") is not None:
        return sampling_params
    seed = sample_seed(
        run_seed(config), trajectory["step"], trajectory["sample_index"], rollout_index,
        trajectory.get("validate", False),
    )  # fmt: skip
    return {**sampling_params, "seed": seed}


class SeededAgentLoopWorker(AgentLoopWorker):
    """verl's agent-loop worker, adding each sample's own ``seed`` to its sampling parameters
    (:func:`with_sample_seed`; the rollout index is the trajectory's ``rollout_n``: verl's agent loop
    repeats each prompt ``rollout.n`` times and numbers the copies)."""

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], **kwargs: Any) -> Any:
        sampling_params = with_sample_seed(self.config, sampling_params, trajectory, trajectory["rollout_n"])
        return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)


class SeededAgentLoopManager(AgentLoopManager):
    """verl's ``AgentLoopManager`` whose workers are :class:`SeededAgentLoopWorker`."""

    agent_loop_workers_class = ray.remote(SeededAgentLoopWorker)
