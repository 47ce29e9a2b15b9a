"""Faulty backends of the suite, registered the documented way (``@RemoteBackendRegistry.register``).

* ``fault-scripted`` - a test double that speaks the full contract without an
  engine (instant, deterministic); :data:`ScriptedBackend.SCRIPT` maps an op to
  the fault it injects.
* ``fault-local`` - the real ``local`` backend (its Ray engine actor), with
  faults injected around the real calls: outputs corrupted after the engine
  answered, or the engine actor SIGKILLed while a call is in flight. Faults
  come from :data:`CorruptingLocalBackend.SCRIPT` (in-process tests) or the
  ``VRB_FAULT`` environment variable (``<op>:<fault>[:<nth call>]``, for full
  runs where forwarders live in other processes; import this module there via
  ``VERL_USE_EXTERNAL_MODULES=faults.backends``).

Faults: ``hang`` (never answers), ``wrong_shape``, ``nan``, ``missing_key``,
``oov`` (a generated id past the vocabulary), ``kill`` (SIGKILL the engine
process during the call).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from typing import Any, Optional

from support.stub_backend import StubBackend, corrupt

from verl.remote_backend import RemoteBackendRegistry
from verl.workers.remote_client.local.backend import LocalBackend

__all__ = ["ScriptedBackend", "CorruptingLocalBackend", "corrupt"]


@RemoteBackendRegistry.register("fault-scripted")
class ScriptedBackend(StubBackend):
    """The suite's stub backend (tests/support/stub_backend.py) whose checkpoints carry the local
    engine's manifest, so the ledger can verify them."""

    SCRIPT: dict[str, str] = {}
    calls: list = []

    async def save_checkpoint(self, path=None, step=None):
        await self._record("save_checkpoint", (path, step))
        from verl.workers.remote_client.local.checkpoint import write_checkpoint_dir

        return write_checkpoint_dir(path, int(step or 0), {"weights.bin": lambda f: open(f, "wb").write(b"w" * 32)})


def _env_script() -> tuple[dict[str, str], dict[str, int]]:
    """``VRB_FAULT=<op>:<fault>[:<nth call>]`` -> ({op: fault}, {op: nth})."""
    raw = os.environ.get("VRB_FAULT", "")
    if not raw:
        return {}, {}
    op, fault, *nth = raw.split(":")
    return {op: fault}, {op: int(nth[0]) if nth else 1}


@RemoteBackendRegistry.register("fault-local")
class CorruptingLocalBackend(LocalBackend):
    """The real local backend plus injected faults (see module docstring)."""

    SCRIPT: dict[str, str] = {}
    #: op -> which call (1-based) gets the fault; others run clean
    NTH: dict[str, int] = {}
    #: seconds between sending a call and killing the engine (``kill`` fault)
    KILL_AFTER_S = 0.3
    #: a sampled request can end early at a random EOS, so generation is killed sooner
    #: (the request has been sent and is decoding, but has very likely not finished)
    KILL_GENERATE_AFTER_S = 0.05
    #: what the last ``kill`` fault did: pid, op, in_flight (the call had not finished), at (time.time())
    LAST_KILL: dict[str, Any] = {}
    _counts: dict[str, itertools.count] = {}

    def _fault(self, op: str) -> str:
        script, nth = (self.SCRIPT, self.NTH) if self.SCRIPT else _env_script()
        fault = script.get(op, "")
        if not fault:
            return ""
        call = next(self._counts.setdefault(op, itertools.count(1)))
        return fault if call == nth.get(op, 1) else ""

    async def _run(self, op: str, call, *, vocab_size: Optional[int] = None) -> Any:
        fault = self._fault(op)
        if fault == "hang":
            await asyncio.sleep(3600)
        if fault == "kill":
            pid = int(self.info["pid"])
            task = asyncio.ensure_future(call())
            await asyncio.sleep(self.KILL_GENERATE_AFTER_S if op == "generate" else self.KILL_AFTER_S)
            in_flight = not task.done()
            os.kill(pid, signal.SIGKILL)
            CorruptingLocalBackend.LAST_KILL = {"pid": pid, "op": op, "in_flight": in_flight, "at": time.time()}
            print(
                f"[fault] killed engine pid {pid} during {op} (in flight: {in_flight}) at {time.time():.3f}", flush=True
            )
            return await task
        result = await call()
        return corrupt(op, fault, result, vocab_size=vocab_size or int(self.info.get("vocab_size", 512)))

    async def compute_log_prob(self, data, **kwargs):
        return await self._run(
            "compute_log_prob", lambda: super(CorruptingLocalBackend, self).compute_log_prob(data, **kwargs)
        )

    async def update_actor(self, data, **kwargs):
        return await self._run("update_actor", lambda: super(CorruptingLocalBackend, self).update_actor(data, **kwargs))

    async def generate(self, prompt_ids, sampling_params):
        return await self._run(
            "generate", lambda: super(CorruptingLocalBackend, self).generate(prompt_ids, sampling_params)
        )

    async def save_checkpoint(self, path=None, step=None):
        return await self._run(
            "save_checkpoint", lambda: super(CorruptingLocalBackend, self).save_checkpoint(path, step)
        )

    async def destroy(self) -> None:
        if self._owner and not self._destroyed:
            print(f"[fault] destroy called at {time.time():.3f}", flush=True)
        await super().destroy()
