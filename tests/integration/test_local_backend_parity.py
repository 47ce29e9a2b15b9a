"""The local engine computes what verl computes: log-probs and one PPO update.

* ``compute_log_prob`` equals ``verl.utils.torch_functional.logprobs_from_logits``
  (and ``entropy_from_logits``) on the Hugging Face model output, row by row.
* ``update_actor`` gives the same losses, gradient norms and parameter update as
  verl's own ``DataParallelPPOActor.update_policy`` on the same batch, weights
  and optimizer, for several policy-loss modes, the KL loss and the entropy bonus.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from support.local_backend_helpers import (
    dense_rollout_batch,
    engine_settings,
    main_config,
    random_rollouts,
    to_no_padding,
)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from verl.workers.remote_client.local.engine import LocalEngine

    return LocalEngine(engine_settings(tiny_model_dir, need_ref=True))


def test_training_forward_projects_only_the_response_slots_and_gives_the_full_forwards_values(tiny_model_dir):
    """update_actor's forward asks the model for the logits of the response slots only: the
    slots verl reads back, values and gradients equal to the all-slot forward there."""
    from transformers import AutoModelForCausalLM

    from verl.workers.remote_client.local.forward import packed_forward, response_slots

    prompts, responses = random_rollouts(6, seed=3, prompt_len=(2, 12), response_len=(1, 9))
    td = to_no_padding(dense_rollout_batch(prompts, responses))
    expected, start = [], 0  # slot of log p(response token j) = row start + prompt length + j - 1
    for p, r in zip(prompts, responses):
        expected += [start + len(p) + j - 1 for j in range(len(r))]
        start += len(p) + len(r)
    slots = response_slots(td)
    assert slots.nonzero().squeeze(-1).tolist() == expected

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    projected = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, o: projected.append(i[0].shape[:-1]))
    weights = torch.randn(slots.numel(), generator=torch.Generator().manual_seed(0))

    def run(**kw):
        model.zero_grad(set_to_none=True)
        out = packed_forward(model, td["input_ids"], td["position_ids"], temperature=0.7, calculate_entropy=True, **kw)
        (out["log_probs"] * weights).sum().backward()
        return out, [p.grad.clone() for p in model.parameters()]

    full, full_grads = run()
    part, part_grads = run(slots=slots)
    hook.remove()
    assert projected[1].numel() == len(expected) < projected[0].numel()
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(part[key][slots], full[key][slots], atol=1e-6, rtol=0)
        assert not part[key][~slots].any()
    grad_weights = weights * slots  # the full forward's gradient restricted to the same slots
    model.zero_grad(set_to_none=True)
    out = packed_forward(model, td["input_ids"], td["position_ids"], temperature=0.7)
    (out["log_probs"] * grad_weights).sum().backward()
    for got, want in zip(part_grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert any((a - b).abs().max() > 1e-4 for a, b in zip(full_grads, part_grads))  # other slots do count in full


def test_packed_rows_run_without_padding_and_match_the_padded_forward(tiny_model_dir):
    """An sdpa model switched by use_packed_rows sees the rows as one unpadded sequence (its
    layers process exactly T tokens) and gives the padded forward's log-probs and entropy."""
    from transformers import AutoModelForCausalLM

    from verl.workers.remote_client.local.forward import packed_forward, use_packed_rows

    prompts, responses = random_rollouts(5, seed=4, prompt_len=(2, 14), response_len=(1, 12))
    td = to_no_padding(dense_rollout_batch(prompts, responses))
    total = td["input_ids"].values().numel()
    padded_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    packed_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    assert use_packed_rows(packed_model)
    seen = []
    packed_model.model.layers[0].mlp.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[:-1].numel()))
    with torch.no_grad():
        want = packed_forward(padded_model, td["input_ids"], td["position_ids"], calculate_entropy=True)
        got = packed_forward(packed_model, td["input_ids"], td["position_ids"], calculate_entropy=True)
    assert seen == [total] and max(len(p) + len(r) for p, r in zip(prompts, responses)) * len(prompts) > total
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=0)
    windowed = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa", use_sliding_window=True, sliding_window=4
    )
    assert not use_packed_rows(windowed)  # per-row causal SDPA would drop the window
    assert windowed.config._attn_implementation == "sdpa"


@pytest.fixture(scope="module")
def dist_group():
    """verl's legacy actor asks torch.distributed for its rank: a 1-process gloo group."""
    if torch.distributed.is_initialized():
        yield
        return
    store = tempfile.mktemp(prefix="lb_dist_")
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()
    if os.path.exists(store):
        os.remove(store)


def _hf_reference(model_dir, prompts, responses, temperature):
    from transformers import AutoModelForCausalLM

    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    lps, ents = [], []
    with torch.no_grad():
        for p, r in zip(prompts, responses):
            row = torch.tensor(p + r)[None]
            logits = model(input_ids=row).logits[0] / temperature
            lp = logprobs_from_logits(logits[:-1], row[0, 1:])
            lps.append(torch.cat([lp, torch.zeros(1)]))
            ents.append(torch.cat([entropy_from_logits(logits[:-1]), torch.zeros(1)]))
    return torch.cat(lps), torch.cat(ents)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("micro_batch", [None, 3])
def test_compute_log_prob_matches_verl_logprobs_from_logits(tiny_model_dir, temperature, micro_batch):
    from verl.workers.remote_client.local.engine import LocalEngine

    eng = LocalEngine(engine_settings(tiny_model_dir, log_prob_micro_batch_size=micro_batch))
    prompts, responses = random_rollouts(7, seed=1)
    td = to_no_padding(dense_rollout_batch(prompts, responses), calculate_entropy=True)
    out = eng.compute_log_prob(td, ref=False, calculate_entropy=True, temperature=temperature)

    ref_lp, ref_ent = _hf_reference(tiny_model_dir, prompts, responses, temperature)
    assert out.log_probs.shape == (td["input_ids"].values().numel(),)
    torch.testing.assert_close(out.log_probs, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.entropy, ref_ent, atol=1e-5, rtol=0)
    assert out.device.type == "cpu" and out.device.count == 1


def test_reference_log_probs_stay_frozen_while_the_actor_trains(engine):
    prompts, responses = random_rollouts(4, seed=2)
    td = to_no_padding(dense_rollout_batch(prompts, responses))
    before = engine.log_probs(td, ref=True)["log_probs"]
    with torch.no_grad():
        for p in engine.model.parameters():
            p.add_(0.01)
    try:
        assert not torch.allclose(engine.log_probs(td)["log_probs"], before)
        torch.testing.assert_close(engine.log_probs(td, ref=True)["log_probs"], before)
    finally:
        with torch.no_grad():
            for p in engine.model.parameters():
                p.sub_(0.01)


# --------------------------------------------------------------------------- update parity
def _update_inputs(model_dir, n, seed, temperature):
    """A batch with old/ref log-probs near the current policy and mixed-sign advantages."""
    from verl.workers.remote_client.local.engine import LocalEngine
    from verl.workers.utils.padding import no_padding_2_padding

    prompts, responses = random_rollouts(n, seed=seed)
    dense = dense_rollout_batch(prompts, responses)
    probe = LocalEngine(engine_settings(model_dir))
    td = to_no_padding(dense)
    current = no_padding_2_padding(probe.log_probs(td, temperature=temperature)["log_probs"], td)
    g = torch.Generator().manual_seed(seed)
    mask = dense["response_mask"].float()
    dense["old_log_probs"] = (current + 0.3 * torch.randn(current.shape, generator=g)) * mask
    dense["ref_log_prob"] = (current + 0.2 * torch.randn(current.shape, generator=g)) * mask
    dense["advantages"] = torch.randn(n, 1, generator=g).expand_as(mask) * mask * 2.0
    return dense


def _verl_legacy_update(model_dir, dense, actor_cfg, optim_cfg, temperature):
    """Run verl's DataParallelPPOActor.update_policy; return (metrics, model)."""
    from transformers import AutoModelForCausalLM

    from verl import DataProto
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.config.optimizer import build_optimizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = build_optimizer(model.parameters(), optim_cfg)
    actor = DataParallelPPOActor(actor_cfg, model, optimizer)
    keys = [
        "responses",
        "response_mask",
        "input_ids",
        "attention_mask",
        "position_ids",
        "old_log_probs",
        "advantages",
        "ref_log_prob",
    ]
    proto = DataProto.from_dict(tensors={k: dense[k] for k in keys}, meta_info={"temperature": temperature})
    metrics = actor.update_policy(proto)
    return metrics, model


CASES = {
    # loss mode, optimizer, KL loss, entropy bonus, loss aggregation
    "vanilla-sgd-kl": dict(
        loss_mode="vanilla", optimizer="SGD", use_kl_loss=True, entropy_coeff=0.0, loss_agg_mode="token-mean"
    ),
    "vanilla-adamw-entropy": dict(
        loss_mode="vanilla", optimizer="AdamW", use_kl_loss=False, entropy_coeff=0.01, loss_agg_mode="token-mean"
    ),
    "gspo-sgd-kl": dict(
        loss_mode="gspo", optimizer="SGD", use_kl_loss=True, entropy_coeff=0.0, loss_agg_mode="seq-mean-token-mean"
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_actor_matches_verl_dp_actor(tiny_model_dir, dist_group, case):
    from omegaconf import OmegaConf

    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.remote_client.local.engine import LocalEngine

    spec = CASES[case]
    n, mini, temperature = 8, 4, 0.9
    cfg = main_config(
        tiny_model_dir,
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size_per_gpu=mini,  # legacy actor averages per micro-batch; one micro-batch = same math
        use_kl_loss=spec["use_kl_loss"],
        kl_loss_coef=0.1,
        kl_loss_type="low_var_kl",
        entropy_coeff=spec["entropy_coeff"],
        loss_agg_mode=spec["loss_agg_mode"],
        clip_ratio_c=3.0,
        **{"policy_loss.loss_mode": spec["loss_mode"], "fsdp_config.dtype": "float32"},
    )
    OmegaConf.update(cfg, "actor_rollout_ref.model.use_remove_padding", False)  # padded path: no flash_attn
    OmegaConf.update(cfg, "actor_rollout_ref.actor.optim.optimizer", spec["optimizer"], merge=True)
    OmegaConf.update(cfg, "actor_rollout_ref.actor.optim.lr", 0.05 if spec["optimizer"] == "SGD" else 1e-3)
    actor_cfg = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    dense = _update_inputs(tiny_model_dir, n, seed=7, temperature=temperature)

    legacy_metrics, legacy_model = _verl_legacy_update(
        tiny_model_dir, dense, actor_cfg, omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.optim), temperature
    )

    from verl.workers.remote_client.local.config import EngineSettings

    eng = LocalEngine(EngineSettings.from_main_config(cfg))
    initial = {k: v.detach().clone() for k, v in eng.model.named_parameters()}
    td = to_no_padding(
        dense,
        calculate_entropy=spec["entropy_coeff"] != 0,
        global_batch_size=mini,
        mini_batch_size=mini,
        epochs=1,
        seed=42,
        dataloader_kwargs={"shuffle": False},
        temperature=temperature,
    )
    out = eng.update_actor(td, cfg.actor_rollout_ref.actor, temperature=temperature)
    m = out.metrics

    # Legacy sums pg_loss/kl_loss over mini-batches; we report one value per optimizer step.
    assert len(m["grad_norm"]) == n // mini
    # The legacy actor subtracts the entropy bonus from pg_loss in place before logging it.
    legacy_pg = sum(pg - spec["entropy_coeff"] * ent for pg, ent in zip(m["pg_loss"], m["entropy"]))
    assert legacy_pg == pytest.approx(legacy_metrics["actor/pg_loss"], rel=1e-5, abs=1e-7)
    assert m["grad_norm"] == pytest.approx(legacy_metrics["actor/grad_norm"], rel=1e-5)
    assert m["pg_clipfrac"] == pytest.approx(legacy_metrics["actor/pg_clipfrac"], rel=1e-5, abs=1e-7)
    assert m["ppo_kl"] == pytest.approx(legacy_metrics["actor/ppo_kl"], rel=1e-5, abs=1e-7)
    if spec["use_kl_loss"]:
        assert sum(m["kl_loss"]) == pytest.approx(legacy_metrics["actor/kl_loss"], rel=1e-5, abs=1e-7)
    if spec["entropy_coeff"]:
        assert m["entropy"] == pytest.approx(legacy_metrics["actor/entropy"], rel=1e-5)
    assert out.loss == pytest.approx(sum(m["loss"]))
    assert out.global_token_num == td["input_ids"].offsets().diff().tolist()

    legacy_params = dict(legacy_model.named_parameters())
    all_ours, all_theirs = [], []
    for name, p in eng.model.named_parameters():
        ours, theirs = p.detach() - initial[name], legacy_params[name].detach() - initial[name]
        assert theirs.abs().max() > 0, f"{name} did not move in verl's update"
        all_ours.append(ours.flatten())
        all_theirs.append(theirs.flatten())
        # Softmax attention is invariant to the key bias, so its true gradient is 0 and what
        # is left is float round-off; Adam rescales that noise to full-size steps.
        if spec["optimizer"] == "AdamW" and name.endswith("k_proj.bias"):
            continue
        # The update is read back as (float32 weight after) - (weight before): a weight near 1.0
        # (a norm scale) stores a 1e-3 step only to its ulp, 1.2e-7, which alone is 1e-5 of a
        # 64-element update. The bound applies to what exceeds the stored weight's resolution (eps * |w|).
        ulp = torch.finfo(p.dtype).eps * p.detach().abs()
        excess = ((ours - theirs).abs() - ulp).clamp(min=0)
        rel = excess.norm() / theirs.norm()
        # Per tensor, Adam's round-off reaches ~1e-5 either way: the padded forward gave 9.9e-6
        # on a k_proj, the packed one 1.07e-5 on a q_proj (whole model: 4.6e-6 vs 4.8e-6). On
        # another Xeon the same case gave 2.78e-5 on layers.1.k_proj (every other tensor <= 6.2e-6):
        # part of a key projection's gradient is a shift of all keys that softmax ignores, as
        # for the key bias, so Adam rescales its round-off. Per tensor 5e-5; the model-wide bound
        # below stays 1e-5.
        assert rel < 5e-5, f"{name}: relative difference of the update beyond eps * |w| {rel:.2e}"
    ours, theirs = torch.cat(all_ours), torch.cat(all_theirs)
    assert (ours - theirs).norm() / theirs.norm() < 1e-5


def test_micro_batch_accumulation_is_invariant_to_the_micro_batch_size(tiny_model_dir):
    """verl's new engine normalises every micro-batch by the whole mini-batch, so 1, 2 or 4 rows
    per micro-batch give the same update (the legacy actor's per-micro-batch mean would not)."""
    from verl.workers.remote_client.local.config import EngineSettings
    from verl.workers.remote_client.local.engine import LocalEngine

    dense = _update_inputs(tiny_model_dir, 8, seed=3, temperature=1.0)
    results = []
    for micro in (1, 2, 4):
        cfg = main_config(
            tiny_model_dir,
            ppo_mini_batch_size=8,
            ppo_micro_batch_size_per_gpu=micro,
            use_kl_loss=True,
            **{"optim.optimizer": "SGD", "optim.lr": 0.05},
        )  # SGD: the update is the gradient
        eng = LocalEngine(EngineSettings.from_main_config(cfg))
        td = to_no_padding(
            dense,
            mini_batch_size=8,
            global_batch_size=8,
            epochs=1,
            seed=1,
            dataloader_kwargs={"shuffle": False},
            calculate_entropy=False,
        )
        out = eng.update_actor(td, cfg.actor_rollout_ref.actor)
        results.append((out, torch.cat([p.detach().flatten() for p in eng.model.parameters()])))
    (base, base_params), *others = results
    for out, params in others:
        assert out.loss == pytest.approx(base.loss, rel=1e-5)
        assert out.metrics["grad_norm"] == pytest.approx(base.metrics["grad_norm"], rel=1e-5)
        torch.testing.assert_close(params, base_params, rtol=1e-5, atol=1e-7)


def test_epochs_and_shuffle_follow_verl_make_iterator(tiny_model_dir):
    """2 epochs x 2 mini-batches = 4 optimizer steps; the same seed reproduces the same update."""
    from verl.workers.remote_client.local.config import EngineSettings
    from verl.workers.remote_client.local.engine import LocalEngine

    dense = _update_inputs(tiny_model_dir, 8, seed=5, temperature=1.0)
    cfg = main_config(tiny_model_dir, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2)
    runs = []
    for seed in (11, 11, 12):
        eng = LocalEngine(EngineSettings.from_main_config(cfg))
        td = to_no_padding(
            dense,
            mini_batch_size=4,
            global_batch_size=4,
            epochs=2,
            seed=seed,
            dataloader_kwargs={"shuffle": True},
            calculate_entropy=False,
        )
        out = eng.update_actor(td, cfg.actor_rollout_ref.actor)
        assert len(out.metrics["grad_norm"]) == 4 and eng.optimizer_steps == 4
        assert out.global_token_num == td["input_ids"].offsets().diff().tolist()  # per sample, once
        runs.append(out.metrics["pg_loss"])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_shuffled_epochs_from_the_actor_config_match_verl_dp_actor_in_make_iterators_order(tiny_model_dir, dist_group):
    """shuffle=True, 2 mini-batches x 2 epochs, mixed-sign advantages, and a batch that carries no
    schedule fields (read from the actor config as verl's trainer would): the same per-step gradient
    norms, the same losses and the same final weights as verl's ``DataParallelPPOActor`` given each
    epoch's rows in the order verl's own ``make_iterator`` draws them."""
    import copy

    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.config.optimizer import build_optimizer
    from verl.workers.remote_client.local.config import EngineSettings
    from verl.workers.remote_client.local.engine import LocalEngine

    n, mini, epochs, seed, temperature = 8, 4, 2, 13, 0.9
    cfg = main_config(tiny_model_dir, ppo_mini_batch_size=mini, ppo_micro_batch_size_per_gpu=mini, ppo_epochs=epochs,
                      shuffle=True, data_loader_seed=seed,
                      **{"fsdp_config.dtype": "float32", "optim.optimizer": "SGD", "optim.lr": 0.05})  # fmt: skip
    OmegaConf.update(cfg, "actor_rollout_ref.model.use_remove_padding", False)  # padded path: no flash_attn
    assert int(cfg.actor_rollout_ref.rollout.n) == 1  # mini-batch rows = ppo_mini_batch_size
    dense = _update_inputs(tiny_model_dir, n, seed=7, temperature=temperature)
    assert dense["advantages"][:, 0].unique().numel() == n  # every row pulls its own way

    # verl's order: its own iterator over the row numbers
    rows = tu.get_tensordict({"row": torch.arange(n)})
    order = [mb["row"] for mb in tu.make_iterator(rows, mini_batch_size=mini, epochs=epochs, seed=seed,
                                                  dataloader_kwargs={"shuffle": True})]  # fmt: skip
    per_epoch = [torch.cat(order[e * n // mini : (e + 1) * n // mini]) for e in range(epochs)]
    assert per_epoch[0].tolist() != list(range(n)) and per_epoch[0].tolist() != per_epoch[1].tolist()

    # verl's actor: one update_policy per epoch (it does not shuffle), rows in that epoch's order
    legacy_cfg = copy.deepcopy(cfg)
    OmegaConf.update(legacy_cfg, "actor_rollout_ref.actor.ppo_epochs", 1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    actor = DataParallelPPOActor(
        omega_conf_to_dataclass(legacy_cfg.actor_rollout_ref.actor),
        model,
        build_optimizer(model.parameters(), omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.optim)),
    )
    keys = ["responses", "response_mask", "input_ids", "attention_mask", "position_ids", "old_log_probs", "advantages"]
    legacy_grad_norms, legacy_pg = [], []
    for perm in per_epoch:
        proto = DataProto.from_dict(tensors={k: dense[k][perm] for k in keys}, meta_info={"temperature": temperature})
        metrics = actor.update_policy(proto)
        legacy_grad_norms += list(metrics["actor/grad_norm"])
        legacy_pg.append(metrics["actor/pg_loss"])  # summed over the epoch's mini-batches

    eng = LocalEngine(EngineSettings.from_main_config(cfg))
    initial = {k: v.detach().clone() for k, v in eng.model.named_parameters()}
    td = to_no_padding(dense, calculate_entropy=False, global_batch_size=mini, temperature=temperature)
    out = eng.update_actor(td, cfg.actor_rollout_ref.actor, temperature=temperature)
    m = out.metrics

    steps = n // mini
    assert len(m["grad_norm"]) == epochs * steps and eng.optimizer_steps == epochs * steps
    assert m["grad_norm"] == pytest.approx(legacy_grad_norms, rel=1e-5)
    assert [sum(m["pg_loss"][e * steps : (e + 1) * steps]) for e in range(epochs)] == pytest.approx(
        legacy_pg, rel=1e-5, abs=1e-7
    )
    legacy_params = dict(model.named_parameters())
    ours = torch.cat([(p.detach() - initial[k]).flatten() for k, p in eng.model.named_parameters()])
    theirs = torch.cat([(legacy_params[k].detach() - initial[k]).flatten() for k in initial])
    assert (ours - theirs).norm() / theirs.norm() < 1e-5


def _grouped_rollouts(seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """GRPO-shaped rows: 3 prompts (17-24 tokens) x 3 samples each, then one row of its own.
    The first prompt's samples all begin their responses with the same 3 tokens, so their
    common prefix runs 3 tokens past the prompt."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 500, (n,), generator=g).tolist()

    prompts, responses = [], []
    for length in (17, 24, 20):
        prompt = ids(length)
        for _ in range(3):
            prompts.append(prompt)
            responses.append(ids(int(torch.randint(2, 10, (1,), generator=g))))
    responses[0] = ids(5)
    responses[1] = responses[0][:3] + ids(4)
    responses[2] = responses[0][:3] + ids(2)
    prompts.append(ids(19))
    responses.append(ids(6))
    return prompts, responses


def test_shared_prefix_layout_groups_consecutive_rows_whose_first_tokens_and_positions_match():
    from verl.workers.remote_client.local.forward import MIN_SHARED_PREFIX, shared_prefix_layout

    assert MIN_SHARED_PREFIX == 16
    head = list(range(100, 116))  # 16 tokens
    rows = [head + [1, 2], head + [1, 3, 4], head[:15] + [9, 9], head + [5]]
    ids = torch.tensor([t for r in rows for t in r])
    offsets = [0]
    for r in rows:
        offsets.append(offsets[-1] + len(r))
    pos = torch.cat([torch.arange(len(r)) for r in rows])
    layout = shared_prefix_layout(ids, pos, offsets)
    # rows 0 and 1 share 17 tokens; row 2 matches only 15 (too short) and starts a group that row 3
    # cannot join (15 < 16 again)
    assert layout.groups == [(17, (1, 2)), (17, ()), (17, ())]
    assert layout.source.numel() == 17 + 1 + 2 + 17 + 17 == ids.numel() - 17
    torch.testing.assert_close(ids[layout.source][layout.gather], ids, rtol=0, atol=0)
    torch.testing.assert_close(pos[layout.source][layout.gather], pos, rtol=0, atol=0)
    shifted = pos.clone()
    shifted[offsets[1] : offsets[2]] += 1  # same tokens at other positions: nothing in common
    assert shared_prefix_layout(ids, shifted, offsets) is None


@pytest.mark.parametrize("only_response_slots", [False, True], ids=["all-slots", "response-slots"])
def test_shared_prefixes_run_once_and_give_the_unshared_forwards_values_and_gradients(
    tiny_model_dir, only_response_slots
):
    """share_prefixes: the layers process each group's common prefix once (fewer tokens), and
    log-probs, entropy and weight gradients equal the row-by-row forward's up to float32 round-off."""
    from transformers import AutoModelForCausalLM

    from verl.workers.remote_client.local.forward import packed_forward, response_slots, use_packed_rows

    prompts, responses = _grouped_rollouts(seed=5)
    td = to_no_padding(dense_rollout_batch(prompts, responses))
    total = td["input_ids"].values().numel()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    assert use_packed_rows(model)
    seen = []
    model.model.layers[0].mlp.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[:-1].numel()))
    slots = response_slots(td) if only_response_slots else None
    weights = torch.randn(total, generator=torch.Generator().manual_seed(1))

    def run(share: bool):
        model.zero_grad(set_to_none=True)
        out = packed_forward(model, td["input_ids"], td["position_ids"], temperature=0.7, calculate_entropy=True,
                             slots=slots, share_prefixes=share)  # fmt: skip
        (out["log_probs"] * weights).sum().backward()
        return out, [p.grad.clone() for p in model.parameters()]

    (rowwise, rowwise_grads), (shared, shared_grads) = run(False), run(True)
    common = [17 + 3, 24, 20]  # per group of 3 rows, held once instead of 3 times
    assert seen == [total, total - 2 * sum(common)]
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(shared[key], rowwise[key], atol=1e-5, rtol=0)
    assert rowwise["log_probs"].abs().max() > 1  # not all zeros
    for got, want in zip(shared_grads, rowwise_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_use_prefix_grouper_gives_the_same_update_and_log_probs_as_the_row_by_row_forward(tiny_model_dir):
    """verl's actor.use_prefix_grouper=true: update_actor and compute_log_prob run each GRPO
    group's prompt once and give the same loss, gradient norm, new weights and log-probs as
    without it (float32 round-off)."""
    from verl.workers.remote_client.local.config import EngineSettings
    from verl.workers.remote_client.local.engine import LocalEngine

    prompts, responses = _grouped_rollouts(seed=6)
    n = len(prompts)
    g = torch.Generator().manual_seed(6)
    dense = dense_rollout_batch(prompts, responses)
    mask = dense["response_mask"].float()
    dense["old_log_probs"] = -3.0 * torch.rand(mask.shape, generator=g) * mask
    dense["advantages"] = torch.randn(n, 1, generator=g).expand_as(mask) * mask
    results = []
    for grouped in (False, True):
        cfg = main_config(tiny_model_dir, ppo_mini_batch_size=n, ppo_micro_batch_size_per_gpu=5,
                          use_prefix_grouper=grouped, **{"optim.optimizer": "SGD", "optim.lr": 0.05})  # fmt: skip
        eng = LocalEngine(EngineSettings.from_main_config(cfg))
        assert eng.settings.share_prefixes is grouped
        seen = []
        eng.model.model.layers[0].mlp.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[:-1].numel()))
        td = to_no_padding(dense, mini_batch_size=n, global_batch_size=n, epochs=1, seed=1,
                           dataloader_kwargs={"shuffle": False}, calculate_entropy=False)  # fmt: skip
        log_probs = eng.log_probs(td, temperature=0.8)["log_probs"]
        out = eng.update_actor(td, cfg.actor_rollout_ref.actor, temperature=0.8)
        params = torch.cat([p.detach().flatten() for p in eng.model.parameters()])
        results.append((log_probs, out, params, sum(seen)))
    (lp, base, base_params, tokens), (lp_grouped, grouped, grouped_params, tokens_grouped) = results
    assert tokens_grouped < tokens
    torch.testing.assert_close(lp_grouped, lp, atol=1e-5, rtol=0)
    assert grouped.loss == pytest.approx(base.loss, rel=1e-5)
    assert grouped.metrics["grad_norm"] == pytest.approx(base.metrics["grad_norm"], rel=1e-5)
    torch.testing.assert_close(grouped_params, base_params, rtol=1e-5, atol=1e-6)
    step = (base_params - _initial_params(tiny_model_dir)).norm()
    assert (grouped_params - base_params).norm() < 1e-4 * step  # far below the update itself


def _initial_params(model_dir: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return torch.cat([p.detach().flatten() for p in model.parameters()])
