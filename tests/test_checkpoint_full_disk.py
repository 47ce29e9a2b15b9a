"""Checkpoint saves on a disk that fills up or is read-only (a real tmpfs made by the test):
a clear error naming the folder and the space, the previous checkpoint intact, nothing half-written."""

from __future__ import annotations

import os

import pytest
import torch
from support.disk import fill, remount_read_only, small_tmpfs

from verl.remote_backend.checkpoints import storage_failure
from verl.remote_backend.errors import CheckpointSaveError

MIB = 1 << 20


def _writers(tensor_bytes: int):
    from safetensors.torch import save_file

    big = torch.zeros(tensor_bytes // 4)
    return {
        "model.safetensors": lambda f: save_file({"w": big}, f),
        "optimizer.pt": lambda f: torch.save({"exp_avg": big}, f),
        "notes.txt": lambda f: open(f, "w").write("x" * 100),
    }


@pytest.mark.parametrize("writer", ["open", "torch.save", "safetensors"])
def test_each_writers_full_disk_failure_is_recognised_as_the_disks(tmp_path, writer):
    from safetensors.torch import save_file

    with small_tmpfs(tmp_path / "disk", MIB) as disk:
        target = disk / "f"
        write = {
            "open": lambda: open(target, "wb").write(b"\0" * 2 * MIB),
            "torch.save": lambda: torch.save(torch.zeros(MIB // 2), target),
            "safetensors": lambda: save_file({"w": torch.zeros(MIB // 2)}, str(target)),
        }[writer]
        with pytest.raises(Exception) as caught:
            write()
        error = storage_failure(caught.value, str(disk / "global_step_2" / "actor"), needed_bytes=2 * MIB)
        assert isinstance(error, CheckpointSaveError), repr(caught.value)
        message = str(error)
        assert message.startswith(f"checkpoint not saved in {disk / 'global_step_2' / 'actor'}: ")
        assert "no space left on the device" in message
        assert "MiB free there, this checkpoint needs about 2.0 MiB" in message
        assert "trainer.default_local_dir" in message


def test_a_failure_that_is_not_the_disks_is_left_as_it_is():
    assert storage_failure(ValueError("bad tensor"), "/nowhere") is None
    assert storage_failure(KeyboardInterrupt(), "/nowhere") is None


def test_a_save_that_fills_the_disk_leaves_the_previous_checkpoint_and_nothing_else(tmp_path):
    from verl.workers.remote_client.local.checkpoint import verify_checkpoint_dir, write_checkpoint_dir

    with small_tmpfs(tmp_path / "disk", 3 * MIB) as disk:
        first = disk / "global_step_1" / "actor"
        write_checkpoint_dir(str(first), 1, _writers(MIB))  # ~2 MiB: fits
        second = disk / "global_step_2" / "actor"
        with pytest.raises(CheckpointSaveError, match=f"checkpoint not saved in {second}: .*no space left") as caught:
            write_checkpoint_dir(str(second), 2, _writers(MIB), needed_bytes=2 * MIB)
        assert "needs about 2.0 MiB" in str(caught.value)
        assert verify_checkpoint_dir(str(first), 1)["step"] == 1  # every file, checksums included
        assert sorted(os.listdir(disk)) == ["global_step_1"]  # no global_step_2/, no temporary folder
        # replacing a checkpoint in place: the old one stays when the new one does not fit
        with pytest.raises(CheckpointSaveError):
            write_checkpoint_dir(str(first), 1, _writers(MIB + MIB // 2))
        assert verify_checkpoint_dir(str(first), 1)["step"] == 1
        assert sorted(os.listdir(disk / "global_step_1")) == ["actor"]


def test_a_read_only_checkpoint_folder_is_named_with_the_fix(tmp_path):
    from verl.workers.remote_client.local.checkpoint import write_checkpoint_dir

    with small_tmpfs(tmp_path / "disk", 4 * MIB) as disk:
        remount_read_only(disk)
        with pytest.raises(CheckpointSaveError, match="read-only file system") as caught:
            write_checkpoint_dir(str(disk / "global_step_1" / "actor"), 1, _writers(MIB))
        assert str(disk / "global_step_1" / "actor") in str(caught.value)


def test_a_disk_already_full_before_the_save_fails_the_same_way(tmp_path):
    from verl.workers.remote_client.local.checkpoint import write_checkpoint_dir

    with small_tmpfs(tmp_path / "disk", 2 * MIB) as disk:
        fill(disk)
        with pytest.raises(CheckpointSaveError, match="no space left"):
            write_checkpoint_dir(str(disk / "ckpt" / "global_step_1" / "actor"), 1, _writers(MIB // 4))
        assert sorted(os.listdir(disk)) == ["filler"]


def test_verls_own_data_pt_on_a_full_disk_removes_the_step_and_keeps_the_tracker(tmp_path, monkeypatch):
    """The trainer's guard around verl's ``_save_checkpoint``: the backend's files fitted, verl's
    ``data.pt`` (a real ``torch.save``) does not; ``global_step_2/`` goes, step 1 stays named."""
    from omegaconf import OmegaConf

    from verl.remote_backend.checkpoints import TRACKER_FILE
    from verl.remote_backend.trainer import RemoteBackendTrainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    with small_tmpfs(tmp_path / "disk", MIB) as disk:
        (disk / "global_step_1" / "actor").mkdir(parents=True)
        (disk / TRACKER_FILE).write_text("1")

        def verl_save(self) -> None:  # what verl's save does on disk: actor/, then data.pt
            (disk / "global_step_2" / "actor").mkdir(parents=True)
            torch.save({"sampler": torch.zeros(MIB // 2)}, disk / "global_step_2" / "data.pt")

        monkeypatch.setattr(RayPPOTrainer, "_save_checkpoint", verl_save)
        trainer = object.__new__(RemoteBackendTrainer)  # only the save path: no Ray, no workers
        trainer.config = OmegaConf.create({"trainer": {"default_local_dir": str(disk)}})
        trainer.global_steps = 2
        with pytest.raises(CheckpointSaveError, match=f"checkpoint not saved in {disk / 'global_step_2'}: "):
            trainer._save_checkpoint()
        assert sorted(os.listdir(disk)) == ["global_step_1", TRACKER_FILE]
        assert (disk / TRACKER_FILE).read_text() == "1"
