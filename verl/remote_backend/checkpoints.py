"""verl's ``global_step_<N>`` checkpoints, format-agnostic: tracker, retention, resume selection and checks.

A run resumes from exactly the checkpoint verl picks, or stops with
:class:`~verl.remote_backend.errors.ResumeCheckpointError` naming the bad file and the
earlier *complete* checkpoints - never falling back silently. This module knows verl's
part (the folder, ``actor/``, ``data.pt``, the tracker); what is inside ``actor/`` is the
backend's format, checked by the ``format_problem`` hook the caller passes (a backend's
``checkpoint_problem(actor_dir, step)``).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from typing import Callable, Optional

from verl.remote_backend.errors import CheckpointSaveError, ResumeCheckpointError

__all__ = [
    "TRACKER_FILE",
    "DATALOADER_STATE",
    "FormatProblem",
    "tracker_step",
    "tracker_target_problem",
    "protected_checkpoint",
    "parse_global_step",
    "checkpoints_to_prune",
    "select_resume_checkpoint",
    "checkpoint_problem",
    "complete_checkpoints",
    "check_resume_checkpoint",
    "resume_failure",
    "storage_failure",
    "exception_chain",
]

#: verl's tracker of the last *completed* checkpoint (written after everything else).
TRACKER_FILE = "latest_checkpointed_iteration.txt"
#: verl's dataloader state in every ``global_step_<N>`` folder.
DATALOADER_STATE = "data.pt"
_ACTOR = "actor"
_GLOBAL_STEP = re.compile(r"global_step_(\d+)")

#: A backend's check of its own files: ``(actor_dir, step) -> problem or None``.
FormatProblem = Callable[[str, Optional[int]], Optional[str]]


# ---------------------------------------------------------------- verl's tracker
def tracker_step(root: str) -> Optional[int]:
    """The step in ``<root>/latest_checkpointed_iteration.txt``, or ``None`` (missing/unreadable)."""
    try:
        with open(os.path.join(root, TRACKER_FILE)) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def tracker_target_problem(root: str) -> Optional[str]:
    """A tracker naming a step whose folder is missing (verl would then silently start from scratch)."""
    step = tracker_step(root)
    if step is None:
        return None
    step_dir = os.path.join(root, f"global_step_{step}")
    if os.path.isdir(step_dir):
        return None
    return f"{os.path.join(root, TRACKER_FILE)} names step {step}, but {step_dir} does not exist"


def protected_checkpoint(actor_path: str) -> Optional[str]:
    """The actor folder of the step verl's tracker names, next to ``actor_path``
    (``<root>/global_step_<N>/actor``) - the one checkpoint a retention rule must never delete
    before verl has confirmed a newer one."""
    step_dir = os.path.dirname(os.path.abspath(actor_path))
    root = os.path.dirname(step_dir)
    step = tracker_step(root)
    if step is None:
        return None
    return os.path.join(root, f"global_step_{step}", os.path.basename(os.path.abspath(actor_path)))


def parse_global_step(path: str) -> Optional[int]:
    """The ``N`` of the last ``global_step_N`` component of ``path``, else ``None``."""
    steps = [int(m.group(1)) for m in map(_GLOBAL_STEP.fullmatch, os.path.normpath(str(path)).split(os.sep)) if m]
    return steps[-1] if steps else None


# ---------------------------------------------------------------- retention
def checkpoints_to_prune(saved: Sequence[str], max_keep: Optional[int], *, protect: Optional[str] = None) -> list[str]:
    """Oldest entries of ``saved`` (oldest first) beyond the newest ``max_keep``.

    ``None`` or a value <= 0 keeps everything, as in verl's checkpoint managers.
    ``protect`` (the checkpoint verl's tracker names) is never pruned, so a crash
    between saving a new checkpoint and verl confirming it leaves one to resume from.
    """
    if max_keep is None or max_keep <= 0 or len(saved) <= max_keep:
        return []
    keep = None if protect is None else os.path.normpath(os.path.abspath(protect))
    return [p for p in saved[: len(saved) - max_keep] if keep is None or os.path.normpath(os.path.abspath(p)) != keep]


# ---------------------------------------------------------------- resume
def select_resume_checkpoint(
    resume_mode: str, resume_from_path: Optional[str], default_local_dir: str
) -> Optional[str]:
    """The ``global_step_<N>`` folder verl's ``_load_checkpoint`` would load, or ``None``.

    Raises:
        ResumeCheckpointError: ``resume_mode=auto`` and verl's tracker names a step whose
            folder is gone (verl would then start from scratch without a word).
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        return str(resume_from_path)
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    folder = default_local_dir if os.path.isabs(default_local_dir) else os.path.join(os.getcwd(), default_local_dir)
    missing = tracker_target_problem(folder)
    if missing is not None:
        raise resume_failure(os.path.join(folder, "global_step_<tracked>"), missing)
    return find_latest_ckpt_path(folder)


def checkpoint_problem(step_dir: str, *, format_problem: Optional[FormatProblem] = None) -> Optional[str]:
    """What is wrong with the verl checkpoint ``step_dir`` (``None`` when it looks complete).

    ``<step_dir>/actor`` exists and passes ``format_problem`` (the backend's check of its
    own files, when given); ``<step_dir>/data.pt`` (verl's dataloader state, saved with
    every checkpoint) is present and a readable torch archive whose entries pass their CRC.
    """
    actor = os.path.join(step_dir, _ACTOR)
    if not os.path.isdir(step_dir):
        return f"{step_dir} does not exist"
    if not os.path.isdir(actor):
        return f"{step_dir} has no {_ACTOR}/ folder (a save that was interrupted before it finished?)"
    if format_problem is not None:
        problem = format_problem(actor, parse_global_step(step_dir))
        if problem is not None:
            return problem
    return _dataloader_state_problem(step_dir)


def _dataloader_state_problem(step_dir: str) -> Optional[str]:
    import zipfile

    path = os.path.join(step_dir, DATALOADER_STATE)
    if not os.path.isfile(path):
        return f"{path} is missing (verl's dataloader state, written with every checkpoint: the save did not finish)"
    try:
        with zipfile.ZipFile(path) as archive:  # torch.save's format; testzip reads every entry and checks its CRC
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        return f"{path} is truncated or corrupt ({type(exc).__name__}: {exc})"
    if bad is not None:
        return f"{path} is corrupt: its entry {bad!r} fails its CRC check"
    return None


def complete_checkpoints(
    root: str, *, before: Optional[int] = None, format_problem: Optional[FormatProblem] = None
) -> list[str]:
    """``global_step_<K>`` folders under ``root`` (``K < before`` if given) that pass
    :func:`checkpoint_problem`, newest first."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    steps = sorted((int(m.group(1)) for m in map(_GLOBAL_STEP.fullmatch, names) if m), reverse=True)
    folders = [os.path.join(root, f"global_step_{k}") for k in steps if before is None or k < before]
    return [f for f in folders if checkpoint_problem(f, format_problem=format_problem) is None]


def check_resume_checkpoint(step_dir: str, *, format_problem: Optional[FormatProblem] = None) -> None:
    """Raise :class:`ResumeCheckpointError` if the checkpoint a run would resume from is not complete."""
    problem = checkpoint_problem(step_dir, format_problem=format_problem)
    if problem is not None:
        raise resume_failure(step_dir, problem, format_problem=format_problem)


def resume_failure(
    step_dir: str, problem: str, *, format_problem: Optional[FormatProblem] = None
) -> ResumeCheckpointError:
    """The error for a resume that cannot proceed, listing complete earlier checkpoints and the fixes."""
    step_dir = os.path.abspath(step_dir)
    root = os.path.dirname(step_dir)
    earlier = complete_checkpoints(root, before=parse_global_step(step_dir), format_problem=format_problem)
    if earlier:
        fix = (
            f"complete earlier checkpoints: {earlier[:3]}. Resume from the newest with "
            f"trainer.resume_mode=resume_path trainer.resume_from_path={earlier[0]}, or start over with "
            "trainer.resume_mode=disable"
        )
    else:
        fix = "no complete earlier checkpoint exists; start over with trainer.resume_mode=disable"
    return ResumeCheckpointError(
        f"cannot resume from {step_dir}: {problem}. Nothing was loaded (a partial or corrupt checkpoint is never "
        f"loaded, and no other one is picked silently); {fix}."
    )


# ---------------------------------------------------------------- saves that hit the disk's limits
#: errno -> what the storage refused; a save failing with one of these is the disk's fault, not the run's.
_STORAGE_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EFBIG: "file too large for the file system",
}
#: The same failures as writers that do not raise ``OSError`` word them: safetensors
#: (``IoError(Os { code: 28, kind: StorageFull, ... })``) and torch's archive writer, which keeps
#: no errno and reports a short write (``[enforce fail at inline_container.cc] ... unexpected pos
#: 576 vs 534`` or ``... file write failed``: measured on a full tmpfs).
_STORAGE_MESSAGES = {
    "No space left on device": _STORAGE_ERRNOS[errno.ENOSPC],
    "StorageFull": _STORAGE_ERRNOS[errno.ENOSPC],
    "Disk quota exceeded": _STORAGE_ERRNOS[errno.EDQUOT],
    "Read-only file system": _STORAGE_ERRNOS[errno.EROFS],
    "unexpected pos": "a write came up short: no space left on the device (or a failing one)",
    "file write failed": "a write came up short: no space left on the device (or a failing one)",
}


def exception_chain(exc: Optional[BaseException]) -> Iterator[BaseException]:
    """``exc``, then what caused it (``__cause__``, else ``__context__``), each once: how a save's
    failure reaches the trainer wrapped by Ray or the forwarder."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _storage_reason(exc: BaseException) -> Optional[str]:
    """What the storage refused, from ``exc`` or one of its causes; ``None`` when it is not a storage failure."""
    for link in exception_chain(exc):
        if isinstance(link, OSError) and link.errno in _STORAGE_ERRNOS:
            return _STORAGE_ERRNOS[link.errno]
        text = str(link)
        for needle, reason in _STORAGE_MESSAGES.items():
            if needle in text:
                return reason
    return None


def storage_failure(
    exc: BaseException, folder: str, *, needed_bytes: Optional[int] = None, what: str = "checkpoint"
) -> Optional[CheckpointSaveError]:
    """The :class:`CheckpointSaveError` for a save into ``folder`` that ``exc`` ended, when the
    storage refused it (full, over quota, read-only, not writable); ``None`` for any other failure
    (the caller re-raises ``exc`` as it is).

    Called by a backend's checkpoint writer and by the trainer around verl's ``data.pt`` and
    tracker, *after* they removed what the failed save left. ``needed_bytes``: what the whole
    save writes (estimated by the caller), stated next to the space free.
    """
    reason = _storage_reason(exc)
    if reason is None:
        return None
    folder = os.path.abspath(folder)
    probe = folder
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        free = f"{shutil.disk_usage(probe).free / 2**20:.1f} MiB free there"
    except OSError:
        free = "free space unknown"
    needed = f", this {what} needs about {needed_bytes / 2**20:.1f} MiB" if needed_bytes else ""
    return CheckpointSaveError(
        f"{what} not saved in {folder}: {reason} ({free}{needed}). What this save wrote was "
        "removed and the previous complete checkpoint is untouched (resume selects it). Fix: free space there, "
        "or set trainer.default_local_dir to a writable folder on a larger disk (a save needs room for one more "
        f"checkpoint next to the kept ones: trainer.max_actor_ckpt_to_keep). Cause: {type(exc).__name__}: {exc}"
    )
