"""The test suite's one contract double: a complete ``RemoteBackend`` with no model behind it.

Answers at once with deterministic, typed results that obey the contract (last slot of each
row 0, log-probs from ``generate`` when asked, ``BackendClosedError`` after ``destroy``, a
re-attached client that cannot stop the engine); it passes the conformance kit's model-free
checks (``tests/e2e/test_conformance_kit.py``). What a test needs to vary is a class attribute, set
on a subclass made by :meth:`StubBackend.variant`. Every call that reaches the engine is
recorded in ``calls`` (``(op, payload)``), and ``SCRIPT`` injects a fault per op (see
:func:`corrupt`).

The "engine" is a marker folder that the creating instance makes and its ``destroy`` removes;
the handle names the folder, so clients re-attached in other processes on this machine (Ray
workers) see the same engine, and see it gone once the owner destroyed it.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar, Optional

import torch

from verl.remote_backend import GenerateResult, LogProbResult, RemoteBackend, UpdateResult
from verl.remote_backend.errors import BackendClosedError, BackendStoppedError
from verl.remote_backend.results import BackendDevice
from verl.remote_backend.transport.batch_ref import BatchRef

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


_HANDLE_KIND = "stub"
#: token tensors an update cannot do without (the policy loss reads them)
_UPDATE_KEYS = ("advantages", "response_mask")
#: engine folders made by this process and not destroyed yet; removed when the process exits
_OWNED_ENGINES: set[str] = set()


@atexit.register
def _remove_owned_engines() -> None:
    for engine_dir in list(_OWNED_ENGINES):
        shutil.rmtree(engine_dir, ignore_errors=True)


class StubBackend(RemoteBackend):
    """Instant answers: log-probs ``LOG_PROB`` (``REF_LOG_PROB`` for the reference) and entropy
    ``0, 1, 2, ...`` (packed index), both 0 in each row's last slot; the update metrics below;
    ``GENERATED`` tokens ``5, 6, 7, ...``, each with log-prob ``LOG_PROB`` when ``logprobs`` is
    asked; checkpoints are folders with one file.

    Refuses what a real engine would: a handle that is not its own, an update batch without
    ``advantages`` / ``response_mask``, non-integer ``input_ids``; a call after this client's
    ``destroy`` (``BackendClosedError``) or after the owner destroyed the engine
    (``BackendStoppedError``)."""

    LOG_PROB: ClassVar[float] = -1.0
    REF_LOG_PROB: ClassVar[float] = -2.0
    UPDATE_METRICS: ClassVar[dict[str, Any]] = {"pg_loss": 0.1, "grad_norm": 1.0}
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

    def __init__(self, engine_dir: Optional[str] = None) -> None:
        """``StubBackend()``: a new engine and its owning client (what ``from_config(cfg)``
        returns); ``engine_dir``: a client re-attached to that engine's marker folder."""
        self._owner = engine_dir is None
        if engine_dir is None:
            engine_dir = tempfile.mkdtemp(prefix="vrb_stub_engine_")
            _OWNED_ENGINES.add(engine_dir)
        self._engine_dir = engine_dir
        self._destroyed = False

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def from_config(cls, main_config: Any, *, handle: Optional[dict[str, Any]] = None) -> "StubBackend":
        """A new engine (``handle=None``) or a client of the one ``handle`` names.

        Raises:
            ValueError: ``handle`` is not a stub handle from :meth:`reconnect_handle`.
        """
        if handle is None:
            return cls()
        if not isinstance(handle, dict) or handle.get("backend") != _HANDLE_KIND or not handle.get("engine"):
            raise ValueError(
                f"handle {handle!r} is not a stub handle (expected the dict from StubBackend.reconnect_handle())"
            )
        return cls(str(handle["engine"]))

    def reconnect_handle(self) -> dict[str, Any]:
        """``{"backend": "stub", "engine": <marker folder>}``."""
        self._check_open("reconnect_handle")
        return {"backend": _HANDLE_KIND, "engine": self._engine_dir}

    async def destroy(self) -> None:
        """Owner: stop the engine (remove its folder). Re-attached: only close this client. Idempotent."""
        self.calls.append(("destroy", None))
        if self._destroyed:
            return
        self._destroyed = True
        if self._owner:
            shutil.rmtree(self._engine_dir, ignore_errors=True)
            _OWNED_ENGINES.discard(self._engine_dir)

    @classmethod
    def requires_single_forwarder(cls) -> bool:
        return True

    # ------------------------------------------------------------ data path
    async def compute_log_prob(self, data, *, ref, calculate_entropy, rollout_n, temperature, pad_token_id):
        await self._record("compute_log_prob", data)
        _check_batch(data, "compute_log_prob", required=())
        offsets = data.offsets if isinstance(data, BatchRef) else data["input_ids"].offsets()
        total = int(offsets[-1])
        last_slots = offsets[1:] - 1  # log p(token after the last) does not exist: 0 by contract
        log_probs = torch.full((total,), self.REF_LOG_PROB if ref else self.LOG_PROB)
        log_probs[last_slots] = 0.0
        entropy = None
        if calculate_entropy:
            entropy = torch.arange(total, dtype=torch.float32)
            entropy[last_slots] = 0.0
        result = LogProbResult(log_probs, entropy, device=self.DEVICE, compute_s=self.COMPUTE_S)
        return corrupt("compute_log_prob", self.SCRIPT.get("compute_log_prob", ""), result)

    async def update_actor(self, data, *, actor_config, pad_token_id, rollout_n, temperature):
        await self._record("update_actor", data)
        _check_batch(data, "update_actor", required=_UPDATE_KEYS)
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
        # the sampler's log-probs are the trainer's (LOG_PROB on every non-last slot)
        log_probs = [self.LOG_PROB] * n if sampling_params.get("logprobs") else None
        result = GenerateResult([5 + i for i in range(n)], log_probs=log_probs)
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
        self._check_open("health")
        await self._maybe_hang("health")

    def log_location(self) -> str:
        return "/nonexistent/stub-backend.log"

    def _check_open(self, op: str) -> None:
        """Raise as a real client does when this client was destroyed, or its engine was."""
        if self._destroyed:
            raise BackendClosedError(
                f"{type(self).__name__}.{op}: this client was destroyed; create or re-attach a new one"
            )
        if not os.path.isdir(self._engine_dir):
            raise BackendStoppedError(
                op=op, backend=self.name or type(self).__name__, logs=self.log_location(),
                cause=f"the owner destroyed the stub engine {self._engine_dir}",
            )  # fmt: skip

    async def _record(self, op: str, payload: Any) -> None:
        self._check_open(op)
        self.calls.append((op, payload))
        await self._maybe_hang(op)

    async def _maybe_hang(self, op: str) -> None:
        if self.SCRIPT.get(op) == "hang":
            await asyncio.sleep(3600)


def _check_batch(data: Any, op: str, *, required: tuple[str, ...]) -> None:
    """Refuse a batch a real engine could not run: integer ``input_ids`` and the ``required``
    keys present. A :class:`BatchRef` (the batch is not here) is checked by the engine.

    Raises:
        KeyError: a required key is missing.
        TypeError: ``input_ids`` is not an integer tensor.
    """
    if isinstance(data, BatchRef):
        return
    missing = [key for key in ("input_ids", *required) if key not in data.keys()]
    if missing:
        raise KeyError(f"{op}: the batch has no {missing} (keys present: {sorted(data.keys())})")
    ids = data["input_ids"]
    dtype = (ids.values() if ids.is_nested else ids).dtype
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise TypeError(f"{op}: input_ids must be integer token ids, got dtype {dtype}")
