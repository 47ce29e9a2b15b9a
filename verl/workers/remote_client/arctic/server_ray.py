"""Arctic RL's in-process Ray server (``remote_backend.arctic.protocol=ray``).

arctic-platform's own Ray transport does the work: ``AsyncArcticRLClient`` with
``backend.protocol="ray"`` builds its ``RayTransport``, which starts the server state actor
(``ArcticRLRayServerState``: the jobs, the DeepSpeed worker actors in their placement groups,
the vLLM replica pool) in the caller's Ray cluster and wraps it in ``ArcticRLRayServer`` in the
caller's process. Another process re-attaches with the state actor's handle and the job ids,
exactly as Arctic's client does (``server_state=`` + a reconnect config); such a client never
destroys the jobs (Arctic's transport skips them on shutdown).

This module adds what the adapter needs around it, and nothing of Arctic's is copied:

* every op runs on a worker thread with an event loop of its own (:func:`run_op`): Arctic's
  wrapper blocks in ``ray.get`` inside its coroutines, which would stall the caller's loop and
  with it the liveness watchdog;
* Ray's failures become the adapter's errors (:func:`translate_error`), as
  :mod:`.server_http` does for HTTP;
* a health probe (one call on the state actor within a limit), where the server's logs are,
  and the owner's teardown: Arctic's jobs first, then the state actor and the placement groups
  it and its creator made (Arctic's client leaves them to the end of the driver).

The colocated memory step - empty the training job's cache before vLLM wakes - is Arctic's
Ray server's own: its state actor's ``wake_inference`` does it on every wake, including the
wakes inside a weight sync, so the adapter adds no call for it here (over HTTP it does).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Optional

from verl.workers.remote_client.arctic.errors import (
    ArcticBackendError,
    ArcticServerError,
    ArcticTimeoutError,
    ArcticUnreachableError,
)

__all__ = [
    "start_client",
    "attach_client",
    "run_op",
    "server_state",
    "describe",
    "probe_health",
    "translate_error",
    "placement_group_ids",
    "stop_server",
    "log_location",
]

STATE_ACTOR = "ArcticRLRayServerState"


def _require_ray() -> Any:
    import ray

    if not ray.is_initialized():
        raise ArcticUnreachableError(
            "remote_backend.arctic.protocol=ray starts Arctic's server inside the caller's Ray cluster, but Ray is "
            "not initialised in this process. Fix: create the backend from verl's trainer (Ray is up there), call "
            "ray.init() first, or set remote_backend.arctic.protocol=http"
        )
    return ray


def start_client(client_config: Any) -> Any:
    """A fresh server and its jobs, through arctic-platform's own Ray transport; returns the async client."""
    from arctic_platform.client import AsyncArcticRLClient

    _require_ray()
    if client_config.backend.protocol != "ray":
        raise ValueError(f"start_client needs backend.protocol='ray', got {client_config.backend.protocol!r}")
    return AsyncArcticRLClient(client_config)


def attach_client(client_config: Any, state: Any) -> Any:
    """Re-attach to running jobs (``client_config`` carries their ids) on the server behind ``state``."""
    from arctic_platform.client import AsyncArcticRLClient

    _require_ray()
    return AsyncArcticRLClient(client_config, server_state=state)


def server_state(client: Any) -> Any:
    """The state actor's handle (Arctic's ``get_server_state``): what another process re-attaches with."""
    return client.get_server_state()


def describe(state: Any) -> str:
    """How messages name the server: the state actor and its id."""
    try:
        return f"Arctic's in-process Ray server ({STATE_ACTOR} actor {state._actor_id.hex()})"
    except Exception:  # pragma: no cover - a handle always has an id
        return f"Arctic's in-process Ray server ({STATE_ACTOR} actor)"


def run_op(client: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """``client.<method>(...)`` awaited on an event loop of this (worker) thread.

    Arctic's wrapper blocks in ``ray.get`` inside some coroutines, so no time limit can act on this
    loop: the caller bounds the thread's future instead (``request_timeout_s``).
    """

    async def call() -> Any:
        return await getattr(client, method)(*args, **kwargs)

    return asyncio.run(call())


def probe_health(state: Any, timeout_s: float) -> None:
    """One call on the state actor (its colocate flag) answered within ``timeout_s``, or an error."""
    ray = _require_ray()
    ray.get(state.get_colocate.remote(), timeout=float(timeout_s))


def _ray_exceptions() -> Any:
    import ray.exceptions

    return ray.exceptions


def translate_error(exc: BaseException, *, op: str, address: str, timeout_s: Optional[float] = None) -> Exception:
    """Map what a Ray call raised during ``op`` to an :class:`ArcticBackendError`.

    A dead or unreachable actor (the state actor or one of its DeepSpeed / replica actors) is
    :class:`ArcticUnreachableError` (a transport error: the guard then probes health); a Ray
    get or ``request_timeout_s`` running out, :class:`ArcticTimeoutError`; an exception raised
    on the server (``RayTaskError``) or in Arctic's wrapper, :class:`ArcticServerError` quoting it.
    """
    if isinstance(exc, ArcticBackendError):
        return exc
    try:
        rex = _ray_exceptions()
    except ImportError:  # pragma: no cover - protocol=ray needs Ray
        rex = None
    if rex is not None:
        if isinstance(exc, (rex.RayActorError, rex.OwnerDiedError, rex.ObjectLostError)):
            return ArcticUnreachableError(
                f"{address} is unreachable during {op}: {type(exc).__name__}: {_first_lines(exc)}"
            )
        if isinstance(exc, rex.GetTimeoutError):
            return ArcticTimeoutError(f"Arctic {op} did not finish within {timeout_s}s on {address}")
        if isinstance(exc, rex.RayTaskError):
            cause = getattr(exc, "cause", None) or exc
            if isinstance(cause, (rex.RayActorError, rex.OwnerDiedError)):
                return translate_error(cause, op=op, address=address, timeout_s=timeout_s)
            detail = f"{type(cause).__name__}: {_first_lines(cause)}"
            return ArcticServerError(f"{address} failed {op}: {detail}", detail=detail)
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return ArcticTimeoutError(
            f"Arctic {op} did not finish within {timeout_s}s (remote_backend.arctic.request_timeout_s) on {address}"
        )
    detail = f"{type(exc).__name__}: {_first_lines(exc)}"
    return ArcticServerError(f"Arctic {op} failed on {address}: {detail}", detail=detail)


def _first_lines(exc: BaseException, limit: int = 2000) -> str:
    return str(exc).strip()[:limit]


def placement_group_ids(state: Any, timeout_s: float = 60.0) -> list[str]:
    """Ids of the placement groups the server holds: the state actor's own and its colocated GPU groups."""
    ray = _require_ray()

    def held(server: Any) -> list[str]:
        import ray as ray_in_actor

        own = ray_in_actor.get_runtime_context().get_placement_group_id()
        groups = list(getattr(getattr(server, "placement", None), "placement_groups", None) or [])
        return [g for g in [own, *(pg.id.hex() for pg in groups)] if g]

    return list(ray.get(state.__ray_call__.remote(held), timeout=timeout_s))


def stop_server(state: Any, pg_ids: list[str]) -> None:
    """Owner only, after Arctic's jobs were destroyed: end the state actor (its worker and replica
    actors go with it) and free the placement groups, so their GPUs return to the cluster."""
    import ray
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    if not ray.is_initialized():
        return
    try:
        ray.kill(state, no_restart=True)
    except Exception:  # already gone
        pass
    for pg_id in pg_ids:
        try:
            remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))
        except Exception:  # already removed (its creator ended)
            pass


def log_location(state: Any) -> str:
    """Where the state actor's and its workers' output goes: Ray's session logs."""
    folder = "Ray's session log folder (/tmp/ray/session_latest/logs)"
    try:
        import ray

        node = ray._private.worker.global_worker.node
        folder = os.path.join(node.get_session_dir_path(), "logs")
    except Exception:  # pragma: no cover - best effort, for a message
        pass
    return f"{folder} (worker-*.out/.err of {describe(state)} and its DeepSpeed worker actors)"
