"""Where a string (a credential a test gave a run) ended up: files under folders, Ray's session logs."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def files_holding(roots: Iterable[Path], needle: str) -> list[Path]:
    """Every regular file under ``roots`` whose bytes contain ``needle`` (links are not followed)."""
    raw = needle.encode()
    found = []
    for root in roots:
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                path = Path(dirpath, name)
                if path.is_symlink() or not path.is_file():
                    continue
                with open(path, "rb") as fh:
                    if raw in fh.read():
                        found.append(path)
    return found


def ray_session_dirs() -> list[Path]:
    """This machine's Ray session folders (``<RAY_TMPDIR or /tmp>/ray/session_*``), links excluded."""
    base = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    return sorted(p for p in base.glob("session_2*") if p.is_dir() and not p.is_symlink())
