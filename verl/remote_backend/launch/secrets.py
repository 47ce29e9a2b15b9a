"""Credentials in settings: declared by their backend, never printed or written by verl or by us.

A backend names its credential settings and the environment variable each is read from
(:meth:`~verl.remote_backend.base.RemoteBackend.secret_settings`). The entry point moves a value
given for one of them into that variable and leaves the setting null: from the command line
before Hydra records it (``.hydra/overrides.yaml``), from a config file or an interpolation
before verl prints the resolved config (and Hydra's copy of it is masked). The processes of a
local Ray cluster inherit the driver's environment, so the backend finds the value there.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.settings.loader import select

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["MASK", "declared_secrets", "move_secret_overrides", "hide_secrets", "check_secrets_reach_workers"]

#: What a credential reads as wherever this package shows one.
MASK = "***"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BACKEND_OVERRIDE = re.compile(r"^\+{0,2}trainer\.remote_backend=(?P<name>.*)$")
# Settings the entry point moved off this process's command line (before Hydra, so run() cannot see them).
_moved: list[str] = []


def declared_secrets(backend_cls: type) -> dict[str, str]:
    """``backend_cls.secret_settings()`` checked: ``{dotted key: environment variable name}``.

    Raises:
        TypeError: the adapter declared something else (names the class and what it returned).
    """
    declared = backend_cls.secret_settings()
    ok = isinstance(declared, dict) and all(
        isinstance(k, str) and isinstance(v, str) and _ENV_NAME.match(v) for k, v in declared.items()
    )
    if not ok:
        raise TypeError(
            f"{backend_cls.__qualname__}.secret_settings() must return {{dotted key: environment variable name}}, "
            f"got {declared!r}"
        )
    return declared


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _backend_from_command_line(argv: Sequence[str]) -> Optional[type]:
    from verl.remote_backend.launch.validation import backend_class_or_none, backend_name

    names = [m.group("name") for m in map(_BACKEND_OVERRIDE.match, argv) if m]
    if not names:
        return None
    return backend_class_or_none(backend_name({"trainer": {"remote_backend": _unquote(names[-1])}}))


def move_secret_overrides(argv: Sequence[str]) -> list[str]:
    """``argv`` without the overrides of the credential settings of the backend it names
    (``trainer.remote_backend=<name>``); each value is put in its environment variable instead.
    Called by the entry point before Hydra parses (and records) the command line."""
    backend_cls = _backend_from_command_line(argv)
    if backend_cls is None:
        return list(argv)
    declared = declared_secrets(backend_cls)
    kept = []
    for item in argv:
        key, sep, value = item.lstrip("+").partition("=")
        if sep and key in declared:
            os.environ[declared[key]] = _unquote(value)
            _moved.append(key)
        else:
            kept.append(item)
    return kept


def hide_secrets(config: "DictConfig", backend_cls: type, hydra_dir: Optional[Path] = None) -> list[str]:
    """Move every credential setting of ``backend_cls`` that holds a value in the composed
    ``config`` (a config file's literal, an interpolation) into its environment variable, set the
    setting to null, and mask the value in Hydra's record of the run (``hydra_dir``, the
    ``.hydra`` folder). Called on the driver before anything prints the config. Returns the
    keys moved."""
    from omegaconf import OmegaConf, open_dict

    moved, values = [], []  # not recorded in _moved: each run's config reports its own
    for key, env in declared_secrets(backend_cls).items():
        value = select(config, key)
        if value is None:
            continue
        os.environ[env] = str(value)
        with open_dict(config):
            OmegaConf.update(config, key, None, merge=False, force_add=True)
        moved.append(key)
        values.append(str(value))
    if hydra_dir is not None and values:
        _mask_files(Path(hydra_dir), values)
    return moved


def _masked(node: Any, values: list[str]) -> Any:
    if isinstance(node, str):
        for value in values:
            node = node.replace(value, MASK)
        return node
    if isinstance(node, dict):
        return {k: _masked(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [_masked(v, values) for v in node]
    return node


def _mask_files(folder: Path, values: list[str]) -> None:
    """Rewrite each YAML file of ``folder`` that holds one of ``values`` with it masked (still valid YAML)."""
    import yaml

    for path in sorted(folder.glob("*.yaml")):
        text = path.read_text()
        if any(value in text for value in values):
            path.write_text(yaml.safe_dump(_masked(yaml.safe_load(text), values), sort_keys=False))


def check_secrets_reach_workers(config: Any, moved: Sequence[str] = ()) -> None:
    """A credential moved to the driver's environment (``moved``: by :func:`hide_secrets` for this
    config, plus those :func:`move_secret_overrides` took off the command line) reaches the workers
    of a Ray cluster this run starts, not those of an existing cluster
    (``ray_kwargs.ray_init.address`` or ``RAY_ADDRESS``): refuse that before Ray starts rather than
    let the backend run without it.

    Raises:
        ConfigError: names the setting, the variable and the fix.
    """
    address = select(config, "ray_kwargs.ray_init.address") or os.environ.get("RAY_ADDRESS")
    keys = [*moved, *_moved]
    if not keys or address in (None, "", "local"):
        return
    key = keys[0]
    raise ConfigError.for_setting(
        key,
        MASK,
        f"a credential set in the config reaches only the processes of a Ray cluster this run starts, not those of "
        f"the existing cluster at {address} (passing it through Ray's runtime_env would print it)",
        "export the backend's environment variable on every node of that cluster and leave the setting unset",
    )
