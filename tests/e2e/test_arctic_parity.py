"""The arctic adapter trains verl's objective on Arctic's own server code, or refuses the setting.

Every update below goes adapter -> arctic-platform's HTTP client -> Arctic's FastAPI app
-> ``http_split_batch`` -> ``DeepSpeedWorker._forward_maybe_backward`` -> ``run_pipeline``
-> Snowflake's ``verl_grpo`` loss, on DeepSpeed's real CPU engine, with only vLLM and ZoRRo's kernels replaced by CPU
doubles (``tests/arctic_standin``). The reference is verl's actor objective on the same
batch, weights and optimizer, computed by the local engine (itself checked against verl's
``DataParallelPPOActor`` in ``test_local_backend_parity.py``).
"""

from __future__ import annotations

import os
import re

import pytest
import torch
from arctic_standin.harness import EIGHT_ROWS, compose_config, make_batch
from support.aio import run_async as run

pytestmark = pytest.mark.slow

TEMPERATURE = 0.8
ROWS = 8  # 4 prompts x rollout.n 2


@pytest.fixture(scope="module")
def server(standin_server, tmp_path_factory):
    """The session's stand-in server, and a tiny Qwen3 to create jobs for."""
    from verl.remote_backend.testing.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("arctic_parity")
    model = build_tiny_model(str(root / "model"), architecture="qwen3")  # ZoRRo Train supports Qwen3 families only
    return {"model": model, "port": standin_server.port, "root": root}


def _config(server, name, overrides):
    base = [
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # x rollout.n 2 = 4 rows per optimizer step
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.use_kl_loss=true",  # reference log-prob job exists in every case
        "actor_rollout_ref.actor.kl_loss_coef=0.0",
        f"actor_rollout_ref.rollout.temperature={TEMPERATURE}",  # ZoRRo's model is built with it
    ]
    return compose_config(server["model"], str(server["root"] / name / "ckpt"), server["port"], base + list(overrides))


def _batch(tok_vocab, pad, *, epochs, shuffle, entropy, seed=11, schedule_fields=True):
    """8 rows with per-row advantages; ``schedule_fields=False``: no mini_batch_size/epochs/seed/
    dataloader_kwargs (both backends then read the schedule from the actor config)."""
    from verl.utils import tensordict_utils as tu

    data = make_batch(
        **EIGHT_ROWS,
        vocab=tok_vocab,
        pad_token_id=pad,
        seed=seed,
        with_update_fields=True,
    )
    schedule = dict(mini_batch_size=4, epochs=epochs, seed=3, dataloader_kwargs={"shuffle": shuffle})
    tu.assign_non_tensor(
        data,
        **(schedule if schedule_fields else {}),
        calculate_entropy=entropy,
        global_batch_size=4,
        temperature=TEMPERATURE,
    )
    return data


def _arctic_update(cfg, data, pad, tmp):
    """One update_actor through Arctic's server; returns (result, {param name: tensor after})."""
    from verl.remote_backend import RemoteBackendRegistry
    from verl.utils.config import omega_conf_to_dataclass

    backend = RemoteBackendRegistry.create("arctic", cfg)
    try:
        out = run(
            backend.update_actor(
                data.copy(),
                actor_config=omega_conf_to_dataclass(cfg.actor_rollout_ref.actor),
                pad_token_id=pad,
                rollout_n=2,
                temperature=TEMPERATURE,
            )
        )
        actor_dir = os.path.join(tmp, "actor")
        os.makedirs(actor_dir, exist_ok=True)
        run(backend.save_checkpoint(actor_dir, 1))
        ckpt = os.path.join(actor_dir, "checkpoint-1")
        tag = open(os.path.join(ckpt, "latest")).read().strip()
        params = torch.load(
            os.path.join(ckpt, tag, "mp_rank_00_model_states.pt"), map_location="cpu", weights_only=True
        )["module"]
    finally:
        run(backend.destroy())
    return out, params


def _verl_update(cfg, data):
    from verl.workers.remote_client.local.config import EngineSettings
    from verl.workers.remote_client.local.engine import LocalEngine

    torch.set_num_threads(1)
    eng = LocalEngine(EngineSettings.from_main_config(cfg))
    initial = {k: v.detach().clone() for k, v in eng.model.named_parameters()}
    out = eng.update_actor(data.copy(), cfg.actor_rollout_ref.actor, temperature=TEMPERATURE)
    return out, initial, {k: v.detach().clone() for k, v in eng.model.named_parameters()}


def _update_difference(initial, ours, theirs):
    """Relative norm of (Arctic's update - verl's update), beyond each float32 weight's own resolution."""
    diffs, refs = [], []
    for name, before in initial.items():
        d_ours, d_theirs = ours[name] - before, theirs[name] - before
        if name.endswith("k_proj.bias"):  # true gradient 0 (softmax shift invariance): Adam amplifies round-off
            continue
        ulp = torch.finfo(torch.float32).eps * before.abs()
        diffs.append(((d_ours - d_theirs).abs() - ulp).clamp(min=0).flatten())
        refs.append(d_theirs.flatten())
    return float(torch.cat(diffs).norm() / torch.cat(refs).norm())


# ZoRRo's model is built for response_len = data.max_response_length: the batch's widths.
ZORRO_WIDTHS = ("data.max_prompt_length=6", "data.max_response_length=5")

# The batch carries no schedule: ppo_mini_batch_size x rollout.n rows, ppo_epochs, data_loader_seed, shuffle.
SCHEDULE_FROM_CONFIG = (
    "actor_rollout_ref.actor.ppo_epochs=2",
    "actor_rollout_ref.actor.shuffle=true",
    "actor_rollout_ref.actor.data_loader_seed=5",
)

# name: (overrides, epochs, shuffle, calculate_entropy)
CASES = {
    "token-mean/1-micro-batch": (
        ["actor_rollout_ref.actor.loss_agg_mode=token-mean", "remote_backend.arctic.micro_batch_size=4"],
        1,
        False,
        False,
    ),
    "token-mean/4-micro-batches/2-epochs-shuffled": (
        ["actor_rollout_ref.actor.loss_agg_mode=token-mean", "remote_backend.arctic.micro_batch_size=1"],
        2,
        True,
        False,
    ),
    "token-mean/2-epochs-shuffled/schedule-from-actor-config": (
        ["remote_backend.arctic.micro_batch_size=2", *SCHEDULE_FROM_CONFIG],
        2,
        True,
        False,
    ),
    "token-mean/no-load-balancer": (
        ["remote_backend.arctic.zorro.load_balancer=false", "remote_backend.arctic.micro_batch_size=2"],
        1,
        False,
        False,
    ),
    "token-mean/kl-loss": (
        [
            "actor_rollout_ref.actor.kl_loss_coef=0.2",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
            "remote_backend.arctic.micro_batch_size=2",
        ],
        1,
        False,
        False,
    ),
    "seq-mean-token-sum/2-micro-batches": (
        ["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum", "remote_backend.arctic.micro_batch_size=2"],
        1,
        False,
        False,
    ),
    "seq-mean-token-mean/kl-loss": (
        ["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean", "actor_rollout_ref.actor.kl_loss_coef=0.2"],
        2,
        True,
        False,
    ),
    "zorro/token-mean/entropy-bonus": (
        [
            "remote_backend.arctic.zorro.train=true",
            *ZORRO_WIDTHS,
            "actor_rollout_ref.actor.entropy_coeff=0.01",
            "remote_backend.arctic.micro_batch_size=2",
        ],
        1,
        False,
        True,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_update_matches_verls_objective_on_arctics_server_code(server, tmp_path, case):
    from transformers import AutoTokenizer

    overrides, epochs, shuffle, entropy = CASES[case]
    cfg = _config(server, case.replace("/", "_"), overrides)
    tok = AutoTokenizer.from_pretrained(server["model"])
    data = _batch(len(tok), tok.pad_token_id, epochs=epochs, shuffle=shuffle, entropy=entropy,
                  schedule_fields="schedule-from-actor-config" not in case)  # fmt: skip

    ref, initial, ref_params = _verl_update(cfg, data)
    # verl's own float32 noise: the same objective with another micro-batch split (1 vs 4 rows).
    micro = 4 if int(cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu) != 4 else 1
    _, _, split_params = _verl_update(
        _config(server, "split", overrides + [f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}"]), data
    )
    noise = _update_difference(initial, split_params, ref_params)
    out, params = _arctic_update(cfg, data, tok.pad_token_id, str(tmp_path))

    steps = epochs * ROWS // 4
    rel = _update_difference(initial, {k: params[k] for k in initial}, ref_params)
    print(f"{case}: loss {out.loss:.6g} vs {ref.loss:.6g}; grad_norm {out.metrics['grad_norm']} vs "
          f"{ref.metrics['grad_norm']}; update rel. diff {rel:.2e} (verl's own split noise {noise:.2e})")  # fmt: skip
    assert len(out.metrics["grad_norm"]) == steps
    assert out.metrics["grad_norm"] == pytest.approx(ref.metrics["grad_norm"], rel=1e-5)
    # Adam turns the round-off of near-zero gradient entries into O(lr) steps: bound by verl's own split
    # noise (x10: the packed forward sums in yet another order), at least 3e-5; a wrong objective is >1e-2.
    assert rel <= max(3e-5, 10 * noise), (
        f"parameter update differs from verl's by {rel:.2e} (verl's own noise {noise:.2e})"
    )
    if "seq-mean" not in case:  # Arctic reports loss metrics as token-means whatever the aggregation (README)
        assert out.loss == pytest.approx(ref.loss, rel=1e-5, abs=1e-7)
        assert out.metrics["pg_loss"] == pytest.approx(ref.metrics["pg_loss"], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"], "loss_agg_mode='seq-mean-token-sum-norm'"),
        (["actor_rollout_ref.actor.entropy_coeff=0.5"], "entropy_coeff=0.5"),
    ],
)
def test_settings_arctic_computes_differently_are_refused_and_really_differ(server, tmp_path, overrides, key):
    """Refused at start-up (``check_config`` runs in validation, before Ray); forced through with
    ``strict_loss_check=false``, the update really is not verl's."""
    from transformers import AutoTokenizer

    from verl.remote_backend.errors import ConfigError
    from verl.workers.remote_client.arctic.client import ArcticBackend

    cfg = _config(server, "refused", overrides + ["remote_backend.arctic.micro_batch_size=2"])
    with pytest.raises(ConfigError, match=re.escape(key)):
        ArcticBackend.check_config(cfg)

    forced = _config(
        server,
        "forced",
        overrides + ["remote_backend.arctic.micro_batch_size=2", "remote_backend.arctic.strict_loss_check=false"],
    )
    tok = AutoTokenizer.from_pretrained(server["model"])
    data = _batch(len(tok), tok.pad_token_id, epochs=1, shuffle=False, entropy="entropy" in key)
    _, initial, ref_params = _verl_update(forced, data)
    _, params = _arctic_update(forced, data, tok.pad_token_id, str(tmp_path))
    rel = _update_difference(initial, {k: params[k] for k in initial}, ref_params)
    assert rel > 1e-3, f"the forced update is within {rel:.2e} of verl's: the refusal would be unfounded"


def test_zorro_log_probs_equal_the_plain_path(server):
    """ZoRRo's token-aligned answers, re-aligned by the adapter, equal the non-ZoRRo log-probs and entropy."""
    from transformers import AutoTokenizer

    from verl.remote_backend import RemoteBackendRegistry

    tok = AutoTokenizer.from_pretrained(server["model"])
    data = _batch(len(tok), tok.pad_token_id, epochs=1, shuffle=False, entropy=True)
    outs = {}
    for zorro in (False, True):
        cfg = _config(
            server, f"zorro-{zorro}", [f"remote_backend.arctic.zorro.train={str(zorro).lower()}", *ZORRO_WIDTHS]
        )
        backend = RemoteBackendRegistry.create("arctic", cfg)
        try:
            outs[zorro] = [
                run(
                    backend.compute_log_prob(
                        data,
                        ref=ref,
                        calculate_entropy=True,
                        rollout_n=2,
                        temperature=TEMPERATURE,
                        pad_token_id=tok.pad_token_id,
                    )
                )  # fmt: skip
                for ref in (False, True)
            ]
        finally:
            run(backend.destroy())
    # Compare the slots verl reads: each response token's log-prob (slot before it) and entropy.
    mask = data["attention_mask"].bool()
    prompt_width = data["prompts"].shape[1]
    lengths = mask.sum(-1)
    response_slots = []
    start = 0
    for row in range(mask.shape[0]):
        n_prompt = int(mask[row, :prompt_width].sum())
        response_slots += list(range(start + n_prompt - 1, start + int(lengths[row]) - 1))
        start += int(lengths[row])
    idx = torch.tensor(response_slots)
    for plain, zorro in zip(outs[False], outs[True]):
        for key in ("log_probs", "entropy"):
            diff = (getattr(plain, key)[idx] - getattr(zorro, key)[idx]).abs().max().item()
            assert diff < 1e-5, f"{key}: ZoRRo differs from the plain path by {diff}"
