"""Every error class of the product, in one hierarchy.

``ConfigError`` (a ``ValueError``): a setting that cannot work, raised before anything
starts. ``BackendError`` (a ``RuntimeError``): a backend op failed at run time; its
subclasses say how, and every backend's own errors derive from it. All of them
pickle, because Ray ships them from the forwarder to the trainer.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "ConfigError",
    "UnknownBackendError",
    "BackendImportError",
    "BackendError",
    "BackendTimeoutError",
    "BackendDiedError",
    "BackendStoppedError",
    "BackendClosedError",
    "BackendOutputError",
    "BackendTransportError",
    "ResumeCheckpointError",
    "CheckpointSaveError",
    "RunInterruptedError",
]


# ---------------------------------------------------------------- configuration
class ConfigError(ValueError):
    """A setting that cannot work; the message names the full dotted key, its value and the fix.

    A ``ValueError``, so callers that catch ``ValueError`` keep working.
    """

    @classmethod
    def for_setting(cls, key: str, value: Any, problem: str, fix: str) -> "ConfigError":
        """``<key>=<value>: <problem>. Fix: <fix>`` - the one message format of a bad setting."""
        return cls(f"{key}={value!r}: {problem}. Fix: {fix}")


class UnknownBackendError(KeyError):
    """No backend is registered under the requested name (the message lists the known names)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class BackendImportError(ImportError):
    """The module that provides a backend could not be imported (the message has the install command)."""


# ---------------------------------------------------------------- run time
class BackendError(RuntimeError):
    """Base class of every error a backend op ends with, on the verl side or inside an adapter.

    Picklable whatever a subclass's constructor takes: Ray ships these errors from
    the forwarder to the trainer, and an error it cannot rebuild reaches the user
    as an opaque ``UnserializableException``. A subclass whose constructor takes
    keyword arguments stores them in ``_init_kwargs``.
    """

    #: keyword arguments a subclass with a keyword-only constructor was built with
    _init_kwargs: Optional[dict] = None

    def __reduce__(self) -> tuple:
        if self._init_kwargs is not None:
            return (_rebuild_error, (type(self), self._init_kwargs))
        return (type(self), self.args)


def _rebuild_error(cls: type, kwargs: dict) -> BaseException:
    return cls(**kwargs)


class BackendTimeoutError(BackendError, TimeoutError):
    """A backend op did not finish within its limit.

    Attributes: ``op``, ``backend`` (registry name), ``limit_s``, ``key`` (the
    config key that sets the limit).
    """

    def __init__(self, *, op: str, backend: str, limit_s: float, key: str, detail: str = "") -> None:
        self._init_kwargs = {"op": op, "backend": backend, "limit_s": limit_s, "key": key, "detail": detail}
        self.op, self.backend, self.limit_s, self.key = op, backend, float(limit_s), key
        super().__init__(
            f"remote backend {backend!r}: {op} did not finish within {limit_s:g}s. If the op is legitimately "
            f"this slow, raise {key} (seconds; null = no limit). The backend's state after a timed-out call is "
            f"unknown, so nothing is re-sent: resume from the last checkpoint.{(' ' + detail) if detail else ''}"
        )


class BackendDiedError(BackendError):
    """The backend's process (Ray actor or server) is gone or stopped answering health probes.

    Attributes: ``op``, ``backend``, ``logs`` (where its logs are, as the backend reports it).
    """

    def __init__(self, *, op: str, backend: str, logs: str, cause: str) -> None:
        self._init_kwargs = {"op": op, "backend": backend, "logs": logs, "cause": cause}
        self.op, self.backend, self.logs = op, backend, logs
        super().__init__(
            f"remote backend {backend!r} died during {op}: {cause}. Its logs: {logs}. Nothing was re-sent; "
            "restart the backend and resume from the last complete checkpoint (trainer.resume_mode=auto)."
        )


class BackendStoppedError(BackendDiedError):
    """The backend was stopped on purpose (``ray.kill``, or its client destroyed), not crashed.

    The run's own teardown kills the engine after another failure (reported on its own,
    first); calls still in flight then end with this error, which says so instead of
    announcing a backend death.
    """

    def __init__(self, *, op: str, backend: str, logs: str, cause: str) -> None:
        self._init_kwargs = {"op": op, "backend": backend, "logs": logs, "cause": cause}
        self.op, self.backend, self.logs = op, backend, logs
        BackendError.__init__(
            self,
            f"remote backend {backend!r} was stopped during {op} ({_last_line(cause)}): the run is shutting down "
            "(after a failure, reported separately, or Ctrl-C) or someone stopped it - not a crash of the backend. "
            f"Its logs: {logs}.",
        )


def _last_line(text: str) -> str:
    """Ray's actor errors put the reason (e.g. "killed by `ray.kill`") on their last line."""
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


class BackendClosedError(RuntimeError):
    """A call on a backend client after its ``destroy()`` - the run's own teardown, not a crash.

    Adapters raise it (with a message saying which client) from every call made after
    ``destroy()``; the guard turns it into :class:`BackendStoppedError`, never a death.
    """


class BackendOutputError(BackendError, ValueError):
    """A backend answered with a malformed result (missing key, wrong shape/dtype, NaN, bad token)."""


class BackendTransportError(BackendError, ConnectionError):
    """A transient transport failure: safe to re-send if the op is idempotent."""


class ResumeCheckpointError(BackendError):
    """The checkpoint a run would resume from is missing, partial or corrupt (never loaded silently)."""


class CheckpointSaveError(BackendError):
    """A checkpoint could not be written (disk full, quota, read-only or unwritable folder). The
    message names the folder, the space free and needed, and the fix; what was half-written is
    removed, and the previous complete checkpoint is untouched (built by
    :func:`verl.remote_backend.checkpoints.storage_failure`)."""


class RunInterruptedError(Exception):
    """The run was interrupted (Ctrl-C) and torn down; raised by the task runner.

    Attributes: ``step`` - the last step that finished (``None`` before training started);
    ``backend_destroyed`` - whether the backend's teardown completed.
    """

    def __init__(self, step: Optional[int] = None, backend_destroyed: bool = False) -> None:
        super().__init__(f"interrupted after step {step}; backend destroyed: {backend_destroyed}")
        self.step = step
        self.backend_destroyed = backend_destroyed

    def __reduce__(self) -> tuple[Any, ...]:  # keep the attributes across Ray's pickling
        return (type(self), (self.step, self.backend_destroyed))
