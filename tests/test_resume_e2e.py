"""Resume: a second run with ``trainer.resume_mode=auto`` continues from the saved step
with exactly the weights and optimizer state the first run saved.

Both runs use the local engine through ``local-resume-probe`` (tests/resume_probe_backend.py,
registered with ``VERL_USE_EXTERNAL_MODULES``): it *is* the local backend, plus one extra
``save_checkpoint`` right after ``load_checkpoint`` into ``<path>_restored``. Comparing
that directory's manifest (sha256 of model weights, optimizer + LR schedule, counters and
RNG) with the checkpoint the first run wrote proves the restarted engine holds the saved
state bit for bit.
"""

from __future__ import annotations

import json
import os

import pytest

from remote_e2e import TESTS_DIR, e2e_assets, run_entry, small_ci_overrides

pytestmark = pytest.mark.slow

PROBE_ENV = {
    "VERL_USE_EXTERNAL_MODULES": "resume_probe_backend",
    "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])),
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return e2e_assets(tmp_path_factory.mktemp("resume_assets"))


def _overrides(assets, ckpt, steps, resume_mode):
    overrides = small_ci_overrides(
        model=assets["model"],
        train=assets["train"],
        test=assets["test"],
        ckpt_dir=ckpt,
        steps=steps,
        save_freq=1,
        backend="local-resume-probe",
    )
    # a visible learning rate, so a step really changes the weights
    return [o for o in overrides if not o.startswith("trainer.resume_mode=")] + [
        f"trainer.resume_mode={resume_mode}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
    ]


def _manifest(path) -> dict:
    return json.loads((path / "manifest.json").read_text())


@pytest.mark.timeout(1500)
def test_auto_resume_continues_from_the_saved_step_with_identical_state(assets, tmp_path):
    ckpt = tmp_path / "ckpt"
    first = run_entry(
        _overrides(assets, ckpt, steps=2, resume_mode="disable"), workdir=tmp_path / "first", env_extra=PROBE_ENV
    )
    assert first.returncode == 0, first.tail()
    assert [m["step"] for m in first.metrics] == [1, 2]
    saved = ckpt / "global_step_2" / "actor"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    # steps 1 and 2 really trained (otherwise "identical" would prove nothing)
    assert (
        _manifest(ckpt / "global_step_1" / "actor")["files"]["model.safetensors"]
        != _manifest(saved)["files"]["model.safetensors"]
    )

    second = run_entry(
        _overrides(assets, ckpt, steps=3, resume_mode="auto"), workdir=tmp_path / "second", env_extra=PROBE_ENV
    )
    assert second.returncode == 0, second.tail()
    assert f"Resuming from {ckpt / 'global_step_2'}" in second.output
    # it continued: only step 3 ran, as global step 3, and saved it
    assert [m["step"] for m in second.metrics] == [3]
    assert second.step(3)["training/global_step"] == 3
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"

    restored = ckpt / "global_step_2" / "actor_restored"
    before, after = _manifest(saved), _manifest(restored)
    assert before["step"] == after["step"] == 2
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.pt"):
        assert before["files"][name] == after["files"][name], f"{name} differs after resume"

    # and training went on from there: step 3's optimizer state differs from step 2's
    assert _manifest(ckpt / "global_step_3" / "actor")["files"]["optimizer.pt"] != before["files"]["optimizer.pt"]
    print(f"\n[resume] first run {first.wall_s:.1f}s, resumed run {second.wall_s:.1f}s")
