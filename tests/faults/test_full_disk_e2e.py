"""A GRPO run whose checkpoint disk fills up (a real tmpfs, sized by the test to hold one
checkpoint of the tiny model, not two): the run stops at the save that does not fit with the
cause on its failure line, step 1's checkpoint stays complete and selected, nothing of step 2 is
left, and a resumed run continues from step 1. Counted in the fault tally: the time to error is
from verl's line announcing step 2's save to the driver's exit."""

from __future__ import annotations

import os
import threading
import time

import pytest
from support.disk import small_tmpfs
from support.remote_e2e import run_entry, small_ci_overrides

from verl.remote_backend.checkpoints import TRACKER_FILE, checkpoint_problem
from verl.workers.remote_client.local.checkpoint import checkpoint_problem as local_format_problem

TEST_TIER = "integration"  # starts Ray, a server, an engine or a model (tiers: tests/conftest.py)
pytestmark = pytest.mark.slow


def _checkpoint_bytes(model_dir: str) -> int:
    """About one checkpoint of the local engine for this model: the weights, AdamW's two moments
    (float32, as the weights), the tokenizer and configs of the Hugging Face export (its weights
    are a hard link), the manifest and verl's data.pt."""
    weights = os.path.getsize(os.path.join(model_dir, "model.safetensors"))
    others = sum(os.path.getsize(os.path.join(model_dir, f)) for f in os.listdir(model_dir)) - weights
    return 3 * weights + 2 * others + 64 * 1024


def _first_seen(log, needle: str, stop: threading.Event) -> dict:
    """Polls ``log`` (every 0.1 s, in a thread) for ``needle``; the returned dict gets ``"at"``
    (monotonic seconds) when it first appears."""
    seen: dict = {}

    def poll() -> None:
        while not stop.is_set() and "at" not in seen:
            if log.exists() and needle in log.read_text(errors="replace"):
                seen["at"] = time.monotonic()
            stop.wait(0.1)

    threading.Thread(target=poll, daemon=True).start()
    return seen


@pytest.mark.timeout(900)
def test_a_checkpoint_disk_that_fills_up_stops_the_run_and_keeps_the_previous_checkpoint(
    fault, tmp_path, small_gsm8k_assets
):
    one = _checkpoint_bytes(small_gsm8k_assets["model"])
    with small_tmpfs(tmp_path / "disk", int(1.6 * one)) as disk:
        ckpt = disk / "ckpt"
        overrides = small_ci_overrides(
            model=small_gsm8k_assets["model"],
            train=small_gsm8k_assets["train"],
            test=small_gsm8k_assets["test"],
            ckpt_dir=ckpt,
            steps=2,
            save_freq=1,
        )
        stop = threading.Event()
        # verl prints this as step 2's save starts (run_entry writes the run's output to run.log)
        save_started = _first_seen(
            tmp_path / "full" / "run.log", f"local_global_step_folder: {ckpt / 'global_step_2'}", stop
        )
        full = run_entry(overrides, workdir=tmp_path / "full")
        exited = time.monotonic()
        stop.set()
        step_2 = ckpt / "global_step_2" / "actor"
        failure = next((line for line in full.output.splitlines() if "run failed:" in line), "")
        fault.observed(
            "checkpoint disk full at step 2's save (full main_ppo run)",
            surfaced="at" in save_started  # step 2's save did start
            and full.returncode != 0
            and f"CheckpointSaveError: checkpoint not saved in {step_2}: " in failure
            and "no space left on the device" in failure
            and "trainer.default_local_dir" in full.output,
            seconds=exited - save_started.get("at", exited),
            within_s=60,
            detail=full.tail(),
        )
        assert [m["step"] for m in full.metrics] == [1]  # step 2 trained but is not logged as done
        # step 1 stays complete and is the one verl's tracker names; nothing of step 2 is left
        assert (ckpt / TRACKER_FILE).read_text().strip() == "1"
        assert sorted(os.listdir(ckpt)) == ["global_step_1", TRACKER_FILE]
        assert checkpoint_problem(str(ckpt / "global_step_1"), format_problem=local_format_problem) is None
        fault.protect(str(ckpt / "global_step_1" / "actor"))

        resumed = run_entry(
            [o for o in overrides if not o.startswith(("trainer.resume_mode=", "trainer.save_freq="))]
            + ["trainer.resume_mode=auto", "trainer.save_freq=-1"],
            workdir=tmp_path / "resumed",
        )
        assert resumed.returncode == 0, resumed.tail()
        assert f"Resuming from {ckpt / 'global_step_1'}" in resumed.output
        assert [m["step"] for m in resumed.metrics] == [2]
        assert not fault.verify_protected()  # step 1 untouched by the resumed run, checked while mounted
        fault.protected.clear()
