"""``bench-null``: a backend whose compute is trivial, so a benchmark measures transport only.

It is the ``local`` backend's client (:class:`LocalBackend`: the same Ray calls,
field selection and error handling) in front of :class:`NullEngineActor`, a Ray
actor with the engine actor's method signatures that answers every call with
zeros of the contract's layout instead of running a model. Timing the forwarder
against it measures exactly what the plugin adds: dispatch, serialisation,
the hop through the forwarder worker and the result conversion.

Registered the documented way (``@RemoteBackendRegistry.register``); Ray worker
processes find it through verl's hook ``VERL_USE_EXTERNAL_MODULES=benchmarks.null_backend``
with the repository root on ``PYTHONPATH`` (:func:`worker_env` gives both).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

import torch

from verl.remote_backend.registry import RemoteBackendRegistry
from verl.remote_backend.results import BackendDevice, GenerateResult, LogProbResult, UpdateResult
from verl.workers.remote_client.local.backend import LocalBackend
from verl.workers.remote_client.local.transport import LogProbWire

__all__ = ["NAME", "NullBackend", "NullEngineActor", "worker_env"]

NAME = "bench-null"
_REPO_ROOT = Path(__file__).resolve().parents[1]


def worker_env() -> dict[str, str]:
    """Environment that makes every Ray worker import this module (for ``runtime_env.env_vars``)."""
    path = os.pathsep.join(filter(None, [str(_REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {"VERL_USE_EXTERNAL_MODULES": __name__, "PYTHONPATH": path}


def _tokens(data: Any) -> int:
    return int(data["input_ids"].values().shape[0])


_DEVICE = BackendDevice("cpu", 1)


class NullEngineActor:
    """Stand-in for the local engine's Ray actor: same methods, zero compute.

    Every data-path answer carries ``compute_s`` (the seconds spent
    inside the method), as a real backend reports its compute time.
    """

    async def info(self) -> dict[str, Any]:
        return {"model_path": None, "device": _DEVICE.to_dict(), "pid": os.getpid()}

    async def compute_log_prob(
        self, data: Any, *, ref: bool, calculate_entropy: bool, temperature: float
    ) -> LogProbWire:
        start = time.perf_counter()
        total = _tokens(data)
        entropy = torch.zeros(total) if calculate_entropy else None
        result = LogProbResult(torch.zeros(total), entropy, device=_DEVICE, compute_s=time.perf_counter() - start)
        return LogProbWire.of(result)  # the engine actor's wire format (local/transport.py)

    async def update_actor(self, data: Any, *, actor_config: Any, temperature: float) -> UpdateResult:
        start = time.perf_counter()
        lengths = data["input_ids"].offsets().diff().tolist()
        return UpdateResult(
            metrics={"pg_loss": [0.0], "grad_norm": 0.0},
            loss=0.0,
            global_token_num=lengths,
            device=_DEVICE,
            compute_s=time.perf_counter() - start,
        )

    async def update_weights(self) -> dict:
        return {"policy_version": 0}

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> GenerateResult:
        return GenerateResult(token_ids=[])

    async def save_checkpoint(self, path: str, step: Optional[int]) -> str:
        return path

    async def load_checkpoint(self, path: str, step: Optional[int]) -> dict:
        return {"step": step}


@RemoteBackendRegistry.register(NAME)
class NullBackend(LocalBackend):
    """The local backend's client driving a :class:`NullEngineActor` (see the module docstring)."""

    @classmethod
    def from_config(cls, main_config: Any, *, handle: Optional[dict[str, Any]] = None) -> "NullBackend":
        if handle is not None:  # re-attach: exactly the local backend's handle format
            return super().from_config(main_config, handle=handle)
        import ray

        actor = ray.remote(NullEngineActor).options(num_cpus=0, max_concurrency=1000).remote()
        return cls(actor, owner=True, info=ray.get(actor.info.remote()))

    @property
    def actor(self) -> Any:
        """The engine actor's handle: the benchmark's direct-call baseline talks to it."""
        return self._live()
