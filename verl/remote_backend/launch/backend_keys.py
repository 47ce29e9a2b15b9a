"""The ``remote_backend`` block: open to a third-party backend's own keys, strict where we own it.

This package owns ``remote_backend.{local,arctic,tinker}`` (one block per built-in backend) and
``remote_backend.{timeouts,liveness,retry}``; typos in those are refused as Hydra refuses any
unknown key. A third-party backend reads its settings where it chooses, often flat under
``remote_backend`` (Snowflake's plugin reads ``remote_backend.train``, ``remote_backend.comms``,
...). The entry point turns such a key on the command line into Hydra's add-or-override form
(``++``), so it needs no ``+``; validation refuses keys no built-in backend reads.
"""

from __future__ import annotations

import difflib
import re
from typing import TYPE_CHECKING, Optional, Sequence

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.registry import RemoteBackendRegistry

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["OWNED_BLOCKS", "SHARED_BLOCKS", "open_third_party_keys", "check_no_stray_backend_keys"]

#: Blocks every backend shares (reliability settings).
SHARED_BLOCKS = ("timeouts", "liveness", "retry")
#: Blocks this package owns: the shared ones and one per built-in backend.
OWNED_BLOCKS = SHARED_BLOCKS + tuple(RemoteBackendRegistry.MODULES)

# `remote_backend.<key>[.more]=value`, not already prefixed with +, ++ or ~.
_OVERRIDE = re.compile(r"^remote_backend\.(?P<key>[A-Za-z_][\w-]*)(?P<rest>[.\[][^=]*)?=")


def _near_owned_block(key: str) -> Optional[str]:
    close = difflib.get_close_matches(key, OWNED_BLOCKS, n=1, cutoff=0.75)
    return close[0] if close and close[0] != key else None


def open_third_party_keys(overrides: Sequence[str]) -> list[str]:
    """Command-line overrides with ``remote_backend.<key>...=v`` made ``++...`` for every
    ``<key>`` this package does not own (an override of an owned block is left to Hydra's
    strict check). Called by the entry point before Hydra parses the command line.

    Raises:
        ConfigError: ``<key>`` is one edit from an owned block (``remote_backend.timeuts.create``):
            a typo, not a third-party key.
    """
    out = []
    for item in overrides:
        match = _OVERRIDE.match(item)
        if match is None or match.group("key") in OWNED_BLOCKS:
            out.append(item)
            continue
        key = match.group("key")
        near = _near_owned_block(key)
        if near is not None:
            raise ConfigError.for_setting(
                f"remote_backend.{key}",
                item.split("=", 1)[1],
                f"remote_backend.{key} is not a block of this package; it looks like a typo of remote_backend.{near}",
                f"write remote_backend.{near}{match.group('rest') or ''}=...",
            )
        out.append("++" + item)
    return out


def check_no_stray_backend_keys(config: "DictConfig", name: str, backend_cls: type) -> None:
    """With a built-in backend, every key under ``remote_backend`` must be one of this package's
    blocks: nothing else reads a flat key, so it would be silently ignored. A third-party class
    (also one a plugin registered under a built-in name) reads keys of its own there, and nothing
    is checked."""
    if not RemoteBackendRegistry.is_builtin(backend_cls, name):  # a plugin's class under a built-in name
        return
    block = config.get("remote_backend") or {}
    stray = sorted(str(key) for key in block.keys() if key not in OWNED_BLOCKS)
    if stray:
        key = stray[0]
        raise ConfigError.for_setting(
            f"remote_backend.{key}",
            block.get(key),
            f"the built-in backend {name!r} reads remote_backend.{name}.* and the shared "
            f"remote_backend.{{{','.join(SHARED_BLOCKS)}}} only; remote_backend.{key} would be ignored",
            f"move it to remote_backend.{name}.{key} if it is a setting of {name!r}, or drop it",
        )
