"""Deliberately broken adapters, one per conformance-kit check category: each is the real local
backend with one contract violation an adapter author could plausibly make. ``BROKEN`` maps a
registered name to the one check that must catch it. Imported in Ray workers through
``VERL_USE_EXTERNAL_MODULES=support.broken_adapters`` (the kit re-attaches in other processes), which is
also why the suite's honest stub is registered here, as :data:`STUB_NAME`."""

from __future__ import annotations

import dataclasses

import torch

from support.stub_backend import StubBackend
from verl.remote_backend import RemoteBackendRegistry
from verl.workers.remote_client.local.backend import LocalBackend

#: registered name -> the check that must fail (and no other)
BROKEN = {
    "broken-attached-destroy": "1.attached-destroy",
    "broken-attached-stays-open": "1.attached-destroy",
    "broken-owner-destroy": "1.owner-destroy",
    "broken-non-tensor": "2.layout",
    "broken-off-by-one": "2.alignment",
    "broken-nondeterministic": "3.repeat",
    "broken-flipped-advantages": "4.direction",
    "broken-max-tokens": "5.max-tokens",
    "broken-resume": "6.resume",
    "broken-unpicklable-error": "7.missing-key",
    "broken-health": "8.capabilities",
}


@RemoteBackendRegistry.register("broken-attached-destroy")
class KillsEngineFromAnyClient(LocalBackend):
    """destroy() kills the engine even from a re-attached client (a forwarder's teardown)."""

    async def destroy(self) -> None:
        self._owner = True
        await super().destroy()


@RemoteBackendRegistry.register("broken-attached-stays-open")
class AttachedClientIgnoresDestroy(LocalBackend):
    """destroy() of a re-attached client does nothing: its later calls still reach the engine."""

    async def destroy(self) -> None:
        if self._owner:
            await super().destroy()


@RemoteBackendRegistry.register("broken-owner-destroy")
class LeavesEngineRunning(LocalBackend):
    """destroy() of the creating client only drops its own connection, as a re-attached one
    does: the engine runs on for every client still attached (Ray stops the actor only when
    the last handle is gone)."""

    async def destroy(self) -> None:
        self._owner = False
        await super().destroy()


@RemoteBackendRegistry.register("broken-non-tensor")
class ReturnsLists(LocalBackend):
    """Returns log-probs as a Python list inside the previous contract's dict."""

    async def compute_log_prob(self, data, **kwargs):
        out = await super().compute_log_prob(data, **kwargs)
        return {"model_output": {"log_probs": out.log_probs.tolist()}, "metrics": {}}


@RemoteBackendRegistry.register("broken-off-by-one")
class TokenAlignedLogProbs(LocalBackend):
    """Slot t holds log p(token t) instead of log p(token t+1) (last slot still 0)."""

    accepts_batch_refs = False  # it reads the batch itself

    async def compute_log_prob(self, data, **kwargs):
        out = await super().compute_log_prob(data, **kwargs)
        rows = torch.split(out.log_probs, data["input_ids"].offsets().diff().tolist())
        shifted = [torch.cat([row.new_zeros(1), row[:-2], row.new_zeros(1)]) for row in rows]
        return dataclasses.replace(out, log_probs=torch.cat(shifted), entropy=out.entropy)


@RemoteBackendRegistry.register("broken-nondeterministic")
class NoisyLogProbs(LocalBackend):
    """Log-probs carry run-to-run noise of 1e-4 (e.g. an unseeded dropout left on)."""

    accepts_batch_refs = False  # it reads the batch itself

    async def compute_log_prob(self, data, **kwargs):
        out = await super().compute_log_prob(data, **kwargs)
        noise = 1e-4 * torch.randn_like(out.log_probs)
        lengths = data["input_ids"].offsets().diff()
        noise[torch.cumsum(lengths, 0) - 1] = 0.0  # keep each row's unused last slot at 0
        return dataclasses.replace(out, log_probs=out.log_probs + noise)


@RemoteBackendRegistry.register("broken-flipped-advantages")
class FlipsAdvantages(LocalBackend):
    """Sends the advantages with the wrong sign (a sign-convention slip)."""

    accepts_batch_refs = False  # it reads the batch itself

    async def update_actor(self, data, **kwargs):
        data["advantages"] = -data["advantages"]
        return await super().update_actor(data, **kwargs)


@RemoteBackendRegistry.register("broken-max-tokens")
class IgnoresMaxTokens(LocalBackend):
    """Asks its sampler for two tokens more than requested."""

    async def generate(self, prompt_ids, sampling_params):
        params = dict(sampling_params, max_tokens=int(sampling_params["max_tokens"]) + 2)
        return await super().generate(prompt_ids, params)


@RemoteBackendRegistry.register("broken-resume")
class ForgetsOnLoad(LocalBackend):
    """load_checkpoint answers but restores nothing."""

    async def load_checkpoint(self, path, step=None):
        return None


class EngineError(Exception):
    """An error type that cannot be rebuilt from its pickled args (its __init__ takes two)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"[{code}] {message}")


@RemoteBackendRegistry.register("broken-unpicklable-error")
class WrapsErrors(LocalBackend):
    """Wraps update errors into an exception that does not survive Ray's pickling."""

    async def update_actor(self, data, **kwargs):
        try:
            return await super().update_actor(data, **kwargs)
        except Exception as exc:
            raise EngineError(400, str(exc)) from None


@RemoteBackendRegistry.register("broken-health")
class AlwaysUnhealthy(LocalBackend):
    """health() fails although the engine answers."""

    async def health(self) -> None:
        raise ConnectionError("health endpoint not implemented")


#: the suite's contract double (tests/support/stub_backend.py), honest: the kit's model-free checks pass
STUB_NAME = "conformance-stub"
RemoteBackendRegistry.register(STUB_NAME)(StubBackend.variant("ConformanceStub"))
