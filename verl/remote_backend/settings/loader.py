"""The one way settings are read: a dotted-path reader and a typed dataclass loader.

``load_settings(Cls, main_config, "remote_backend.local")`` builds dataclass ``Cls``
from that block in one call: absent keys keep their defaults, unknown keys and wrong
types are refused, each field's constraints (declared with :func:`setting`) are
checked, nested dataclasses are built the same way, and ``Cls.__post_init__`` checks
rules that span fields. Every error is a :class:`ConfigError` naming the full dotted key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Optional, TypeVar, Union

from verl.remote_backend.errors import ConfigError

__all__ = ["select", "block", "setting", "load_settings", "build_settings"]

T = TypeVar("T")
_MISSING: Any = dataclasses.MISSING


def select(cfg: Any, dotted: str, default: Any = None) -> Any:
    """``cfg.<dotted>``, or ``default`` when a part is absent or the value is null.

    Walks an OmegaConf node, a plain mapping or an object with attributes (verl's config
    dataclasses), resolving interpolations of the value it reaches only.
    """
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        if isinstance(node, Mapping):
            try:
                node = node.get(part)
            except Exception:  # noqa: BLE001 - OmegaConf's "???" (missing mandatory value) reads as absent
                node = None
        else:
            node = getattr(node, part, None)
    return default if node is None else node


def block(cfg: Any, dotted: str) -> dict[str, Any]:
    """``cfg.<dotted>`` as a plain, resolved dict (``{}`` when absent or null).

    Only that block is resolved: resolving the whole main config would fail on
    unrelated interpolations.

    Raises:
        ConfigError: the value there is not a mapping.
    """
    node = select(cfg, dotted)
    if node is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(node, DictConfig):
            return dict(OmegaConf.to_container(node, resolve=True))  # type: ignore[arg-type]
    except ImportError:  # pragma: no cover - omegaconf ships with verl
        pass
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return dataclasses.asdict(node)
    if isinstance(node, Mapping):
        return dict(node)
    raise ConfigError(f"{dotted} must be a mapping of settings, got {type(node).__name__} ({node!r:.80})")


def setting(
    default: Any = _MISSING,
    *,
    default_factory: Any = _MISSING,
    choices: Optional[tuple] = None,
    gt: Optional[float] = None,
    ge: Optional[float] = None,
    lt: Optional[float] = None,
    fix: str = "",
) -> Any:
    """A dataclass field with its constraints, checked by the loader.

    ``choices``: the allowed values; ``gt``/``ge``/``lt``: numeric bounds (a null value,
    where the type allows it, skips them); ``fix``: what the error tells the user to do.
    """
    metadata = {"choices": choices, "gt": gt, "ge": ge, "lt": lt, "fix": fix}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def load_settings(cls: type[T], main_config: Any, key: str) -> T:
    """Dataclass ``cls`` built from the block at ``key`` of ``main_config`` (absent: all defaults)."""
    return build_settings(cls, block(main_config, key), key)


def build_settings(cls: type[T], raw: Optional[Mapping[str, Any]], key: str) -> T:
    """Dataclass ``cls`` built from mapping ``raw``, whose keys sit under dotted ``key``.

    Raises:
        ConfigError: an unknown key, a value of the wrong type or outside its field's
            constraints, or a rule of ``cls.__post_init__`` (naming the full dotted key).
    """
    raw = dict(raw or {})
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {[f'{key}.{name}' for name in unknown]}; known: {sorted(fields)}. "
            "Fix: correct the spelling or remove the key"
        )
    hints = typing.get_type_hints(cls)
    values = {name: _checked(f"{key}.{name}", value, hints[name], fields[name]) for name, value in raw.items()}
    return cls(**values)


def _checked(key: str, value: Any, hint: Any, field: dataclasses.Field) -> Any:
    """``value`` converted to ``hint`` and checked against ``field``'s constraints, or ``ConfigError``."""
    nullable, hint = _unwrap_optional(hint)
    if value is None:
        if not nullable:
            raise ConfigError(f"{key}=None: must be set (null is not allowed here)")
        return None
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={value!r}: must be a mapping of settings")
        return build_settings(hint, value, key)
    converted = _converted(key, value, hint, nullable)
    _check_constraints(key, converted, value, field.metadata)
    return converted


def _unwrap_optional(hint: Any) -> tuple[bool, Any]:
    if typing.get_origin(hint) in (Union, types.UnionType):  # Optional[X] and X | None
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return len(args) < len(typing.get_args(hint)), (args[0] if len(args) == 1 else Any)
    return False, hint


def _converted(key: str, value: Any, hint: Any, nullable: bool) -> Any:
    origin = typing.get_origin(hint) or hint
    or_null = " or null" if nullable else ""
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}={value!r}: must be true or false{or_null}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise ConfigError(f"{key}={value!r}: must be a whole number{or_null}")
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={value!r}: must be a number{or_null}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}={value!r}: must be a string{or_null}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}={value!r}: must be a list{or_null}")
        return list(value)
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={value!r}: must be a mapping{or_null}")
        return dict(value)
    return value


def _check_constraints(key: str, value: Any, raw: Any, rules: Mapping[str, Any]) -> None:
    """``value`` (converted) against ``rules``; errors quote ``raw``, the value as the user wrote it."""
    fix = f". Fix: {rules['fix']}" if rules.get("fix") else ""
    choices = rules.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{key}={raw!r}: must be one of {list(choices)}{fix}")
    gt, ge, lt = rules.get("gt"), rules.get("ge"), rules.get("lt")
    if ge is not None and lt is not None and not ge <= value < lt:
        raise ConfigError(f"{key}={raw!r}: must be in [{ge:g}, {lt:g}){fix}")
    if gt is not None and not value > gt:
        raise ConfigError(f"{key}={raw!r}: must be > {gt:g}{fix}")
    if ge is not None and not value >= ge:
        raise ConfigError(f"{key}={raw!r}: must be >= {ge:g}{fix}")
    if lt is not None and not value < lt:
        raise ConfigError(f"{key}={raw!r}: must be < {lt:g}{fix}")
