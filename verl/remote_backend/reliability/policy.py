"""Reliability policy: per-op time limits, liveness probing and retry, and how errors classify.

Nothing here imports Ray or talks to a backend; :mod:`verl.remote_backend.reliability.guard`
applies it to a live backend. Settings come from ``remote_backend.{timeouts,
liveness, retry}`` (declared in ``config/remote_ppo_trainer.yaml``). Only
idempotent ops (:data:`IDEMPOTENT_OPS`) are retried, and only after a transport
error; ops that change the model or consume the sampler's stream never are.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

from verl.remote_backend.errors import (
    BackendClosedError,
    BackendDiedError,
    BackendOutputError,
    BackendTimeoutError,
)
from verl.remote_backend.settings.loader import load_settings, setting

__all__ = [
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
_FIX = "see the commented remote_backend.timeouts/liveness/retry block in remote_ppo_trainer.yaml"
_SECONDS_FIX = "use a positive number of seconds, or null for no limit"


def is_stop_error(exc: BaseException) -> bool:
    """An intended stop, e.g. our own teardown: a Ray actor death caused by ``ray.kill``, or a call
    on a destroyed client (:class:`BackendClosedError`)."""
    if isinstance(exc, BackendClosedError):
        return True
    return bool(_names(exc) & _DEATH_NAMES) and "killed by `ray.kill`" in str(exc)


# ---------------------------------------------------------------- settings
@dataclass(frozen=True)
class TimeoutSettings:
    """Per-op limits in seconds (``None`` = no limit). Defaults suit each op:
    generation and updates may take long on big models, health probes must be quick."""

    create: Optional[float] = setting(3600.0, gt=0, fix=_SECONDS_FIX)  # engine start: model load, Arctic job creation
    destroy: Optional[float] = setting(300.0, gt=0, fix=_SECONDS_FIX)
    health: Optional[float] = setting(10.0, gt=0, fix=_SECONDS_FIX)
    compute_log_prob: Optional[float] = setting(1800.0, gt=0, fix=_SECONDS_FIX)
    update_actor: Optional[float] = setting(
        7200.0, gt=0, fix=_SECONDS_FIX
    )  # every mini-batch and epoch of a global batch
    generate: Optional[float] = setting(
        1800.0, gt=0, fix=_SECONDS_FIX
    )  # one sample, possibly queued behind a large batch
    update_weights: Optional[float] = setting(900.0, gt=0, fix=_SECONDS_FIX)  # also used for the sampler's sleep/wake
    save_checkpoint: Optional[float] = setting(1800.0, gt=0, fix=_SECONDS_FIX)
    load_checkpoint: Optional[float] = setting(1800.0, gt=0, fix=_SECONDS_FIX)

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
    interval_s: float = setting(5.0, gt=0, fix=_FIX)
    failures: int = setting(2, ge=1, fix=_FIX)


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with jitter, for idempotent ops only (see :func:`is_retryable`).

    ``attempts`` counts every try (1 = no retry). Delay before retry ``k``
    (1-based) is ``min(max_delay_s, base_delay_s * 2**(k-1))``, multiplied by a
    random factor in ``[1 - jitter, 1 + jitter]`` so replicas do not retry in lockstep.
    """

    attempts: int = setting(3, ge=1, fix="1 = no retry")
    base_delay_s: float = setting(0.5, gt=0, fix=_FIX)
    max_delay_s: float = setting(8.0, gt=0, fix=_FIX)
    jitter: float = setting(0.25, ge=0, lt=1, fix=_FIX)

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
            ConfigError: an unknown key, or a value of the wrong type or out of range
                (timeouts may also be ``null``); the message names the key.
        """
        return cls(
            timeouts=load_settings(TimeoutSettings, main_config, f"{CONFIG_ROOT}.timeouts"),
            liveness=load_settings(LivenessSettings, main_config, f"{CONFIG_ROOT}.liveness"),
            retry=load_settings(RetryPolicy, main_config, f"{CONFIG_ROOT}.retry"),
        )


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
