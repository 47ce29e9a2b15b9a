"""Every value a backend hands back to verl, as small typed dataclasses.

Backends build these; the forwarder and the rollout server read them. Each type checks
its own structure where it is built (a wrong type fails in the backend's frame, not deep
inside verl); layout checks that need the batch live in :mod:`.output_checks`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

import torch

from verl.remote_backend.errors import BackendOutputError

__all__ = [
    "BackendDevice",
    "LogProbResult",
    "UpdateResult",
    "GenerateResult",
    "as_log_prob_result",
    "as_update_result",
    "as_generate_result",
]

#: A metric value: a number, one number per mini-/micro-batch, or a tensor of them.
MetricValue = Union[float, int, Sequence[float], torch.Tensor]


@dataclass(frozen=True)
class BackendDevice:
    """The accelerators an op ran on, for MFU.

    Example: ``BackendDevice("cuda", count=8, name="NVIDIA H100 80GB HBM3")``.
    """

    type: str  # device kind: "cuda", "cpu", ...
    count: int = 1  # devices that took part in the op
    peak_flops: Optional[float] = None  # dense FLOP/s of ONE device in the model's dtype; None: verl's table
    name: Optional[str] = None  # device model name, looked up in verl's table when peak_flops is None

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise BackendOutputError(f"BackendDevice.type must be a device kind such as 'cuda', got {self.type!r}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise BackendOutputError(f"BackendDevice.count must be an int >= 1, got {self.count!r}")
        if self.peak_flops is not None and not (_finite(self.peak_flops) and self.peak_flops > 0):
            raise BackendOutputError(
                f"BackendDevice.peak_flops must be a finite FLOP/s > 0 or None, got {self.peak_flops!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "count": self.count, "peak_flops": self.peak_flops, "name": self.name}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "BackendDevice":
        """Build from ``{"type", "count"?, "peak_flops"?, "name"?}`` (unknown keys refused)."""
        unknown = set(raw) - {"type", "count", "peak_flops", "name"}
        if unknown:
            raise BackendOutputError(
                f"device report has unknown keys {sorted(unknown)}; expected type/count/peak_flops/name"
            )
        peak = raw.get("peak_flops")
        return cls(
            type=str(raw.get("type", "")),
            count=int(raw.get("count", 1)),
            peak_flops=None if peak is None else float(peak),
            name=raw.get("name"),
        )


@dataclass
class LogProbResult:
    """What ``compute_log_prob`` returns.

    Per-token tensors are packed ``[T]`` in the order of the batch's ``input_ids.values()``
    (an NJT with the batch's offsets is accepted too); slot ``t`` of a row holds
    ``log p(token[t+1] | token[:t+1])`` and the last slot of each row is 0.
    Example: ``LogProbResult(log_probs=lp, entropy=None, device=BackendDevice("cpu"), compute_s=0.8)``.
    """

    log_probs: torch.Tensor  # float [T]
    entropy: Optional[torch.Tensor] = None  # float [T]; required when calculate_entropy was asked
    metrics: dict[str, MetricValue] = field(default_factory=dict)  # verl names without "actor/"
    device: Optional[BackendDevice] = None  # where it ran (for MFU); None: MFU logged as 0
    compute_s: Optional[float] = None  # seconds the engine computed, excluding its transport

    def __post_init__(self) -> None:
        _check_float_tensor(self.log_probs, "LogProbResult.log_probs")
        if self.entropy is not None:
            _check_float_tensor(self.entropy, "LogProbResult.entropy")
        _check_common(self, "LogProbResult")


@dataclass
class UpdateResult:
    """What ``update_actor`` returns for the whole global batch.

    Example: ``UpdateResult(metrics={"pg_loss": [0.1, 0.2], "grad_norm": [1.3, 0.9], "lr": 1e-6},
    loss=0.3, global_token_num=[412, 388], device=BackendDevice("cuda", 8))``.
    """

    metrics: dict[str, MetricValue]  # verl's actor metric names without "actor/": pg_loss, grad_norm, lr, ...
    loss: Optional[MetricValue] = None  # sum over mini-batches of the mean loss
    global_token_num: Optional[list[int]] = None  # tokens per sample (for MFU); None: the batch's lengths
    device: Optional[BackendDevice] = None
    compute_s: Optional[float] = None

    def __post_init__(self) -> None:
        if not isinstance(self.metrics, Mapping):
            raise BackendOutputError(
                f"UpdateResult.metrics must be a mapping of name -> number(s), got {_describe(self.metrics)}"
            )
        for name, value in self.metrics.items():
            if not _numeric(value):
                raise BackendOutputError(
                    f"UpdateResult.metrics[{name!r}] must be a number, a list of numbers or a tensor, "
                    f"got {_describe(value)}"
                )
        if self.loss is not None and not _numeric(self.loss):
            raise BackendOutputError(
                f"UpdateResult.loss must be a number or a list of numbers, got {_describe(self.loss)}"
            )
        if self.global_token_num is not None:
            tokens = self.global_token_num
            if isinstance(tokens, torch.Tensor):
                tokens = tokens.tolist()
            if not isinstance(tokens, Sequence) or isinstance(tokens, (str, bytes)):
                raise BackendOutputError(
                    f"UpdateResult.global_token_num must be a list of ints, got {_describe(tokens)}"
                )
            bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or t < 0]
            if bad:
                raise BackendOutputError(f"UpdateResult.global_token_num must be non-negative ints, got {bad[:5]}")
            self.global_token_num = list(tokens)
        _check_common(self, "UpdateResult")


@dataclass
class GenerateResult:
    """What ``generate`` returns for one request.

    Example: ``GenerateResult(token_ids=[791, 4320, 2], log_probs=[-0.2, -1.1, -0.05])``.
    """

    token_ids: list[int]  # <= max_tokens ids; ends with EOS when it stopped there
    log_probs: Optional[list[float]] = None  # one per token (sampling distribution) when asked
    stop_reason: Literal["completed", "aborted"] = "completed"

    def __post_init__(self) -> None:
        ids = list(self.token_ids) if isinstance(self.token_ids, (Sequence, torch.Tensor)) else None
        if ids is None:
            raise BackendOutputError(
                f"GenerateResult.token_ids must be a list of ints, got {_describe(self.token_ids)}"
            )
        bad = [t for t in ids if isinstance(t, bool) or not (isinstance(t, int) or hasattr(t, "__index__"))]
        if bad:
            raise BackendOutputError(f"GenerateResult.token_ids must be ints, got {bad[0]!r}")
        self.token_ids = [int(t) for t in ids]
        if self.log_probs is not None:
            self.log_probs = [float(x) for x in self.log_probs]
            if len(self.log_probs) != len(self.token_ids):
                raise BackendOutputError(
                    f"GenerateResult has {len(self.log_probs)} log-probs for {len(self.token_ids)} tokens"
                )
        if self.stop_reason not in ("completed", "aborted"):
            raise BackendOutputError(
                f"GenerateResult.stop_reason must be 'completed' or 'aborted', got {self.stop_reason!r}"
            )


# ---------------------------------------------------------------- legacy dict results
_DEPRECATION = (
    "{op}: returning a dict is deprecated and will stop working in the next release; "
    "return verl.remote_backend.{cls} instead (see the README's adapter example)"
)


def _legacy(op: str, cls: type) -> None:
    warnings.warn(_DEPRECATION.format(op=op, cls=cls.__name__), DeprecationWarning, stacklevel=3)


def as_log_prob_result(raw: Any, op: str = "compute_log_prob") -> LogProbResult:
    """``raw`` as a :class:`LogProbResult`; a legacy ``{"model_output": {...}, ...}`` dict is
    converted with a ``DeprecationWarning``. Raises :class:`BackendOutputError` otherwise."""
    if isinstance(raw, LogProbResult):
        return raw
    if not isinstance(raw, Mapping) or not isinstance(raw.get("model_output"), Mapping):
        raise BackendOutputError(f"{op}: expected a LogProbResult, got {_describe(raw)}")
    _legacy(op, LogProbResult)
    output = raw["model_output"]
    if output.get("log_probs") is None:
        raise BackendOutputError(f"{op}: result['model_output'] has no 'log_probs' (keys present: {sorted(output)})")
    return LogProbResult(
        log_probs=output["log_probs"],
        entropy=output.get("entropy"),
        metrics=dict(raw.get("metrics") or {}),
        device=_legacy_device(raw.get("device")),
        compute_s=_legacy_compute_s(raw.get("timing")),
    )


def as_update_result(raw: Any, op: str = "update_actor") -> UpdateResult:
    """``raw`` as an :class:`UpdateResult`; a legacy ``{"metrics", "loss"?, ...}`` dict is
    converted with a ``DeprecationWarning``. Raises :class:`BackendOutputError` otherwise."""
    if isinstance(raw, UpdateResult):
        return raw
    if not isinstance(raw, Mapping) or "metrics" not in raw:
        raise BackendOutputError(f"{op}: expected an UpdateResult, got {_describe(raw)}")
    _legacy(op, UpdateResult)
    return UpdateResult(
        metrics=raw["metrics"],
        loss=raw.get("loss"),
        global_token_num=raw.get("global_token_num"),
        device=_legacy_device(raw.get("device")),
        compute_s=_legacy_compute_s(raw.get("timing")),
    )


def as_generate_result(raw: Any, op: str = "generate") -> GenerateResult:
    """``raw`` as a :class:`GenerateResult`; a legacy ``{"token_ids", ...}`` dict, or a list
    holding exactly one (the seed contract's adapters return their engine's per-prompt result
    list for the one prompt), is converted with a ``DeprecationWarning``. Raises
    :class:`BackendOutputError` otherwise."""
    if isinstance(raw, GenerateResult):
        return raw
    if isinstance(raw, (list, tuple)) and raw and all(isinstance(item, Mapping) for item in raw):
        if len(raw) != 1:
            raise BackendOutputError(f"{op}: one prompt was sent, but the backend returned {len(raw)} results")
        raw = raw[0]
    if not isinstance(raw, Mapping) or "token_ids" not in raw:
        raise BackendOutputError(f"{op}: expected a GenerateResult, got {_describe(raw)}")
    _legacy(op, GenerateResult)
    return GenerateResult(
        token_ids=raw["token_ids"], log_probs=raw.get("log_probs"), stop_reason=raw.get("stop_reason") or "completed"
    )


def _legacy_device(raw: Any) -> Optional[BackendDevice]:
    if raw is None or isinstance(raw, BackendDevice):
        return raw
    if not isinstance(raw, Mapping):
        raise BackendOutputError(f"result 'device' must be a BackendDevice, got {_describe(raw)}")
    return BackendDevice.from_dict(raw)


def _legacy_compute_s(raw: Any) -> Optional[float]:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or "compute_s" not in raw:
        raise BackendOutputError(f"result 'timing' must be {{'compute_s': seconds >= 0}}, got {raw!r}")
    try:
        return float(raw["compute_s"])
    except (TypeError, ValueError):
        raise BackendOutputError(f"result 'timing' must be {{'compute_s': seconds >= 0}}, got {raw!r}") from None


# ---------------------------------------------------------------- shared checks
def _check_common(result: Any, cls: str) -> None:
    if result.device is not None and not isinstance(result.device, BackendDevice):
        raise BackendOutputError(f"{cls}.device must be a BackendDevice or None, got {_describe(result.device)}")
    if result.compute_s is not None:
        if isinstance(result.compute_s, bool) or not isinstance(result.compute_s, (int, float)):
            raise BackendOutputError(f"{cls}.compute_s must be seconds >= 0, got {result.compute_s!r}")
        if not (_finite(result.compute_s) and result.compute_s >= 0):
            raise BackendOutputError(f"{cls}.compute_s must be seconds >= 0, got {result.compute_s!r}")
    if not isinstance(result.metrics, Mapping):
        raise BackendOutputError(f"{cls}.metrics must be a mapping, got {_describe(result.metrics)}")


def _check_float_tensor(value: Any, where: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise BackendOutputError(f"{where}: expected a float tensor of packed shape [T], got {_describe(value)}")
    if not value.is_floating_point():
        raise BackendOutputError(f"{where}: expected a floating dtype, got {value.dtype}")


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _numeric(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return not value.is_nested
    if isinstance(value, (bool, int, float)) or type(value).__module__ == "numpy":
        return True
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return all(_numeric(v) for v in value)
    return hasattr(value, "aggregate")  # a verl Metric passes through unchanged


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        shape = "nested" if value.is_nested else list(value.shape)
        return f"a tensor of shape {shape} and dtype {value.dtype}"
    return f"a {type(value).__name__}"
