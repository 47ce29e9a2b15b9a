"""Resume: a second run with ``trainer.resume_mode=auto`` continues from the saved step
with exactly the weights and optimizer state the first run saved.

Both runs use the local engine through ``local-resume-probe`` (tests/support/resume_probe_backend.py,
registered with ``VERL_USE_EXTERNAL_MODULES``): it *is* the local backend, plus one extra
``save_checkpoint`` right after ``load_checkpoint`` into ``<path>_restored``. Comparing
that directory's manifest (sha256 of model weights, optimizer + LR schedule, counters and
RNG) with the checkpoint the first run wrote proves the restarted engine holds the saved
state bit for bit.

The two runs are the session's ``head`` (2 steps, a checkpoint every step) and ``tail``
(resumed, to step 4) of conftest ``seeded_local_run``, which test_reproducibility_e2e also
compares with an uninterrupted run.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.every_verl]  # CI runs it on both releases (.ci/run)


def _manifest(path) -> dict:
    return json.loads((path / "manifest.json").read_text())


@pytest.mark.timeout(1500)
def test_auto_resume_continues_from_the_saved_step_with_identical_state(seeded_local_run):
    head = seeded_local_run("head")
    first, ckpt = head.result, head.ckpt
    assert first.returncode == 0, first.tail()
    assert [m["step"] for m in first.metrics] == [1, 2]
    saved = ckpt / "global_step_2" / "actor"
    assert head.latest_checkpoint == "2"
    # steps 1 and 2 really trained (otherwise "identical" would prove nothing)
    assert (
        _manifest(ckpt / "global_step_1" / "actor")["files"]["model.safetensors"]
        != _manifest(saved)["files"]["model.safetensors"]
    )

    tail = seeded_local_run("tail")
    second = tail.result
    assert tail.ckpt == ckpt
    assert second.returncode == 0, second.tail()
    assert f"Resuming from {ckpt / 'global_step_2'}" in second.output
    # it continued: only steps 3 and 4 ran, from global step 3, and saved them
    assert [m["step"] for m in second.metrics] == [3, 4]
    assert second.step(3)["training/global_step"] == 3
    assert tail.latest_checkpoint == "4"

    restored = ckpt / "global_step_2" / "actor_restored"
    before, after = _manifest(saved), _manifest(restored)
    assert before["step"] == after["step"] == 2
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.pt"):
        assert before["files"][name] == after["files"][name], f"{name} differs after resume"

    # and training went on from there: step 3's optimizer state differs from step 2's
    assert _manifest(ckpt / "global_step_3" / "actor")["files"]["optimizer.pt"] != before["files"]["optimizer.pt"]
    print(f"\n[resume] first run {first.wall_s:.1f}s, resumed run {second.wall_s:.1f}s")
