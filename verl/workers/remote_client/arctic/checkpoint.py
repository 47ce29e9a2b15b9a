"""The Arctic backend's checkpoint format inside verl's ``global_step_<N>/actor`` folder (no Arctic import).

What the Arctic RL server writes for ``save(path=<actor dir>, step=N)``
(``http_server.save`` -> ``DeepSpeedWorker.save_checkpoint`` -> DeepSpeed's
``engine.save_checkpoint``)::

    <actor dir>/latest                         "N"  (the server's pointer to its newest checkpoint-N)
    <actor dir>/checkpoint-N/latest            "global_step<K>"  (DeepSpeed's tag; K = optimizer steps)
    <actor dir>/checkpoint-N/global_step<K>/mp_rank_00_model_states.pt   ZeRO 0-2 (+ optimizer shards)
    <actor dir>/checkpoint-N/global_step<K>/zero_pp_rank_0_mp_rank_00_model_states.pt   ZeRO 3 (one per rank)

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

__all__ = [
    "RECORD_FILE",
    "DS_MODEL_STATES",
    "model_states_file",
    "checkpoint_dir",
    "checkpoint_problem",
    "write_record",
    "recorded_engine_step",
]

RECORD_FILE = "arctic_checkpoint.json"
#: DeepSpeed's model-states file of rank 0: ZeRO stages 0-2, then stage 3 (each rank saves its own partition).
DS_MODEL_STATES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")


def model_states_file(tag_dir: str) -> Optional[str]:
    """The model-states file DeepSpeed wrote into ``tag_dir`` at whatever ZeRO stage, or ``None``."""
    for name in DS_MODEL_STATES:
        path = os.path.join(tag_dir, name)
        if os.path.isfile(path):
            return path
    return None


def checkpoint_dir(actor_dir: str, step: int) -> str:
    """``<actor dir>/checkpoint-<step>``: where the server saves for (and loads from) verl's step."""
    return os.path.join(actor_dir, f"checkpoint-{int(step)}")


def checkpoint_problem(actor_dir: str, step: Optional[int]) -> Optional[str]:
    """What keeps the server from loading verl's step ``step`` from ``actor_dir`` (``None``: looks loadable).

    Checks the files DeepSpeed's ``load_checkpoint`` needs: ``checkpoint-<step>/latest`` naming a tag
    folder that holds DeepSpeed's model states (:data:`DS_MODEL_STATES`, by ZeRO stage). The Arctic server must see
    the same ``trainer.default_local_dir`` as verl (same machine or a shared filesystem).
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
    if model_states_file(os.path.join(ckpt, tag)) is None:
        return (
            f"{latest} names DeepSpeed tag {tag!r}, but {os.path.join(ckpt, tag)} holds none of {list(DS_MODEL_STATES)}"
        )
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
