"""The shared PPO update schedule equals verl 0.7.1's own: order (verl's ``make_iterator`` is the
oracle, called here), the fallbacks from the actor config, and the refusals."""

from __future__ import annotations

import pytest
import torch

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.transport.batch_ref import BatchRef, batch_field
from verl.remote_backend.update_schedule import UpdateSchedule, optimizer_step_rows, read_update_schedule
from verl.utils import tensordict_utils as tu


def _verl_order(batch_size: int, mini: int, epochs: int, seed, shuffle: bool) -> list[list[int]]:
    """The rows of each mini-batch as verl's own iterator yields them."""
    td = tu.get_tensordict({"row": torch.arange(batch_size)})
    its = tu.make_iterator(td, mini_batch_size=mini, epochs=epochs, seed=seed, dataloader_kwargs={"shuffle": shuffle})
    return [mb["row"].tolist() for mb in its]


def _batch(rows: int = 8, **fields):
    td = tu.get_tensordict({"x": torch.zeros(rows, 3)})
    if fields:
        tu.assign_non_tensor(td, **fields)
    return td


def _actor(**overrides):
    from verl.workers.config import FSDPActorConfig

    base = dict(strategy="fsdp", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=1, rollout_n=2,
                ppo_epochs=3, shuffle=True, data_loader_seed=17)  # fmt: skip
    base.update(overrides)
    return FSDPActorConfig(**base)


# --------------------------------------------------------------------------- order
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(
    "batch_size, mini, epochs, seed", [(8, 2, 1, 3), (8, 4, 3, 3), (12, 3, 2, 0), (6, 6, 2, 42), (16, 4, 4, 1234)]
)
def test_step_rows_are_verls_make_iterator_order(shuffle, batch_size, mini, epochs, seed):
    ours = optimizer_step_rows(UpdateSchedule(mini, epochs, seed, shuffle), batch_size)
    assert all(r.dtype == torch.int64 and r.shape == (mini,) for r in ours)
    assert [r.tolist() for r in ours] == _verl_order(batch_size, mini, epochs, seed, shuffle)
    assert len(ours) == epochs * batch_size // mini
    for e in range(epochs):  # each epoch visits every row once
        epoch_rows = sorted(i for r in ours[e * batch_size // mini : (e + 1) * batch_size // mini] for i in r.tolist())
        assert epoch_rows == list(range(batch_size))


def test_shuffled_epochs_differ_and_the_seed_matters():
    """Guards the order test above from passing on an order that never shuffles."""
    rows = lambda seed: [r.tolist() for r in optimizer_step_rows(UpdateSchedule(4, 2, seed, True), 16)]  # noqa: E731
    first = rows(5)
    assert first[:4] != first[4:], "each epoch draws a new permutation"
    assert first != rows(6) and first == rows(5)
    assert sum(first[:4], []) != list(range(16))


def test_one_generator_for_all_epochs_not_one_per_epoch():
    """verl seeds once and draws every epoch from the same generator; seeding each epoch anew
    (``seed + epoch``, a per-epoch ``randperm``) is another order."""
    ours = [r.tolist() for r in optimizer_step_rows(UpdateSchedule(4, 2, 7, True), 8)]
    per_epoch_seeded = []
    for epoch in range(2):
        perm = torch.randperm(8, generator=torch.Generator().manual_seed(7 + epoch)).tolist()
        per_epoch_seeded += [perm[i : i + 4] for i in range(0, 8, 4)]
    assert ours != per_epoch_seeded
    assert ours == _verl_order(8, 4, 2, 7, True)


# --------------------------------------------------------------------------- reading the batch
def test_the_trainers_fields_win_over_the_actor_config():
    data = _batch(8, mini_batch_size=4, epochs=2, seed=5, dataloader_kwargs={"shuffle": False})
    assert read_update_schedule(data, actor_config=_actor(), rollout_n=2) == UpdateSchedule(4, 2, 5, False)


def test_absent_fields_fall_back_to_what_verls_trainer_sets_from_the_actor_config():
    """verl's trainer sends mini_batch_size = ppo_mini_batch_size x rollout.n, epochs = ppo_epochs,
    seed = data_loader_seed, dataloader_kwargs = {"shuffle": shuffle}."""
    from omegaconf import OmegaConf

    actor = _actor(ppo_mini_batch_size=2, ppo_epochs=3, shuffle=True, data_loader_seed=17)
    want = UpdateSchedule(mini_batch_size=4, epochs=3, seed=17, shuffle=True)
    plain = {"ppo_mini_batch_size": 2, "ppo_epochs": 3, "shuffle": True, "data_loader_seed": 17}
    for cfg in (actor, OmegaConf.create(plain), plain):
        assert read_update_schedule(_batch(8), actor_config=cfg, rollout_n=2) == want
    # the fallback schedule is the one verl would run on those fields
    rows = [r.tolist() for r in optimizer_step_rows(want, 8)]
    assert rows == _verl_order(8, 4, 3, 17, True)


def test_num_mini_batch_splits_the_batch_and_mini_batch_size_wins():
    actor = _actor()
    assert read_update_schedule(_batch(12, num_mini_batch=3), actor_config=actor, rollout_n=2).mini_batch_size == 4
    both = _batch(12, num_mini_batch=3, mini_batch_size=6)
    assert read_update_schedule(both, actor_config=actor, rollout_n=2).mini_batch_size == 6


def test_dataloader_kwargs_without_shuffle_do_not_shuffle_as_in_verl():
    """verl hands dataloader_kwargs to torch's DataLoader: no ``shuffle`` key means no shuffling,
    whatever the actor config says."""
    data = _batch(8, dataloader_kwargs={})
    assert read_update_schedule(data, actor_config=_actor(shuffle=True), rollout_n=2).shuffle is False


def test_a_batch_ref_reads_as_its_batch():
    data = _batch(8, num_mini_batch=2, epochs=2, seed=9, dataloader_kwargs={"shuffle": True}, temperature=0.7)
    ref = BatchRef(
        ref=None,
        offsets=torch.arange(9),
        non_tensor={
            "num_mini_batch": 2,
            "epochs": 2,
            "seed": 9,
            "dataloader_kwargs": {"shuffle": True},
            "temperature": 0.7,
        },
    )
    actor = _actor()
    assert read_update_schedule(ref, actor_config=actor, rollout_n=2) == read_update_schedule(
        data, actor_config=actor, rollout_n=2
    )
    assert batch_field(ref, "temperature") == batch_field(data, "temperature") == 0.7
    assert batch_field(data, "absent", "default") == batch_field(ref, "absent", "default") == "default"


# --------------------------------------------------------------------------- refusals
def test_a_batch_that_does_not_split_is_refused_naming_the_setting_and_the_fix():
    schedule = read_update_schedule(_batch(6), actor_config=_actor(ppo_mini_batch_size=2), rollout_n=2)
    with pytest.raises(
        ConfigError,
        match=r"ppo_mini_batch_size x actor_rollout_ref\.rollout\.n=4.*6 samples.*Fix: make data\.train_batch_size",
    ):
        optimizer_step_rows(schedule, 6)
    with pytest.raises(ConfigError, match=r"num_mini_batch=4.*Fix:"):
        read_update_schedule(_batch(6, num_mini_batch=4), actor_config=_actor(), rollout_n=2)


@pytest.mark.parametrize(
    "fields, needle",
    [
        (dict(epochs=0), r"ppo_epochs=0.*Fix: set actor_rollout_ref\.actor\.ppo_epochs >= 1"),
        (dict(mini_batch_size=0), r"ppo_mini_batch_size=0.*Fix:"),
        (dict(dataloader_kwargs={"shuffle": True, "drop_last": True}), r"dataloader_kwargs=.*'drop_last'.*Fix:"),
    ],
)
def test_schedules_verl_would_not_run_are_refused(fields, needle):
    with pytest.raises(ConfigError, match=needle):
        read_update_schedule(_batch(8, **fields), actor_config=_actor(), rollout_n=2)


def test_an_actor_config_without_a_mini_batch_size_is_refused():
    with pytest.raises(ConfigError, match=r"ppo_mini_batch_size=None.*Fix:"):
        read_update_schedule(_batch(8), actor_config={}, rollout_n=2)
