"""Pure reliability pieces: error types, per-op time limits, liveness and retry policy.

Nothing here imports Ray or talks to a backend; :mod:`verl.remote_backend.guard`
applies these pieces to a live backend, and the forwarder worker, the rollout
server and the trainer use the guard.

Settings come from one shared block of the main config (declared in
``config/remote_ppo_trainer.yaml``, so users set them without ``+``)::

    remote_backend:
      timeouts:   {create, destroy, health, compute_log_prob, update_actor,
                   generate, update_weights, save_checkpoint, load_checkpoint}  # seconds, null = no limit
      liveness:   {enabled, interval_s, failures}
      retry:      {attempts, base_delay_s, max_delay_s, jitter}

Retry policy (see :func:`is_retryable`): only *idempotent* ops
(:data:`IDEMPOTENT_OPS`: health/status probes and reads) are retried, and only
after a *transport* error (:func:`is_transient_error`), with capped exponential
backoff and jitter. Ops that change the model or consume the sampler's random
stream (:data:`NEVER_RETRIED_OPS`) are never re-sent: after a failure the
backend's state is unknown, so the run stops and resumes from a checkpoint.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = [
    "BackendError",
    "BackendTimeoutError",
    "BackendDiedError",
    "BackendOutputError",
    "BackendTransportError",
    "ResumeCheckpointError",
    "BackendStoppedError",
    "BackendClosedError",
    "is_stop_error",
    "TimeoutSettings",
    "LivenessSettings",
    "RetryPolicy",
    "ReliabilitySettings",
    "IDEMPOTENT_OPS",
    "NEVER_RETRIED_OPS",
    "is_retryable",
    "is_transient_error",
    "is_death_error",
    "timeout_key",
]

#: Config prefix of the shared block.
CONFIG_ROOT = "remote_backend"


# ---------------------------------------------------------------- errors
class BackendError(RuntimeError):
    """Base class of the reliability errors raised on the verl side of a remote backend.

    Picklable whatever a subclass's constructor takes: Ray ships these errors from
    the forwarder to the trainer, and an error it cannot rebuild reaches the user
    as an opaque ``UnserializableException``.
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


class BackendClosedError(RuntimeError):
    """A call on a backend client after its ``destroy()`` - the run's own teardown, not a crash.

    Adapters raise it (with a message saying which client) from every call made after
    ``destroy()``; the guard turns it into :class:`BackendStoppedError`, never a death.
    """


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
            f"remote backend {backend!r} was stopped during {op} ({_last_line(cause)}): the run is shutting down (after a "
            "failure, reported separately, or Ctrl-C) or someone stopped it - not a crash of the backend. "
            f"Its logs: {logs}.",
        )


def _last_line(text: str) -> str:
    """Ray's actor errors put the reason (e.g. "killed by `ray.kill`") on their last line."""
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def is_stop_error(exc: BaseException) -> bool:
    """An intended stop, e.g. our own teardown: a Ray actor death caused by ``ray.kill``, or a call
    on a destroyed client (:class:`BackendClosedError`)."""
    if isinstance(exc, BackendClosedError):
        return True
    return bool(_names(exc) & _DEATH_NAMES) and "killed by `ray.kill`" in str(exc)


class BackendOutputError(BackendError, ValueError):
    """A backend answered with a malformed result (missing key, wrong shape/dtype, NaN, bad token)."""


class BackendTransportError(BackendError, ConnectionError):
    """A transient transport failure an adapter may raise to mark a call as safe to retry (if idempotent)."""


class ResumeCheckpointError(BackendError):
    """The checkpoint a run would resume from is missing, partial or corrupt (never loaded silently)."""


# ---------------------------------------------------------------- settings
@dataclass(frozen=True)
class TimeoutSettings:
    """Per-op limits in seconds (``None`` = no limit). Defaults suit each op:
    generation and updates may take long on big models, health probes must be quick."""

    create: Optional[float] = 3600.0  # engine start: model load, Arctic job creation
    destroy: Optional[float] = 300.0
    health: Optional[float] = 10.0
    compute_log_prob: Optional[float] = 1800.0
    update_actor: Optional[float] = 7200.0  # every mini-batch and epoch of a global batch
    generate: Optional[float] = 1800.0  # one sample, possibly queued behind a large batch
    update_weights: Optional[float] = 900.0  # also used for the sampler's sleep/wake
    save_checkpoint: Optional[float] = 1800.0
    load_checkpoint: Optional[float] = 1800.0

    def limit(self, op: str) -> Optional[float]:
        """The limit of ``op`` (``compute_ref_log_prob`` shares ``compute_log_prob``'s)."""
        return getattr(self, _TIMEOUT_FIELD.get(op, op))


#: ops that share another op's limit
_TIMEOUT_FIELD = {
    "compute_ref_log_prob": "compute_log_prob",
    "status": "health",
    "sleep": "update_weights",
    "wake_up": "update_weights",
    "clear_kv_cache": "update_weights",
}


def timeout_key(op: str) -> str:
    """The config key that sets ``op``'s limit."""
    return f"{CONFIG_ROOT}.timeouts.{_TIMEOUT_FIELD.get(op, op)}"


@dataclass(frozen=True)
class LivenessSettings:
    """Health probing while backend calls are in flight (for backends with ``async health()``).

    A probe runs every ``interval_s``; after a failed probe the next follows
    after a short backoff; ``failures`` consecutive failures (an error, or no
    answer within ``timeouts.health``) declare the backend dead. Worst case from
    death to error: ``interval_s + failures * timeouts.health`` plus backoff
    (25 s with the defaults); a crashed process fails its probe at once.
    """

    enabled: bool = True
    interval_s: float = 5.0
    failures: int = 2


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with jitter, for idempotent ops only (see :func:`is_retryable`).

    ``attempts`` counts every try (1 = no retry). Delay before retry ``k``
    (1-based) is ``min(max_delay_s, base_delay_s * 2**(k-1))``, multiplied by a
    random factor in ``[1 - jitter, 1 + jitter]`` so replicas do not retry in lockstep.
    """

    attempts: int = 3
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    jitter: float = 0.25

    def delay(self, retry: int, rng: Optional[random.Random] = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        if retry < 1:
            raise ValueError(f"retry numbers start at 1, got {retry}")
        base = min(self.max_delay_s, self.base_delay_s * (2 ** (retry - 1)))
        factor = 1.0 + (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, min(self.max_delay_s * (1.0 + self.jitter), base * factor))

    def delays(self, rng: Optional[random.Random] = None) -> Iterator[float]:
        """The ``attempts - 1`` delays between tries, in order."""
        for retry in range(1, max(1, self.attempts)):
            yield self.delay(retry, rng)


@dataclass(frozen=True)
class ReliabilitySettings:
    """``remote_backend.{timeouts, liveness, retry}``, typed and validated."""

    timeouts: TimeoutSettings = field(default_factory=TimeoutSettings)
    liveness: LivenessSettings = field(default_factory=LivenessSettings)
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def from_main_config(cls, main_config: Any) -> "ReliabilitySettings":
        """Read the three blocks (each optional: absent keys keep their defaults).

        Raises:
            ValueError: an unknown key, or a value that is not a positive number
                (timeouts may also be ``null``); the message names the key.
        """
        blocks = {name: _block(main_config, f"{CONFIG_ROOT}.{name}") for name in ("timeouts", "liveness", "retry")}
        timeouts = _build(TimeoutSettings, blocks["timeouts"], "timeouts", allow_none=True)
        liveness = _build(LivenessSettings, blocks["liveness"], "liveness")
        retry = _build(RetryPolicy, blocks["retry"], "retry")
        if int(liveness.failures) < 1:
            raise ValueError(f"{CONFIG_ROOT}.liveness.failures={liveness.failures}: must be >= 1")
        if int(retry.attempts) < 1:
            raise ValueError(f"{CONFIG_ROOT}.retry.attempts={retry.attempts}: must be >= 1 (1 = no retry)")
        if not 0 <= float(retry.jitter) < 1:
            raise ValueError(f"{CONFIG_ROOT}.retry.jitter={retry.jitter}: must be in [0, 1)")
        return cls(timeouts=timeouts, liveness=liveness, retry=retry)


def _block(cfg: Any, dotted: str) -> dict[str, Any]:
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return {}
        node = node.get(part) if hasattr(node, "get") else None
    if node is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(node, DictConfig):
            node = OmegaConf.to_container(node, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with verl
        pass
    if not isinstance(node, Mapping):
        raise ValueError(f"{dotted} must be a mapping, got {type(node).__name__}")
    return dict(node)


def _build(cls: type, raw: Mapping[str, Any], name: str, *, allow_none: bool = False) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"unknown key(s) {[f'{CONFIG_ROOT}.{name}.{k}' for k in unknown]}; known: {sorted(fields)}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        default = fields[key].default
        setting = f"{CONFIG_ROOT}.{name}.{key}={value!r}"
        if value is None:
            if not allow_none:
                raise ValueError(f"{setting}: must be set (null is not allowed here)")
            values[key] = None
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{setting}: must be true or false")
            values[key] = value
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{setting}: must be a number")
            if isinstance(default, int) and not isinstance(default, bool):
                values[key] = int(value)
            else:
                if not float(value) > 0 and key != "jitter":
                    raise ValueError(f"{setting}: must be > 0 seconds" + (" (or null for no limit)" if allow_none else ""))
                values[key] = float(value)
    return cls(**values)


# ---------------------------------------------------------------- classification
#: Ops that may be re-sent after a transport error: probes and reads that change nothing
#: (loading a checkpoint twice yields the same state).
IDEMPOTENT_OPS = frozenset({"health", "status", "compute_log_prob", "compute_ref_log_prob", "load_checkpoint"})
#: Ops never re-sent: they change the model (update_actor = forward-backward + optimizer
#: steps, update_weights, save_checkpoint), consume the sampler's random stream
#: (generate), or create/destroy the engine.
NEVER_RETRIED_OPS = frozenset({"update_actor", "update_weights", "save_checkpoint", "generate", "create", "destroy"})

# Ray's "actor temporarily unreachable" error: the actor may come back, so a read may be retried.
_TRANSIENT_NAMES = frozenset({"ActorUnavailableError"})
# Ray's "actor is gone for good" errors (matched by name so this module never imports Ray).
_DEATH_NAMES = frozenset({"ActorDiedError", "RayActorError"})


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def is_transient_error(exc: BaseException) -> bool:
    """A transport failure that may succeed if re-sent: connection refused/reset, an
    adapter's :class:`BackendTransportError`, Ray's ``ActorUnavailableError``.
    Timeouts are not transient here: their limit already elapsed once."""
    if isinstance(exc, (BackendTimeoutError, BackendDiedError, BackendOutputError)):
        return False
    return isinstance(exc, ConnectionError) or bool(_names(exc) & _TRANSIENT_NAMES)


def is_death_error(exc: BaseException) -> bool:
    """An error that by itself proves the backend's process is gone (a Ray actor death)."""
    names = _names(exc)
    if names & _TRANSIENT_NAMES:  # Ray's "unavailable" subclasses its actor error but may recover
        return False
    return isinstance(exc, (BackendDiedError, BackendClosedError)) or bool(names & _DEATH_NAMES)


def is_retryable(op: str, exc: BaseException) -> bool:
    """True only for a transport error on an idempotent op."""
    return op in IDEMPOTENT_OPS and op not in NEVER_RETRIED_OPS and is_transient_error(exc)
