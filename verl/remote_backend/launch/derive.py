"""One switch: the verl keys a remote-backend run requires are derived from ``trainer.remote_backend``.

A verl GRPO command line describes verl's own engines (vLLM rollout with tensor parallelism, FSDP
workers on 8 GPUs per node, the legacy-worker switch). With a remote backend those engines are
not started, so the keys that describe them have exactly one valid value on the remote path.
This module sets them (the table is :mod:`verl.remote_backend.launch.rules`, which validation checks
against), so a user adds only the switch to verl's own command line.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from omegaconf import OmegaConf, open_dict

from verl.remote_backend.base import requires_single_forwarder
from verl.remote_backend.errors import ConfigError
from verl.remote_backend.launch.rules import required_settings
from verl.remote_backend.launch.validation import backend_class_or_none, backend_name
from verl.remote_backend.settings.loader import select
from verl.remote_backend.verl_versions import verl_glue

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["DerivedSetting", "derive_remote_settings", "explicit_override_keys", "describe"]


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
    """Set, in place, every key whose value a remote-backend run requires, and the installed
    release's defaults for a remote run (``release_defaults``) the user did not set; return what changed.

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
    backend_cls = backend_class_or_none(name)
    try:
        single = backend_cls is not None and requires_single_forwarder(backend_cls)
    except Exception:  # noqa: BLE001 - a broken declaration: validation names it and the fix
        single = False
    changes: list[DerivedSetting] = []
    for rule in required_settings(config, name, single):
        current = select(config, rule.key)
        if rule.accepts(current):
            continue
        if rule.key in explicit and rule.refuse_explicit(current):
            raise ConfigError(
                f"{rule.key}={current!r} was set explicitly, but with trainer.remote_backend={name} {rule.reason}. "
                f"Fix: drop {rule.key} from the command line (it is set to {rule.value!r} for you)"
            )
        _set(config, rule.key, rule.value)
        changes.append(DerivedSetting(rule.key, current, rule.value, rule.reason))
    # The installed release's defaults for a remote run: any value works, the user's is kept.
    for key, value, reason in verl_glue().release_defaults(config):
        current = select(config, key)
        if key not in explicit and current != value:
            _set(config, key, value)
            changes.append(DerivedSetting(key, current, value, reason))
    return changes


def _set(config: "DictConfig", key: str, value: Any) -> None:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(config, parent) if parent else config
    with open_dict(node):
        node[leaf] = value


def describe(name: str, changes: list[DerivedSetting]) -> str:
    """The one line the entry point prints: ``key=after (was before)`` for each derived key."""
    listed = ", ".join(f"{c.key}={c.after} (was {c.before})" for c in changes)
    return f"[remote_backend] set for trainer.remote_backend={name}: {listed}"
