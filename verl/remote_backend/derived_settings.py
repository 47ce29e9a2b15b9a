"""One switch: the verl keys a remote-backend run requires are derived from ``trainer.remote_backend``.

A verl GRPO command line describes verl's own engines (vLLM rollout with tensor parallelism, FSDP
workers on 8 GPUs per node, the legacy-worker switch). With a remote backend those engines are
not started, so the keys that describe them have exactly one valid value on the remote path.
This module sets them, so a user adds only the switch to verl's own command line.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from omegaconf import OmegaConf, open_dict

from verl.remote_backend.base import requires_single_forwarder
from verl.remote_backend.errors import ConfigError
from verl.remote_backend.settings import select
from verl.remote_backend.validation import REMOTE_ROLLOUT_NAME, backend_name

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["DerivedSetting", "derive_remote_settings", "explicit_override_keys", "describe"]

#: verl's own rollout engines: a value naming one describes the engine the backend replaces.
VERL_ROLLOUT_ENGINES = frozenset({"vllm", "sglang", "hf", "trtllm", "naive", "???"})

_PARALLEL_SIZES = (
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.data_parallel_size",
    "actor_rollout_ref.rollout.pipeline_model_parallel_size",
)


@dataclass(frozen=True)
class DerivedSetting:
    """One key the remote path set: ``key`` went from ``before`` to ``after`` because ``reason``."""

    key: str
    before: Any
    after: Any
    reason: str


def explicit_override_keys(overrides: Collection[str]) -> frozenset[str]:
    """Config keys named by Hydra command-line ``overrides`` (``key=value``, ``+key=``, ``++key=``)."""
    keys = set()
    for item in overrides:
        key = str(item).split("=", 1)[0].lstrip("+~")
        if key and not key.startswith("hydra."):
            keys.add(key)
    return frozenset(keys)


def derive_remote_settings(config: "DictConfig", explicit: Optional[Collection[str]] = None) -> list[DerivedSetting]:
    """Set, in place, every key whose value a remote-backend run requires; return what changed.

    ``explicit``: keys the user set on the command line (``None``: unknown, treated as defaults).
    Nothing happens when ``trainer.remote_backend`` is null.

    Raises:
        ConfigError: an explicit value the remote path cannot honour
            (``use_legacy_worker_impl=enable``, an accelerator ``trainer.device``, an unknown
            rollout engine), naming the key and the reason.
    """
    name = backend_name(config)
    if name is None:
        return []
    explicit = frozenset(explicit or ())
    changes: list[DerivedSetting] = []

    def require(key: str, value: Any, reason: str, *, refuse_explicit: Collection[Any] = ()) -> None:
        current = select(config, key)
        if current == value:
            return
        if key in explicit and current in refuse_explicit:
            raise ConfigError(
                f"{key}={current!r} was set explicitly, but with trainer.remote_backend={name} {reason}. "
                f"Fix: drop {key} from the command line (it is set to {value!r} for you)"
            )
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(config, parent) if parent else config
        with open_dict(node):
            node[leaf] = value
        changes.append(DerivedSetting(key, current, value, reason))

    require(
        "trainer.use_legacy_worker_impl",
        "disable",
        "verl's new worker path is the one remote backends plug into",
        refuse_explicit={"enable"},
    )
    require(
        "trainer.device",
        "cpu",
        "the verl side (driver, forwarders) computes nothing on an accelerator; the backend owns its devices",
        refuse_explicit={"cuda", "npu"},
    )
    rollout_name = select(config, "actor_rollout_ref.rollout.name")
    if rollout_name not in (REMOTE_ROLLOUT_NAME, name):
        unknown = rollout_name not in VERL_ROLLOUT_ENGINES and rollout_name is not None
        require(
            "actor_rollout_ref.rollout.name",
            REMOTE_ROLLOUT_NAME,
            "generation goes through the backend's sampler, not a rollout engine of verl's",
            refuse_explicit={rollout_name} if unknown else (),
        )
    for key in _PARALLEL_SIZES:
        if select(config, key) is not None:
            require(key, 1, "the backend parallelises sampling itself (one rollout replica per forwarder)")

    from verl.remote_backend.registry import RemoteBackendRegistry

    try:
        backend_cls = RemoteBackendRegistry.get(name)
    except Exception:  # noqa: BLE001 - an unknown or broken name: validation names it and the fix
        return changes
    if requires_single_forwarder(backend_cls):
        reason = f"backend {name!r} owns its parallelism: one CPU forwarder (its devices: remote_backend.{name}.*)"
        require("trainer.n_gpus_per_node", 1, reason)
        require("trainer.nnodes", 1, reason)
    return changes


def describe(name: str, changes: list[DerivedSetting]) -> str:
    """The one line the entry point prints: ``key=after (was before)`` for each derived key."""
    listed = ", ".join(f"{c.key}={c.after} (was {c.before})" for c in changes)
    return f"[remote_backend] set for trainer.remote_backend={name}: {listed}"
