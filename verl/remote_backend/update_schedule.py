"""The PPO update schedule: how one global batch becomes optimizer steps (mini-batches x epochs).

Every backend's ``update_actor`` reads the schedule here and visits the rows in the order this
module gives, which is verl 0.7.1's own order (``verl.utils.tensordict_utils.make_iterator``, as
called by the engine worker's ``train_mini_batch``). Only the schedule is shared: how a backend
runs one mini-batch (in process, one HTTP request, one ``forward_backward``) is its own business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

import torch

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.settings.loader import select
from verl.remote_backend.transport.batch_ref import BatchRef, batch_field

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = ["SCHEDULE_FIELDS", "UpdateSchedule", "read_update_schedule", "optimizer_step_rows"]

#: Non-tensor fields of the update batch that describe the schedule (verl's trainer sets all but
#: ``num_mini_batch``; verl's worker pops all of them before it iterates).
SCHEDULE_FIELDS = ("mini_batch_size", "num_mini_batch", "epochs", "seed", "dataloader_kwargs")

_MINI_KEY = "actor_rollout_ref.actor.ppo_mini_batch_size"
_EPOCHS_KEY = "actor_rollout_ref.actor.ppo_epochs"


@dataclass(frozen=True)
class UpdateSchedule:
    """How one ``update_actor`` call steps the optimizer.

    Attributes:
        mini_batch_size: rows (samples, i.e. prompts x ``rollout.n``) per optimizer step.
        epochs: passes over the whole batch.
        seed: seed of the shuffling generator; ``None`` shuffles from torch's global RNG, as verl.
        shuffle: draw a new permutation of the rows each epoch; otherwise rows go in batch order.
    """

    mini_batch_size: int
    epochs: int
    seed: Optional[int]
    shuffle: bool

    def __post_init__(self) -> None:
        if self.mini_batch_size < 1:
            raise ConfigError.for_setting(
                _MINI_KEY,
                self.mini_batch_size,
                "a PPO mini-batch needs at least one sample",
                "set actor_rollout_ref.actor.ppo_mini_batch_size >= 1",
            )
        if self.epochs < 1:
            raise ConfigError.for_setting(
                _EPOCHS_KEY,
                self.epochs,
                "the update needs at least one pass over the batch",
                "set actor_rollout_ref.actor.ppo_epochs >= 1",
            )


def read_update_schedule(data: Union["TensorDict", BatchRef], *, actor_config: Any, rollout_n: int) -> UpdateSchedule:
    """The schedule of one ``update_actor`` call, as verl's trainer and engine worker define it.

    Called by every backend's ``update_actor`` (and by the forwarder, for MFU's epoch count) on
    the global batch verl sent. Reads the non-tensor fields verl's trainer sets
    (``mini_batch_size`` or ``num_mini_batch``, ``epochs``, ``seed``, ``dataloader_kwargs``);
    a field that is absent falls back to what verl's trainer would have set from the actor
    config: ``ppo_mini_batch_size x rollout_n`` rows, ``ppo_epochs``, ``data_loader_seed``,
    ``{"shuffle": shuffle}`` (``verl/trainer/ppo/ray_trainer.py`` ``_update_actor``).
    ``mini_batch_size`` wins over ``num_mini_batch`` (rows / count), as in verl's worker
    (``verl/workers/engine_workers.py`` ``train_mini_batch``, whose seed is ``seed + dp rank``:
    a backend is one data-parallel rank to verl, rank 0). Nothing is popped from ``data``.

    Args:
        data: the global batch (``TensorDict`` or :class:`BatchRef`).
        actor_config: verl's ``actor_rollout_ref.actor`` (dataclass, ``DictConfig`` or dict).
        rollout_n: samples per prompt (``actor_rollout_ref.rollout.n``).

    Raises:
        ConfigError: a mini-batch size or epoch count below 1, a ``num_mini_batch`` that does not
            divide the batch, or ``dataloader_kwargs`` other than ``shuffle`` (the order would no
            longer be verl's). Whether ``B`` splits into whole mini-batches is checked by
            :func:`optimizer_step_rows`, which every backend calls before any work.
    """
    mini = batch_field(data, "mini_batch_size")
    count = batch_field(data, "num_mini_batch")
    if mini is None and count is not None:
        rows = len(data) if isinstance(data, BatchRef) else int(data.batch_size[0])
        if int(count) < 1 or rows % int(count) != 0:
            raise ConfigError.for_setting(
                "num_mini_batch",
                count,
                f"the update batch of {rows} samples does not split into that many equal mini-batches",
                "send a num_mini_batch that divides the batch, or mini_batch_size instead",
            )
        mini = rows // int(count)
    elif mini is None:
        per_prompt = select(actor_config, "ppo_mini_batch_size")
        if per_prompt is None:
            raise ConfigError.for_setting(
                _MINI_KEY,
                None,
                "the batch carries no mini_batch_size and the actor config has none",
                "set actor_rollout_ref.actor.ppo_mini_batch_size (prompts per optimizer step)",
            )
        mini = int(per_prompt) * int(rollout_n)

    epochs = batch_field(data, "epochs")
    epochs = select(actor_config, "ppo_epochs", 1) if epochs is None else epochs
    seed = batch_field(data, "seed")
    seed = select(actor_config, "data_loader_seed") if seed is None else seed
    loader = batch_field(data, "dataloader_kwargs")
    shuffle = bool(select(actor_config, "shuffle", False)) if loader is None else _shuffle_of(loader)
    return UpdateSchedule(
        mini_batch_size=int(mini), epochs=int(epochs), seed=None if seed is None else int(seed), shuffle=shuffle
    )


def optimizer_step_rows(schedule: UpdateSchedule, batch_size: int) -> list[torch.Tensor]:
    """Row indices of each optimizer step, in verl's ``make_iterator`` order.

    One int64 ``[mini_batch_size]`` tensor per step, ``epochs x batch_size / mini_batch_size`` of them:
    epoch 0's mini-batches, then epoch 1's, ... Without shuffling each epoch is
    ``0..B-1`` cut in order. With shuffling, each epoch is a fresh permutation from ONE
    generator seeded once with ``schedule.seed``, drawn the way a torch ``DataLoader`` with
    ``shuffle=True`` and that generator draws it (so the sequence is verl's, epoch after epoch).

    Raises:
        ConfigError: ``batch_size`` is not a multiple of ``schedule.mini_batch_size``.
    """
    from torch.utils.data import DataLoader

    _check_split(batch_size, schedule.mini_batch_size)
    generator = None
    if schedule.seed is not None:
        generator = torch.Generator()
        generator.manual_seed(schedule.seed)
    # Built like verl's iterator (a DataLoader over arange(B), one generator for all epochs), so the
    # draws it makes per epoch (a base seed, then the sampler's permutation) are the same draws.
    loader = DataLoader(
        torch.arange(batch_size),
        batch_size=schedule.mini_batch_size,
        shuffle=schedule.shuffle,
        generator=generator,
        collate_fn=lambda picked: torch.stack(picked).to(torch.int64),
    )
    return [rows for _ in range(schedule.epochs) for rows in loader]


def _shuffle_of(loader_kwargs: Mapping[str, Any]) -> bool:
    """``shuffle`` of verl's ``dataloader_kwargs``; torch's DataLoader default (False) when absent."""
    extra = sorted(set(loader_kwargs) - {"shuffle"})
    if extra:
        raise ConfigError.for_setting(
            "dataloader_kwargs",
            dict(loader_kwargs),
            f"the update schedule honours only 'shuffle', not {extra}",
            "send dataloader_kwargs={'shuffle': <bool>} (what verl's trainer sends)",
        )
    return bool(loader_kwargs.get("shuffle", False))


def _check_split(rows: int, per_step: int) -> None:
    if rows % per_step != 0:
        raise ConfigError.for_setting(
            f"{_MINI_KEY} x actor_rollout_ref.rollout.n",
            per_step,
            f"the update batch of {rows} samples does not split into whole mini-batches of that size",
            "make data.train_batch_size a multiple of actor_rollout_ref.actor.ppo_mini_batch_size "
            "(both count prompts; each prompt brings rollout.n samples)",
        )
