"""Errors of the ``arctic`` backend: what went wrong, where, and what the server said.

The adapter turns transport exceptions (``requests``, ``aiohttp``, Ray) into the
classes below so that a verl user reads, in one line, the op, the server address
and the server's own detail. Response validation (missing key, wrong type or
shape) also lives here. No ``arctic_platform`` import.
"""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import torch

__all__ = [
    "ArcticBackendError",
    "ArcticUnreachableError",
    "ArcticTimeoutError",
    "ArcticServerError",
    "ArcticResponseError",
    "PromptRoundTripError",
    "translate_error",
    "probe_health",
    "require",
    "require_tensor",
]


class ArcticBackendError(RuntimeError):
    """Base class of every error raised by the ``arctic`` backend."""


class ArcticUnreachableError(ArcticBackendError, ConnectionError):
    """No Arctic RL server answers at the configured host:port."""


class ArcticTimeoutError(ArcticBackendError, TimeoutError):
    """An Arctic call did not complete within its time limit."""


class ArcticServerError(ArcticBackendError):
    """The server answered with an error (HTTP status >= 400, or a failed Ray call).

    Attributes:
        status: HTTP status code, or ``None`` for the Ray transport.
        detail: the server's message (FastAPI's ``detail`` when it sent JSON).
    """

    def __init__(self, message: str, *, status: Optional[int] = None, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class ArcticResponseError(ArcticBackendError, ValueError):
    """The server's answer lacks a key or has a value of the wrong type or shape."""


class PromptRoundTripError(ArcticBackendError, ValueError):
    """A token-id prompt would not reach the server unchanged through its text-only /generate."""


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


def translate_error(exc: BaseException, *, op: str, address: str, timeout_s: Optional[float] = None) -> Exception:
    """Map a transport exception raised during ``op`` to an :class:`ArcticBackendError`.

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
                f"Arctic RL server at {address} rejected {op} with HTTP {status}: {detail}", status=status, detail=detail
            )
        if isinstance(exc, requests.Timeout):
            return ArcticTimeoutError(
                f"Arctic {op} did not finish within {timeout_s}s (remote_backend.arctic.request_timeout_s) "
                f"on the server at {address}"
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
        f"{last}). Start the server or fix remote_backend.arctic.host/port (or set remote_backend.arctic.launch_server=true)."
    )


def require(container: Any, key: str, *, op: str, where: str = "response", kind: type | tuple = object) -> Any:
    """``container[key]``, or :class:`ArcticResponseError` naming ``where.key`` and what was found."""
    if not isinstance(container, dict):
        raise ArcticResponseError(f"Arctic {op}: {where} should be a dict, got {type(container).__name__}")
    if key not in container:
        raise ArcticResponseError(f"Arctic {op}: {where} lacks key {key!r} (keys: {sorted(map(str, container))})")
    value = container[key]
    if not isinstance(value, kind):
        expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ArcticResponseError(f"Arctic {op}: {where}.{key} should be {expected}, got {type(value).__name__}")
    return value


def require_tensor(container: Any, key: str, shape: tuple[int, ...], *, op: str, where: str = "response.batch") -> torch.Tensor:
    """A floating tensor ``container[key]`` of exactly ``shape``, else :class:`ArcticResponseError`."""
    value = require(container, key, op=op, where=where)
    if isinstance(value, list):  # a server that detensorized its output
        try:
            value = torch.tensor(value, dtype=torch.float32)
        except (TypeError, ValueError) as exc:
            raise ArcticResponseError(f"Arctic {op}: {where}.{key} is a list that is not a rectangular array: {exc}")
    if not torch.is_tensor(value):
        raise ArcticResponseError(f"Arctic {op}: {where}.{key} should be a tensor, got {type(value).__name__}")
    if tuple(value.shape) != tuple(shape):
        raise ArcticResponseError(
            f"Arctic {op}: {where}.{key} has shape {tuple(value.shape)}, expected {tuple(shape)} (batch x sequence)"
        )
    if not (value.is_floating_point()):
        raise ArcticResponseError(f"Arctic {op}: {where}.{key} has dtype {value.dtype}, expected a floating dtype")
    return value
