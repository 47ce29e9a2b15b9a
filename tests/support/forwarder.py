"""An in-process forwarder worker (``RemoteBackendWorker``) for tests that call its ops directly."""

from __future__ import annotations

from typing import Any

from support.ports import free_port


def set_single_rank_env(monkeypatch) -> None:
    """The torch-distributed environment of a one-rank worker, as Ray would give it, on a free port:
    a fixed ``MASTER_PORT`` collides with any other run on the machine (and with other tests)."""
    for key, value in {
        "WORLD_SIZE": "1",
        "RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }.items():
        monkeypatch.setenv(key, value)


def in_process_forwarder(config: Any, handle: Any, monkeypatch, *, role: str = "actor_rollout"):
    """A ``RemoteBackendWorker`` for ``config.actor_rollout_ref`` in this process, its model initialised
    and attached to the backend of ``handle`` (``{}`` for backends that need no handle)."""
    from verl.remote_backend.forwarder.worker import RemoteBackendWorker

    set_single_rank_env(monkeypatch)
    worker = RemoteBackendWorker(config.actor_rollout_ref, role=role)
    worker.init_model()
    worker.attach_backend(config, handle)
    return worker
