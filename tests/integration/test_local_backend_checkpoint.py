"""Checkpoints of the local engine: exact resume, verification, atomic replacement."""

from __future__ import annotations

import os

import pytest
import torch
from support.local_backend_helpers import (
    dense_rollout_batch,
    main_config,
    random_rollouts,
    to_no_padding,
)


def _batch(seed):
    prompts, responses = random_rollouts(4, seed=seed)
    dense = dense_rollout_batch(prompts, responses)
    g = torch.Generator().manual_seed(seed)
    mask = dense["response_mask"].float()
    dense["old_log_probs"] = -6.2 * mask + 0.1 * torch.randn(mask.shape, generator=g) * mask
    dense["ref_log_prob"] = dense["old_log_probs"].clone()
    dense["advantages"] = torch.randn(4, 1, generator=g).expand_as(mask) * mask
    return to_no_padding(
        dense,
        mini_batch_size=2,
        global_batch_size=2,
        epochs=1,
        seed=0,
        dataloader_kwargs={"shuffle": True},
        calculate_entropy=False,
    )


@pytest.fixture(scope="module")
def cfg(tiny_model_dir):
    # warmup so the LR schedule state matters on resume
    return main_config(
        tiny_model_dir,
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=2,
        use_kl_loss=True,
        **{"optim.lr_warmup_steps": 5},
    )


def _engine(cfg):
    from verl.workers.remote_client.local.config import EngineSettings
    from verl.workers.remote_client.local.engine import LocalEngine

    return LocalEngine(EngineSettings.from_main_config(cfg))


def test_checkpoint_then_fresh_engine_then_load_restores_the_exact_state(cfg, tmp_path):
    a = _engine(cfg)
    a.update_actor(_batch(1), cfg.actor_rollout_ref.actor)
    a.sync_sampler_weights()
    path = str(tmp_path / "global_step_3" / "actor")
    assert a.save_checkpoint(path, step=3) == path
    assert sorted(os.listdir(tmp_path)) == ["global_step_3"]  # no temp dirs left behind

    b = _engine(cfg)
    assert b.load_checkpoint(path, step=3)["step"] == 3
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(pa, pb), name
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for key in sa["state"]:
        for field, val in sa["state"][key].items():
            assert torch.equal(val, sb["state"][key][field]), (key, field)
    assert a.lr_scheduler.state_dict() == b.lr_scheduler.state_dict()
    assert (a.global_step, a.optimizer_steps, a.policy_version) == (b.global_step, b.optimizer_steps, b.policy_version)

    # Same sampler weights and RNG: the same random samples.
    params = {"max_tokens": 8, "temperature": 1.0}
    assert a.generate([5, 6, 7], params) == b.generate([5, 6, 7], params)

    # Same next step: loss, metrics and parameters after one more update.
    out_a = a.update_actor(_batch(2), cfg.actor_rollout_ref.actor)
    out_b = b.update_actor(_batch(2), cfg.actor_rollout_ref.actor)
    assert out_a.loss == out_b.loss
    assert out_a.metrics == out_b.metrics
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)


def test_checkpoint_files_are_safetensors_and_weights_only_loadable(cfg, tmp_path):
    import json

    from safetensors.torch import load_file

    a = _engine(cfg)
    path = a.save_checkpoint(str(tmp_path / "ck"), step=1)
    manifest = json.load(open(os.path.join(path, "manifest.json")))
    assert manifest["step"] == 1
    own = {name for name in manifest["files"] if not name.startswith("huggingface/")}
    assert own == {"model.safetensors", "config.json", "optimizer.pt", "trainer_state.pt"}
    assert {"huggingface/model.safetensors", "huggingface/config.json", "huggingface/tokenizer_config.json"} <= set(
        manifest["files"]
    )
    assert all(len(meta["sha256"]) == 64 for meta in manifest["files"].values())
    assert load_file(os.path.join(path, "model.safetensors"))
    for name in ("optimizer.pt", "trainer_state.pt"):
        torch.load(os.path.join(path, name), weights_only=True)


def test_each_checkpoint_has_a_hugging_face_export_with_the_tokenizer_that_generates(cfg, tmp_path):
    """``huggingface/`` loads with ``AutoModelForCausalLM``/``AutoTokenizer`` as is, holds the trained
    weights (not the initial ones), encodes text, generates; folders get the user's normal mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = _engine(cfg)
    with torch.no_grad():
        next(a.model.parameters()).add_(0.5)  # "trained": differs from the model on disk
    path = a.save_checkpoint(str(tmp_path / "ck"), step=3)
    export = os.path.join(path, "huggingface")
    tokenizer = AutoTokenizer.from_pretrained(export)
    model = AutoModelForCausalLM.from_pretrained(export)
    ids = tokenizer("2+2=", return_tensors="pt")["input_ids"]
    assert ids.shape[1] > 0, "the exported tokenizer encodes nothing"
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > ids.shape[1]
    name, trained = next(iter(a.model.state_dict().items()))
    assert torch.equal(model.state_dict()[name], trained)
    umask_mode = 0o777 & ~_current_umask()
    for folder in (path, export):
        assert os.stat(folder).st_mode & 0o777 == umask_mode, oct(os.stat(folder).st_mode)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("damage", ["corrupt", "missing", "no_manifest", "wrong_step", "no_dir"])
def test_loading_a_damaged_checkpoint_fails_clearly(cfg, tmp_path, damage):
    from verl.workers.remote_client.local.checkpoint import CheckpointError

    a = _engine(cfg)
    path = a.save_checkpoint(str(tmp_path / "ck"), step=4)
    step, match = 4, None
    if damage == "corrupt":
        with open(os.path.join(path, "optimizer.pt"), "r+b") as fh:
            fh.seek(100)
            byte = fh.read(1)
            fh.seek(100)
            fh.write(bytes([byte[0] ^ 0xFF]))
        match = "optimizer.pt is corrupt"
    elif damage == "missing":
        os.remove(os.path.join(path, "model.safetensors"))
        match = "missing model.safetensors"
    elif damage == "no_manifest":
        os.remove(os.path.join(path, "manifest.json"))
        match = "no manifest.json"
    elif damage == "wrong_step":
        step, match = 5, "from step 4"
    else:
        path, match = str(tmp_path / "nowhere"), "does not exist"
    before = [p.detach().clone() for p in a.model.parameters()]
    with pytest.raises(CheckpointError, match=match):
        a.load_checkpoint(path, step=step)
    assert all(torch.equal(x, y) for x, y in zip(before, a.model.parameters()))  # nothing half-loaded


def test_saving_over_an_existing_checkpoint_is_atomic(tmp_path):
    from verl.workers.remote_client.local.checkpoint import verify_checkpoint_dir, write_checkpoint_dir

    def text(content):
        return lambda f: open(f, "w").write(content)

    path = str(tmp_path / "ck")
    write_checkpoint_dir(path, 1, {"a.txt": text("one")})
    with pytest.raises(RuntimeError, match="disk full"):

        def fail(f):
            raise RuntimeError("disk full")

        write_checkpoint_dir(path, 2, {"a.txt": text("two"), "b.txt": fail})
    assert verify_checkpoint_dir(path)["step"] == 1 and open(os.path.join(path, "a.txt")).read() == "one"
    write_checkpoint_dir(path, 2, {"a.txt": text("two")})
    assert verify_checkpoint_dir(path, 2)["step"] == 2 and open(os.path.join(path, "a.txt")).read() == "two"
    assert sorted(os.listdir(tmp_path)) == ["ck"]
