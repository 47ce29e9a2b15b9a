"""The test suite's one contract double: a complete ``RemoteBackend`` with no engine behind it.

Answers at once with deterministic, typed results; what a test needs to vary is a class
attribute, set on a subclass made by :meth:`StubBackend.variant`. Every call is recorded in
``calls`` (``(op, payload)``), and ``SCRIPT`` injects a fault per op (see :func:`corrupt`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, ClassVar, Optional

import torch

from verl.remote_backend import GenerateResult, LogProbResult, RemoteBackend, UpdateResult
from verl.remote_backend.batch_ref import BatchRef
from verl.remote_backend.results import BackendDevice

__all__ = ["StubBackend", "corrupt"]


def corrupt(op: str, fault: str, result: Any, *, vocab_size: int = 512) -> Any:
    """``result`` of ``op`` with an output fault: ``wrong_shape`` (one log-prob short), ``nan``
    (a NaN at packed index 3), ``missing_key`` (the entropy that was asked for is absent),
    ``oov`` (the last generated id past the vocabulary). Other faults leave it unchanged."""
    if op == "compute_log_prob":
        if fault == "wrong_shape":
            return dataclasses.replace(result, log_probs=result.log_probs[:-1])
        if fault == "nan":
            log_probs = result.log_probs.clone()
            log_probs[3] = float("nan")
            return dataclasses.replace(result, log_probs=log_probs)
        if fault == "missing_key":
            return dataclasses.replace(result, entropy=None)
    if op == "generate" and fault == "oov":
        return dataclasses.replace(result, token_ids=list(result.token_ids)[:-1] + [vocab_size + 7])
    return result


class StubBackend(RemoteBackend):
    """Instant answers: log-probs ``LOG_PROB`` (``REF_LOG_PROB`` for the reference), entropy
    ``0, 1, 2, ...``, the update metrics below, ``GENERATED`` tokens; checkpoints are folders
    with one file."""

    LOG_PROB: ClassVar[float] = -1.0
    REF_LOG_PROB: ClassVar[float] = -2.0
    UPDATE_METRICS: ClassVar[dict[str, Any]] = {"pg_loss": 0.1}
    UPDATE_LOSS: ClassVar[Any] = 0.1
    GENERATED: ClassVar[int] = 3  # tokens per generate call (fewer when max_tokens is lower)
    VOCAB: ClassVar[int] = 512
    DEVICE: ClassVar[Optional[BackendDevice]] = None
    COMPUTE_S: ClassVar[Optional[float]] = None
    #: op -> fault: "hang" (never answers) or one of :func:`corrupt`'s
    SCRIPT: ClassVar[dict[str, str]] = {}
    calls: ClassVar[list[tuple[str, Any]]] = []

    @classmethod
    def variant(cls, name: str, **knobs: Any) -> type["StubBackend"]:
        """A subclass with ``knobs`` as class attributes and its own empty ``calls`` / ``SCRIPT``."""
        return type(name, (cls,), {"calls": [], "SCRIPT": {}, **knobs})

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def from_config(cls, main_config: Any, *, handle: Optional[dict[str, Any]] = None) -> "StubBackend":
        return cls()

    def reconnect_handle(self) -> dict[str, Any]:
        return {}

    async def destroy(self) -> None:
        self.calls.append(("destroy", None))

    @classmethod
    def requires_single_forwarder(cls) -> bool:
        return True

    # ------------------------------------------------------------ data path
    async def compute_log_prob(self, data, *, ref, calculate_entropy, rollout_n, temperature, pad_token_id):
        await self._record("compute_log_prob", data)
        total = data.num_tokens if isinstance(data, BatchRef) else int(data["input_ids"].values().shape[0])
        result = LogProbResult(
            torch.full((total,), self.REF_LOG_PROB if ref else self.LOG_PROB),
            torch.arange(total, dtype=torch.float32) if calculate_entropy else None,
            device=self.DEVICE,
            compute_s=self.COMPUTE_S,
        )
        return corrupt("compute_log_prob", self.SCRIPT.get("compute_log_prob", ""), result)

    async def update_actor(self, data, *, actor_config, pad_token_id, rollout_n, temperature):
        await self._record("update_actor", data)
        lengths = None if isinstance(data, BatchRef) else data["input_ids"].offsets().diff().tolist()
        return UpdateResult(
            dict(self.UPDATE_METRICS),
            loss=self.UPDATE_LOSS,
            global_token_num=lengths,
            device=self.DEVICE,
            compute_s=self.COMPUTE_S,
        )

    async def generate(self, prompt_ids, sampling_params):
        await self._record("generate", list(prompt_ids))
        n = min(self.GENERATED, int(sampling_params["max_tokens"]))
        result = GenerateResult([5 + i for i in range(n)])
        return corrupt("generate", self.SCRIPT.get("generate", ""), result, vocab_size=self.VOCAB)

    async def update_weights(self):
        await self._record("update_weights", None)
        return {"policy_version": 1}

    async def save_checkpoint(self, path=None, step=None):
        await self._record("save_checkpoint", (path, step))
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "weights.bin").write_bytes(b"w" * 32)
        return path

    # ------------------------------------------------------------ optional capabilities
    async def load_checkpoint(self, path, step):
        await self._record("load_checkpoint", (path, step))

    async def health(self) -> None:
        await self._maybe_hang("health")

    def log_location(self) -> str:
        return "/nonexistent/stub-backend.log"

    async def _record(self, op: str, payload: Any) -> None:
        self.calls.append((op, payload))
        await self._maybe_hang(op)

    async def _maybe_hang(self, op: str) -> None:
        if self.SCRIPT.get(op) == "hang":
            await asyncio.sleep(3600)
