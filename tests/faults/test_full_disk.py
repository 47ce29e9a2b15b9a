"""Fault injection, storage: checkpoint saves on a disk that fills up or is read-only (a real tmpfs
made by the test): a clear error naming the folder and the space, the previous checkpoint intact
(protected: verified again when the test ends), nothing half-written. Counted in the fault tally.
The whole run on a disk that fills up is in ``test_full_disk_e2e.py``."""

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


def test_a_save_that_fills_the_disk_leaves_the_previous_checkpoint_and_nothing_else(fault, tmp_path):
    from verl.workers.remote_client.local.checkpoint import verify_checkpoint_dir, write_checkpoint_dir

    with small_tmpfs(tmp_path / "disk", 3 * MIB) as disk:
        first = disk / "global_step_1" / "actor"
        write_checkpoint_dir(str(first), 1, _writers(MIB))  # ~2 MiB: fits
        fault.protect(str(first))
        second = disk / "global_step_2" / "actor"
        with fault.expect(CheckpointSaveError, match=f"checkpoint not saved in {second}: .*no space left", within_s=10):
            write_checkpoint_dir(str(second), 2, _writers(MIB), needed_bytes=2 * MIB)
        assert sorted(os.listdir(disk)) == ["global_step_1"]  # no global_step_2/, no temporary folder
        # replacing a checkpoint in place: the old one stays when the new one does not fit
        with fault.expect(CheckpointSaveError, match="no space left", within_s=10):
            write_checkpoint_dir(str(first), 1, _writers(MIB + MIB // 2))
        assert verify_checkpoint_dir(str(first), 1)["step"] == 1  # every file, checksums included
        assert sorted(os.listdir(disk / "global_step_1")) == ["actor"]
        # the protected checkpoint is verified here, while the tmpfs is still mounted (not at teardown)
        assert not fault.verify_protected()
        fault.protected.clear()


def test_a_read_only_checkpoint_folder_is_named_with_the_fix(fault, tmp_path):
    from verl.workers.remote_client.local.checkpoint import write_checkpoint_dir

    with small_tmpfs(tmp_path / "disk", 4 * MIB) as disk:
        remount_read_only(disk)
        target = disk / "global_step_1" / "actor"
        with fault.expect(CheckpointSaveError, match=f"not saved in {target}: read-only file system", within_s=10):
            write_checkpoint_dir(str(target), 1, _writers(MIB))


def test_a_disk_already_full_before_the_save_fails_the_same_way(fault, tmp_path):
    from verl.workers.remote_client.local.checkpoint import write_checkpoint_dir

    with small_tmpfs(tmp_path / "disk", 2 * MIB) as disk:
        fill(disk)
        with fault.expect(CheckpointSaveError, match="no space left", within_s=10):
            write_checkpoint_dir(str(disk / "ckpt" / "global_step_1" / "actor"), 1, _writers(MIB // 4))
        assert sorted(os.listdir(disk)) == ["filler"]


def test_verls_own_data_pt_on_a_full_disk_removes_the_step_and_keeps_the_tracker(fault, tmp_path, monkeypatch):
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
        with fault.expect(
            CheckpointSaveError, match=f"checkpoint not saved in {disk / 'global_step_2'}: ", within_s=10
        ):
            trainer._save_checkpoint()
        assert sorted(os.listdir(disk)) == ["global_step_1", TRACKER_FILE]
        assert (disk / TRACKER_FILE).read_text() == "1"


def test_a_tracker_write_the_disk_refuses_is_restored_to_the_previous_step(fault, tmp_path, monkeypatch):
    """verl truncates its tracker before writing the new step: when that write fails, the guard puts
    the previous step back, so resume still finds the last complete checkpoint."""
    from omegaconf import OmegaConf

    from verl.remote_backend.checkpoints import TRACKER_FILE, tracker_step
    from verl.remote_backend.trainer import RemoteBackendTrainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    with small_tmpfs(tmp_path / "disk", MIB) as disk:
        (disk / "global_step_1" / "actor").mkdir(parents=True)
        (disk / TRACKER_FILE).write_text("1")

        def verl_save(self) -> None:  # actor/ and data.pt fit; the tracker is opened with "w", then the disk is full
            (disk / "global_step_2" / "actor").mkdir(parents=True)
            torch.save({"sampler": torch.zeros(16)}, disk / "global_step_2" / "data.pt")
            open(disk / TRACKER_FILE, "w").close()
            raise OSError(28, "No space left on device", str(disk / TRACKER_FILE))

        monkeypatch.setattr(RayPPOTrainer, "_save_checkpoint", verl_save)
        trainer = object.__new__(RemoteBackendTrainer)
        trainer.config = OmegaConf.create({"trainer": {"default_local_dir": str(disk)}})
        trainer.global_steps = 2
        with fault.expect(CheckpointSaveError, match="no space left on the device", within_s=10):
            trainer._save_checkpoint()
        assert tracker_step(str(disk)) == 1
        assert sorted(os.listdir(disk)) == ["global_step_1", TRACKER_FILE]
