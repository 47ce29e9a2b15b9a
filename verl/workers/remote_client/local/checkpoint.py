"""Atomic, verifiable checkpoint directories.

A checkpoint is a directory of files plus ``manifest.json``::

    {"format": 1, "step": 12, "files": {"model.safetensors": {"sha256": "...", "bytes": 123}, ...}, ...}

It is written into a temporary sibling directory (same parent, so the final
rename stays on one filesystem) and moved into place only once every file and
the manifest are on disk: a crash leaves either the previous checkpoint or the
new one, never a half-written directory. Loading verifies the manifest first and
names the missing or corrupt file.

Nothing here pickles code: tensors go to safetensors, other state to
``torch.save`` payloads that load with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import shutil
import tempfile
import uuid
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch

from verl.remote_backend.errors import BackendError

__all__ = [
    "CheckpointError",
    "write_checkpoint_dir",
    "verify_checkpoint_dir",
    "checkpoint_problem",
    "get_rng_state",
    "set_rng_state",
    "MANIFEST",
    "FORMAT_VERSION",
]

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class CheckpointError(BackendError):
    """A checkpoint directory is missing, incomplete, corrupt or from another step (a
    ``RuntimeError``, as every :class:`BackendError`)."""


def write_checkpoint_dir(
    path: str,
    step: int,
    writers: Mapping[str, Callable[[str], None]],
    extra: Optional[Mapping[str, Any]] = None,
    needed_bytes: Optional[int] = None,
) -> str:
    """Atomically create (or replace) checkpoint directory ``path``.

    Args:
        path: final directory; its parent is created if needed.
        step: training step recorded in the manifest.
        writers: file name -> function writing that file at the given full path.
        extra: more JSON-serialisable manifest fields.
        needed_bytes: what the files take in all (estimated), named in the error of a save the
            disk refuses.

    Returns:
        the absolute path written.

    Raises:
        CheckpointSaveError: the storage refused the write (full, quota, read-only, not
            writable): nothing of this save is left (not even the parent it created), an
            existing ``path`` is untouched.
    """
    path = os.path.abspath(os.path.expanduser(path))
    parent = os.path.dirname(path)
    created = _missing_folders(parent)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise _refused(exc, path, needed_bytes, created) from exc
    # Leftovers of a write that was killed before its rename (one writer per path: none is live).
    for stale in glob.glob(os.path.join(glob.escape(parent), f".{glob.escape(os.path.basename(path))}.tmp-*")):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = None
    try:
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700; the checkpoint gets the user's normal mode
        files = {}
        for name, write in writers.items():
            target = os.path.join(tmp, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)  # nested names: "huggingface/config.json"
            write(target)
            _fsync_file(target)  # contents durable before the rename publishes them
            files[name] = {"sha256": _sha256(target), "bytes": os.path.getsize(target)}
        manifest = {"format": FORMAT_VERSION, "step": int(step), "files": files, **dict(extra or {})}
        with open(os.path.join(tmp, MANIFEST), "w") as fh:
            json.dump(manifest, fh, indent=2, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        _swap_in(tmp, path)
        _fsync_dir(parent)  # the rename itself durable
    except BaseException as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        refused = _refused(exc, path, needed_bytes, created)
        if refused is None:
            raise
        raise refused from exc
    return path


def _missing_folders(folder: str) -> list[str]:
    """``folder`` and its missing ancestors, deepest first (what ``makedirs`` would create)."""
    missing = []
    while folder and not os.path.exists(folder) and os.path.dirname(folder) != folder:
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


def _refused(exc: BaseException, path: str, needed_bytes: Optional[int], created: list[str]) -> Optional[Exception]:
    """The :class:`CheckpointSaveError` for a write the storage refused, after removing the folders
    this save created (a ``global_step_<N>/`` left empty would look like a save in progress);
    ``None`` for any other failure."""
    from verl.remote_backend.checkpoints import storage_failure

    refused = storage_failure(exc, path, needed_bytes=needed_bytes)
    if refused is not None:
        for folder in created:
            try:
                os.rmdir(folder)  # only if empty: never anything another writer put there
            except OSError:
                break
    return refused


def verify_checkpoint_dir(path: str, step: Optional[int] = None, *, checksums: bool = True) -> dict[str, Any]:
    """Check ``path`` against its manifest and return the manifest.

    ``checksums=False`` checks presence and sizes only (cheap: for listing
    candidates); loading always verifies the sha256 of every file.

    Raises:
        CheckpointError: the directory or manifest is missing, a listed file is
            missing, has another size or its checksum differs, or ``step`` is
            given and differs.
    """
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        parent, base = glob.escape(os.path.dirname(path)), glob.escape(os.path.basename(path))
        leftovers = sorted(
            glob.glob(os.path.join(parent, f".{base}.tmp-*")) + glob.glob(os.path.join(parent, f"{base}.old-*"))
        )
        hint = f" (an interrupted write left {[os.path.basename(p) for p in leftovers]})" if leftovers else ""
        raise CheckpointError(f"checkpoint directory {path} does not exist{hint}")
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise CheckpointError(f"{path} has no {MANIFEST}: it is not a complete local-backend checkpoint")
    try:
        with open(manifest_path) as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{manifest_path} is unreadable: {exc}") from exc
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{manifest_path} has format {manifest.get('format')!r}; expected {FORMAT_VERSION}")
    for name, meta in manifest.get("files", {}).items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise CheckpointError(f"checkpoint {path} is missing {name} (listed in {MANIFEST})")
        if meta.get("bytes") is not None and os.path.getsize(file) != int(meta["bytes"]):
            raise CheckpointError(
                f"checkpoint file {file} is truncated or corrupt: {os.path.getsize(file)} bytes, "
                f"{MANIFEST} says {meta['bytes']}"
            )
        if checksums and _sha256(file) != meta.get("sha256"):
            raise CheckpointError(f"checkpoint file {file} is corrupt: its sha256 does not match {MANIFEST}")
    if step is not None and int(manifest.get("step", -1)) != int(step):
        raise CheckpointError(f"checkpoint {path} is from step {manifest.get('step')}, not the requested step {step}")
    return manifest


def checkpoint_problem(path: str, step: Optional[int]) -> Optional[str]:
    """What keeps the engine from loading ``path`` for ``step`` (``None``: loadable).

    The full check :meth:`LocalEngine.load_checkpoint` makes: every file against the
    manifest, sha256 included, so a same-size corruption is caught before any worker starts.
    """
    try:
        verify_checkpoint_dir(path, step, checksums=True)
    except CheckpointError as exc:
        return str(exc)
    return None


def _umask() -> int:
    """The process umask, read without changing it (``os.umask`` would race other threads' files)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def _swap_in(tmp: str, path: str) -> None:
    if not os.path.exists(path):
        os.rename(tmp, path)
        return
    # Directories cannot be replaced by rename; move the old one aside first
    # so the new one appears in a single rename.
    old = f"{path}.old-{uuid.uuid4().hex[:8]}"
    os.rename(path, old)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(old, path)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _fsync_file(file: str) -> None:
    with open(file, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory fds: best effort
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sha256(file: str) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def get_rng_state(generator: torch.Generator) -> dict[str, Any]:
    """Every RNG a training step or sample can touch, in ``torch.load(weights_only=True)``-safe types."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "sampler": generator.get_state(),
    }


def set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    """Inverse of :func:`get_rng_state`."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(_as_tuple(state["python"]))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    generator.set_state(state["sampler"])


def _as_tuple(obj: Any) -> Any:
    return tuple(_as_tuple(o) for o in obj) if isinstance(obj, (list, tuple)) else obj
