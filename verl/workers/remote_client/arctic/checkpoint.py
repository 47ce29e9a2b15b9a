"""The Arctic backend's checkpoint format inside verl's ``global_step_<N>/actor`` folder (no Arctic import).

What the Arctic RL server writes for ``save(path=<actor dir>, step=N)``
(``http_server.save`` -> ``DeepSpeedWorker.save_checkpoint`` -> DeepSpeed's
``engine.save_checkpoint``)::

    <actor dir>/latest                         "N"  (the server's pointer to its newest checkpoint-N)
    <actor dir>/checkpoint-N/latest            "global_step<K>"  (DeepSpeed's tag; K = optimizer steps)
    <actor dir>/checkpoint-N/global_step<K>/mp_rank_00_model_states.pt   (+ ZeRO optimizer shards)

and what this adapter adds after the server confirms the save::

    <actor dir>/arctic_checkpoint.json         {"step": N, "engine_global_step": K, "path": ...}

The record makes resume honest: the server answers ``/load-checkpoint`` with HTTP
200 and ``global_step: 0`` when DeepSpeed finds nothing to load, so the adapter
compares the step the server reports with the one recorded at save time.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

__all__ = ["RECORD_FILE", "DS_MODEL_STATES", "checkpoint_dir", "checkpoint_problem", "write_record", "recorded_engine_step"]

RECORD_FILE = "arctic_checkpoint.json"
DS_MODEL_STATES = "mp_rank_00_model_states.pt"


def checkpoint_dir(actor_dir: str, step: int) -> str:
    """``<actor dir>/checkpoint-<step>``: where the server saves for (and loads from) verl's step."""
    return os.path.join(actor_dir, f"checkpoint-{int(step)}")


def checkpoint_problem(actor_dir: str, step: Optional[int]) -> Optional[str]:
    """What keeps the server from loading verl's step ``step`` from ``actor_dir`` (``None``: looks loadable).

    Checks the files DeepSpeed's ``load_checkpoint`` needs: ``checkpoint-<step>/latest`` naming a tag
    folder that holds ``mp_rank_00_model_states.pt``. The Arctic server must see the same
    ``trainer.default_local_dir`` as verl (same machine or a shared filesystem).
    """
    if step is None:
        return None
    ckpt = checkpoint_dir(actor_dir, step)
    latest = os.path.join(ckpt, "latest")
    if not os.path.isfile(latest):
        return (
            f"{latest} is missing: the Arctic server saved no DeepSpeed checkpoint for step {step} there "
            "(it would answer /load-checkpoint with global_step 0 and train from the initial weights)"
        )
    with open(latest) as fh:
        tag = fh.read().strip()
    states = os.path.join(ckpt, tag, DS_MODEL_STATES)
    if not os.path.isfile(states):
        return f"{latest} names DeepSpeed tag {tag!r}, but {states} does not exist"
    return None


def write_record(actor_dir: str, step: Optional[int], response: Any) -> None:
    """Record what the server reported for a save (its ``global_step`` and path) next to the checkpoint."""
    if step is None or not isinstance(response, dict) or response.get("global_step") is None:
        return
    if not os.path.isdir(actor_dir):  # the server writes where verl cannot see: nothing to record beside it
        return
    record = {"step": int(step), "engine_global_step": int(response["global_step"]), "path": response.get("path")}
    tmp = os.path.join(actor_dir, RECORD_FILE + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, os.path.join(actor_dir, RECORD_FILE))


def recorded_engine_step(actor_dir: str, step: int) -> Optional[int]:
    """The server's ``global_step`` recorded when verl's ``step`` was saved into ``actor_dir``, if recorded."""
    try:
        with open(os.path.join(actor_dir, RECORD_FILE)) as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    if int(record.get("step", -1)) != int(step):
        return None
    return int(record["engine_global_step"])
