"""A third-party adapter, outside the package, registered the documented way.

It mirrors the README's example: a ``RemoteBackend`` subclass decorated with
``@RemoteBackendRegistry.register("my-engine")`` that delegates to the bundled
local engine. Tests make it known to every process with verl's own hook,
``VERL_USE_EXTERNAL_MODULES=support.third_party_adapter`` (plus this directory on
``PYTHONPATH``) - no edit to the plugin. Every call is counted in the engine
process's log line ``[my-engine] <op>`` so a test can see the adapter was used.

It declares one credential, ``remote_backend.my_engine_token`` (a flat key, as plugins read
theirs), read from ``MY_ENGINE_TOKEN`` when the key is null; each process prints a digest of the
token it got, so a test can see it arrived everywhere without it being printed.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from support.credentials import TOKEN_ENV, TOKEN_KEY, token_digest
from verl.remote_backend import RemoteBackend, RemoteBackendRegistry
from verl.remote_backend.settings.loader import select


@RemoteBackendRegistry.register("my-engine")
class MyEngineBackend(RemoteBackend):
    """verl adapter for "my engine" (here: the local engine behind it)."""

    def __init__(self, inner: RemoteBackend, *, owner: bool) -> None:
        self._inner = inner
        self._owner = owner

    @classmethod
    def from_config(cls, main_config, *, handle: Optional[dict[str, Any]] = None) -> "MyEngineBackend":
        local = RemoteBackendRegistry.get("local")
        inner = local.from_config(main_config, handle=None if handle is None else handle["inner"])
        token = select(main_config, TOKEN_KEY) or os.environ.get(TOKEN_ENV)
        print(f"[my-engine] from_config owner={handle is None} token={token_digest(token)}", flush=True)
        return cls(inner, owner=handle is None)

    @classmethod
    def secret_settings(cls) -> dict[str, str]:
        return {TOKEN_KEY: TOKEN_ENV}

    def reconnect_handle(self) -> dict[str, Any]:
        return {"inner": self._inner.reconnect_handle()}

    async def destroy(self) -> None:
        print(f"[my-engine] destroy owner={self._owner}", flush=True)
        await self._inner.destroy()

    @classmethod
    def requires_single_forwarder(cls) -> bool:
        # A constant, as for most engines: the entry point can then read it before anything starts
        # and derive trainer.n_gpus_per_node=1 from a verl command line written for 8 GPUs.
        return True

    async def compute_log_prob(self, data, *, ref, calculate_entropy, rollout_n, temperature, pad_token_id):
        print(f"[my-engine] compute_log_prob ref={ref}", flush=True)
        return await self._inner.compute_log_prob(
            data,
            ref=ref,
            calculate_entropy=calculate_entropy,
            rollout_n=rollout_n,
            temperature=temperature,
            pad_token_id=pad_token_id,
        )

    async def update_actor(self, data, *, actor_config, pad_token_id, rollout_n, temperature):
        print("[my-engine] update_actor", flush=True)
        return await self._inner.update_actor(
            data, actor_config=actor_config, pad_token_id=pad_token_id, rollout_n=rollout_n, temperature=temperature
        )

    async def generate(self, prompt_ids, sampling_params):
        return await self._inner.generate(prompt_ids, sampling_params)

    async def update_weights(self):
        print("[my-engine] update_weights", flush=True)
        return await self._inner.update_weights()

    async def save_checkpoint(self, path=None, step=None):
        return await self._inner.save_checkpoint(path, step)
