"""Errors of the ``arctic`` backend: each an :class:`~verl.remote_backend.errors.BackendError`.

The adapter turns transport exceptions into these (:mod:`.server_http`), so a verl user reads,
in one line, the op, the server address and the server's own detail.
"""

from __future__ import annotations

from typing import Optional

from verl.remote_backend.errors import BackendError, BackendOutputError, BackendTransportError

__all__ = [
    "ArcticBackendError",
    "ArcticUnreachableError",
    "ArcticTimeoutError",
    "ArcticServerError",
    "ArcticResponseError",
    "PromptRoundTripError",
    "PayloadError",
]


class ArcticBackendError(BackendError):
    """Base class of every error raised by the ``arctic`` backend."""


class ArcticUnreachableError(ArcticBackendError, BackendTransportError):
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
        self._init_kwargs = {"message": message, "status": status, "detail": detail}
        super().__init__(message)
        self.status = status
        self.detail = detail


class ArcticResponseError(ArcticBackendError, BackendOutputError):
    """The server's answer lacks a key or has a value of the wrong type or shape."""


class PromptRoundTripError(ArcticBackendError, ValueError):
    """A token-id prompt would not reach the server unchanged through its text-only /generate."""


class PayloadError(ArcticBackendError, ValueError):
    """A tensor does not have the layout the Arctic mapping requires (a batch from verl, or an answer).

    The message names the field, the expected shape/value and the actual one.
    """
