"""Talking HTTP to an Arctic RL server: its health probe, and its failures as :mod:`.errors` classes.

``requests`` and ``aiohttp`` exceptions become :class:`ArcticServerError` (quoting the
server's ``detail``), :class:`ArcticTimeoutError` or :class:`ArcticUnreachableError`.
No ``arctic_platform`` import.
"""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any, Optional

from verl.workers.remote_client.arctic.errors import (
    ArcticBackendError,
    ArcticServerError,
    ArcticTimeoutError,
    ArcticUnreachableError,
)

__all__ = ["translate_error", "probe_health", "jobs_problem"]


def _detail_from_body(text: str) -> str:
    """FastAPI errors are ``{"detail": ...}``; anything else is returned as sent (trimmed)."""
    text = (text or "").strip()
    try:
        body = json.loads(text)
    except (ValueError, TypeError):
        return text[:2000]
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        return detail if isinstance(detail, str) else json.dumps(detail)[:2000]
    return text[:2000]


def translate_error(
    exc: BaseException,
    *,
    op: str,
    address: str,
    timeout_s: Optional[float] = None,
    timeout_key: str = "remote_backend.arctic.request_timeout_s",
) -> Exception:
    """Map a transport exception raised during ``op`` to an :class:`ArcticBackendError`
    (a time-out names ``timeout_key``, the setting of the limit that ran out).

    ``requests`` keeps the response body on ``HTTPError.response``, so the server's
    ``detail`` is quoted in the message. Unknown exceptions are wrapped as
    :class:`ArcticServerError` with their text.
    """
    if isinstance(exc, ArcticBackendError):
        return exc
    name = type(exc).__name__
    try:
        import requests

        if isinstance(exc, requests.HTTPError) and exc.response is not None:
            status = exc.response.status_code
            detail = _detail_from_body(exc.response.text)
            return ArcticServerError(
                f"Arctic RL server at {address} rejected {op} with HTTP {status}: {detail}",
                status=status,
                detail=detail,
            )
        if isinstance(exc, requests.Timeout):
            return ArcticTimeoutError(
                f"Arctic {op} did not finish within {timeout_s}s ({timeout_key}) on the server at {address}"
            )
        if isinstance(exc, requests.ConnectionError):
            return ArcticUnreachableError(
                f"Arctic RL server at {address} is unreachable during {op}: {exc}. Is the server running "
                "(remote_backend.arctic.host/port)?"
            )
    except ImportError:  # pragma: no cover - requests ships with arctic-platform
        pass
    try:
        import aiohttp

        if isinstance(exc, aiohttp.ClientResponseError):
            return ArcticServerError(
                f"Arctic RL server at {address} rejected {op} with HTTP {exc.status}: {exc.message}",
                status=exc.status,
                detail=str(exc.message),
            )
        if isinstance(exc, aiohttp.ClientConnectionError):
            return ArcticUnreachableError(f"Arctic RL server at {address} is unreachable during {op}: {exc}")
    except ImportError:  # pragma: no cover
        pass
    if isinstance(exc, TimeoutError):
        return ArcticTimeoutError(f"Arctic {op} did not finish within {timeout_s}s on the server at {address}")
    return ArcticServerError(f"Arctic {op} failed on the server at {address}: {name}: {exc}", detail=str(exc))


def probe_health(host: str, port: int, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for ``GET http://host:port/health`` to answer 200.

    Retries (health is idempotent) with capped exponential backoff, each attempt
    bounded by the time left, so the call returns or raises within about
    ``timeout_s``.

    Raises:
        ArcticUnreachableError: naming ``host:port`` and the last failure.
    """
    import requests

    address = f"{host}:{port}"
    deadline = time.monotonic() + float(timeout_s)
    delay, last = 0.1, "no attempt made"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            resp = requests.get(f"http://{address}/health", timeout=(max(0.05, min(left, 5.0)), max(0.05, left)))
            if resp.ok:
                return
            last = f"/health answered HTTP {resp.status_code}: {_detail_from_body(resp.text)}"
        except requests.RequestException as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
        delay = min(delay * 2, 1.0)
    raise ArcticUnreachableError(
        f"Arctic RL server at {address} is unreachable (no healthy /health answer within {timeout_s}s; last error: "
        f"{last}). Start the server or fix remote_backend.arctic.host/port "
        "(or set remote_backend.arctic.launch_server=true)."
    )


def jobs_problem(status: Any, jobs: dict[str, Any], training_root: Optional[str]) -> Optional[str]:
    """Does the server (its ``GET /status`` answer) still hold this run's jobs? ``None`` if so, else what is
    missing or foreign.

    ``jobs`` maps a job type to this client's job id (``None``: no such job). Arctic numbers jobs from 1
    on every start and exposes no boot id, so a restarted server may hold jobs of another client under
    the same ids: a training job also has to keep the folder Arctic made for it under this run's
    checkpoint path (``<training_root>/arctic_rl_job_<id>``).
    """
    held = status.get("jobs") if isinstance(status, dict) else None
    if not isinstance(held, dict):
        return f"its /status answer lists no jobs ({str(status)[:200]})"

    def own_dir(job_id: Any) -> str:  # the folder Arctic's /initialize makes for a training job, spelt as it does
        return str(pathlib.Path(str(training_root)) / f"arctic_rl_job_{job_id}")

    problems = []
    for job_type, job_id in jobs.items():
        if job_id is None:
            continue
        info = held.get(str(job_id), held.get(job_id))
        if not isinstance(info, dict):
            problems.append(f"{job_type} job {job_id} is gone")
        elif info.get("job_type") != job_type:
            problems.append(f"job {job_id} is now a {info.get('job_type')} job, not this run's {job_type} job")
        elif job_type == "training" and training_root and info.get("checkpoint_path") not in (None, own_dir(job_id)):
            problems.append(
                f"training job {job_id} belongs to another run (its folder is {info.get('checkpoint_path')}, "
                f"not under {training_root})"
            )
    return "; ".join(problems) or None
