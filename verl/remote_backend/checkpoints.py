"""Resume safety: find, check and report on verl's ``global_step_<N>`` checkpoints (pure, no Ray).

Policy - **fail clearly, never fall back silently.** A run resumes from exactly
the checkpoint verl picks (``latest_checkpointed_iteration.txt`` for
``resume_mode=auto``, ``trainer.resume_from_path`` otherwise). If that
checkpoint is missing, partial or corrupt, the run stops with
:class:`~verl.remote_backend.reliability.ResumeCheckpointError` naming the bad
file and listing the earlier *complete* checkpoints with the override that
resumes from one. We do not skip to an earlier one on our own: that would
silently replay steps and later overwrite newer artefacts; the user decides.

Two layers: config validation checks the checkpoint before any worker starts
(structure, sizes, checksums, verl's ``data.pt``); the backend's
``load_checkpoint`` verifies every checksum again before touching its state.

Checkpoints with a ``manifest.json`` in their ``actor/`` folder (the local
backend's format: step, files, sha256) are verified against it; other formats
are only checked for presence.

An interrupted write never reaches the tracker: verl updates
``latest_checkpointed_iteration.txt`` only after the actor checkpoint and the
dataloader state are written, and the local engine writes into a temporary
folder renamed into place at the end.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Optional

from verl.remote_backend.reliability import ResumeCheckpointError

__all__ = [
    "TRACKER_FILE",
    "DATALOADER_STATE",
    "tracker_step",
    "protected_checkpoint",
    "complete_checkpoints",
    "checkpoint_problem",
    "check_resume_checkpoint",
    "resume_failure",
    "step_of",
    "parse_global_step",
    "checkpoints_to_prune",
]

#: verl's tracker of the last *completed* checkpoint (written after everything else).
TRACKER_FILE = "latest_checkpointed_iteration.txt"
_ACTOR = "actor"
#: verl's dataloader state in every ``global_step_<N>`` folder.
DATALOADER_STATE = "data.pt"
_MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def tracker_step(root: str) -> Optional[int]:
    """The step in ``<root>/latest_checkpointed_iteration.txt``, or ``None`` (missing/unreadable)."""
    try:
        with open(os.path.join(root, TRACKER_FILE)) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


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


def checkpoint_problem(step_dir: str, *, checksums: bool = False) -> Optional[str]:
    """What is wrong with the verl checkpoint ``step_dir`` (``None`` when it looks complete).

    ``<step_dir>/actor``: with a manifest, every listed file present with its recorded
    size (and sha256 when ``checksums``); without one (another backend's format), the
    folder exists (the backend's own ``checkpoint_problem`` capability checks its files).
    ``<step_dir>/data.pt`` (verl's dataloader state, saved with every checkpoint): present
    and a readable torch archive whose entries pass their CRC check.
    """
    actor = os.path.join(step_dir, _ACTOR)
    if not os.path.isdir(step_dir):
        return f"{step_dir} does not exist"
    if not os.path.isdir(actor):
        return f"{step_dir} has no {_ACTOR}/ folder (a save that was interrupted before it finished?)"
    if os.path.isfile(os.path.join(actor, _MANIFEST)):
        from verl.workers.remote_client.local.checkpoint import CheckpointError, verify_checkpoint_dir

        try:
            verify_checkpoint_dir(actor, checksums=checksums)
        except CheckpointError as exc:
            return str(exc)
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


def complete_checkpoints(root: str, *, before: Optional[int] = None) -> list[str]:
    """``global_step_<K>`` folders under ``root`` that pass :func:`checkpoint_problem`, newest first."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    steps = sorted((int(m.group(1)) for m in map(_STEP_DIR.match, names) if m), reverse=True)
    return [
        os.path.join(root, f"global_step_{k}")
        for k in steps
        if (before is None or k < before) and checkpoint_problem(os.path.join(root, f"global_step_{k}")) is None
    ]


def step_of(step_dir: str) -> Optional[int]:
    """``N`` of a ``.../global_step_<N>`` folder, or ``None`` for another name."""
    m = _STEP_DIR.match(os.path.basename(os.path.normpath(step_dir)))
    return int(m.group(1)) if m else None


def resume_failure(step_dir: str, problem: str) -> ResumeCheckpointError:
    """The error for a resume that cannot proceed, listing complete earlier checkpoints and the fixes."""
    step_dir = os.path.abspath(step_dir)
    root = os.path.dirname(step_dir)
    earlier = complete_checkpoints(root, before=step_of(step_dir))
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


def check_resume_checkpoint(step_dir: str) -> None:
    """Raise :class:`ResumeCheckpointError` if the checkpoint a run would resume from is not complete.

    Cheap (sizes, no checksums): runs in config validation, before any worker starts.
    """
    problem = checkpoint_problem(step_dir, checksums=False)
    if problem is not None:
        raise resume_failure(step_dir, problem)


def tracker_target_problem(root: str) -> Optional[str]:
    """A tracker naming a step whose folder is missing (verl would then silently start from scratch)."""
    step = tracker_step(root)
    if step is None:
        return None
    step_dir = os.path.join(root, f"global_step_{step}")
    if os.path.isdir(step_dir):
        return None
    return f"{os.path.join(root, TRACKER_FILE)} names step {step}, but {step_dir} does not exist"


_STEP_RE = re.compile(r"global_step_(\d+)")


def parse_global_step(path: str) -> Optional[int]:
    """The ``N`` of the last ``global_step_N`` component of ``path``, else ``None``."""
    found = _STEP_RE.findall(str(path))
    return int(found[-1]) if found else None


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
