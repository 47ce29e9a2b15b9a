"""The ``tinker`` backend against a real Tinker-API server: skyrl 0.4.0 (JAX, CPU), tinker SDK 0.25.0.

One server (tiny Llama, started once for the module) serves every test here:

* log-prob parity: the adapter's packed ``compute_log_prob`` (training client ``forward``) equals
  the server's own ``compute_logprobs`` on the same tokens, for actor and reference;
* update parity: the loss ``update_actor`` reports equals verl's PPO objective
  (``compute_policy_loss_vanilla`` + ``agg_loss``) on the same log-probs for every
  ``loss_agg_mode``, and the update lowers verl's objective (gradient direction);
* generate / update_weights / handle: a re-attached instance (as in the rollout server) samples
  from the newest weights, stops at EOS, and its ``destroy`` leaves the model alone;
* the adapter conformance kit, every check passing;
* the entry point end to end (``trainer.remote_backend=tinker``, GRPO on gsm8k, 2 steps),
  resume from its checkpoint, and a server killed mid-run failing clearly within 30 s.

The server's environment is built by ``scripts/setup_tinker_server.sh`` (cached); when that build
fails these tests fail (not skip), with its output as the reason: a skip would hide the whole file.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("tinker", reason="the tinker SDK is not installed: pip install 'verl-remote-backend[tinker]'")

from support.aio import run_async as run  # noqa: E402
from support.leaks import files_holding  # noqa: E402
from support.local_backend_helpers import dense_rollout_batch, random_rollouts, to_no_padding  # noqa: E402
from support.remote_e2e import (  # noqa: E402
    LOGGED_STEP_METRICS,
    REPO_ROOT,
    build_gsm8k,
    compose,
    run_entry,
    small_ci_overrides,
)
from support.tinker_server import API_KEY, ServerEnvUnavailable, TinkerServer, build_tiny_llama, server_venv  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.tinker]

LORA_RANK = 4


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """The module's server, started once (the last test kills it: see :func:`server`)."""
    root = tmp_path_factory.mktemp("tinker")
    try:
        venv = server_venv()
    except ServerEnvUnavailable as exc:
        pytest.fail(f"skyrl's Tinker server environment could not be built: {exc}")
    model = build_tiny_llama(root / "model")
    srv = TinkerServer(venv, model, root / "server").start()
    print(f"[tinker] server ready in {srv.ready_s:.1f}s at {srv.base_url}")
    try:
        yield srv
    finally:
        srv.stop()
    assert not srv.alive()


@pytest.fixture
def server(shared_server):
    """The module's server, alive: started again if a test before this one killed it (the kill test
    runs last in file order, so this restart happens only when tests run in another order)."""
    if not shared_server.alive():
        shared_server.start()
    return shared_server


def tinker_overrides(srv: TinkerServer) -> list[str]:
    """What a verl GRPO line needs for this server: LoRA (rank in range, the server's alpha), no
    gradient clipping (the server has none), and where the server is."""
    return [
        f"actor_rollout_ref.model.lora_rank={LORA_RANK}",
        "actor_rollout_ref.model.lora_alpha=32",
        "actor_rollout_ref.actor.grad_clip=1e9",
        f"remote_backend.tinker.base_url={srv.base_url}",
        f"remote_backend.tinker.api_key={API_KEY}",
        "remote_backend.tinker.max_lora_rank=8",
        "remote_backend.tinker.startup_timeout_s=120",
    ]


def backend_config(srv: TinkerServer, tmp: Path, *extra: str):
    ov = small_ci_overrides(
        model=srv.model, train="unused", test="unused", ckpt_dir=tmp / "ckpt", steps=1, backend="tinker"
    )
    return compose(ov + tinker_overrides(srv) + ["actor_rollout_ref.actor.optim.lr=0.02", *extra])


def batch(n: int = 4, seed: int = 0, **non_tensor):
    prompts, responses = random_rollouts(n, seed=seed, vocab=400)
    return prompts, responses, dense_rollout_batch(prompts, responses)


# --------------------------------------------------------------------------- log-probs
def test_compute_log_prob_equals_server_compute_logprobs(server, tmp_path):
    from verl.remote_backend.registry import RemoteBackendRegistry

    cfg = backend_config(server, tmp_path)
    backend = RemoteBackendRegistry.create("tinker", cfg) if hasattr(RemoteBackendRegistry, "create") else None
    backend = backend or RemoteBackendRegistry.get("tinker").from_config(cfg)
    try:
        prompts, responses, dense = batch(4, seed=1)
        td = to_no_padding(dense)
        actor = run(
            backend.compute_log_prob(
                td, ref=False, calculate_entropy=True, rollout_n=1, temperature=1.0, pad_token_id=0
            )
        )
        ref = run(
            backend.compute_log_prob(
                td, ref=True, calculate_entropy=False, rollout_n=1, temperature=1.0, pad_token_id=0
            )
        )
        packed = actor.log_probs
        assert packed.shape == (td["input_ids"].values().numel(),)
        # the server's own answer, through the SDK, on each row's tokens (one value per token after the first)
        import tinker
        from tinker import types

        from verl.workers.remote_client.tinker.client import close_sdk_sessions

        service = tinker.ServiceClient(base_url=server.base_url, api_key=API_KEY)
        sampler = service.create_sampling_client(base_model=server.model)
        offsets = td["input_ids"].offsets().tolist()
        for i, (p, r) in enumerate(zip(prompts, responses)):
            want = sampler.compute_logprobs(types.ModelInput.from_ints(p + r)).result()
            want = torch.tensor([float(x) for x in want[-(len(p) + r.__len__() - 1) :]])
            row = packed[offsets[i] : offsets[i + 1]]
            # LoRA starts at B=0: actor == base model; slot t = log p(token t+1 | <= t), last slot 0
            torch.testing.assert_close(row[:-1], want, rtol=0, atol=1e-4)
            assert row[-1] == 0
            torch.testing.assert_close(ref.log_probs[offsets[i] : offsets[i + 1]][:-1], want, rtol=0, atol=1e-4)
        torch.testing.assert_close(actor.entropy, -packed)
        close_sdk_sessions(service)
    finally:
        asyncio.run(backend.destroy())


# --------------------------------------------------------------------------- update parity
def _verl_objective(actor_cfg, old, new, adv, mask, mode):
    from verl.trainer.ppo.core_algos import agg_loss

    ratio = torch.exp(new - old)
    low, high = 1 - actor_cfg.clip_ratio_low, 1 + actor_cfg.clip_ratio_high
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, low, high)
    clip1 = torch.maximum(l1, l2)
    l3 = -adv * actor_cfg.clip_ratio_c
    clip2 = torch.min(l3, clip1)
    loss_mat = torch.where(adv < 0, clip2, clip1)  # verl's compute_policy_loss_vanilla
    return float(agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode))


def _padded(packed, dense, td):
    """Packed predict-next slots -> verl's [B, R] response log-probs."""
    p_width = dense["prompts"].shape[1]
    out = torch.zeros(dense["responses"].shape)
    offsets = td["input_ids"].offsets().tolist()
    for i in range(out.shape[0]):
        p = int(dense["attention_mask"][i, :p_width].sum())
        r = int(dense["attention_mask"][i, p_width:].sum())
        row = packed[offsets[i] : offsets[i + 1]]
        out[i, :r] = row[p - 1 : p - 1 + r]
    return out


def _update_backend(server, tmp_path, rows: int, *extra: str):
    """A ``tinker`` backend for one update of ``rows`` rows (one mini-batch, lr 1e-3, no weight decay),
    and verl's actor config as the backend receives it."""
    from omegaconf import OmegaConf

    from verl.remote_backend.registry import RemoteBackendRegistry

    cfg = backend_config(
        server,
        tmp_path,
        f"actor_rollout_ref.actor.ppo_mini_batch_size={rows}",
        f"data.train_batch_size={rows}",
        "actor_rollout_ref.actor.optim.lr=0.001",
        "actor_rollout_ref.actor.optim.weight_decay=0",
        *extra,
    )
    actor_cfg = OmegaConf.create(OmegaConf.to_container(cfg.actor_rollout_ref.actor, resolve=True))
    return RemoteBackendRegistry.get("tinker").from_config(cfg), actor_cfg


def _response_log_probs(backend, td, dense):
    """The backend's actor log-probs of ``td``'s responses, in verl's [B, R] layout."""
    out = run(
        backend.compute_log_prob(td, ref=False, calculate_entropy=False, rollout_n=1, temperature=1.0, pad_token_id=0)
    )
    return _padded(out.log_probs, dense, td)


def _update(backend, actor_cfg, dense, *, advantages, old_log_probs):
    """One ``update_actor`` on ``dense`` with these advantages and old log-probs: one mini-batch of
    every row, one epoch, no shuffling."""
    dense_u = dense.clone()
    dense_u["advantages"], dense_u["old_log_probs"] = advantages, old_log_probs
    rows = dense.batch_size[0]
    tdu = to_no_padding(dense_u, mini_batch_size=rows, epochs=1, seed=0, dataloader_kwargs={"shuffle": False})
    return run(backend.update_actor(tdu, actor_config=actor_cfg, pad_token_id=0, rollout_n=1, temperature=1.0))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_update_actor_matches_verl_objective(server, tmp_path, mode):
    backend, actor_cfg = _update_backend(server, tmp_path, 6, f"actor_rollout_ref.actor.loss_agg_mode={mode}")
    try:
        prompts, responses, dense = batch(6, seed=7)
        td = to_no_padding(dense)
        new0 = _response_log_probs(backend, td, dense)
        mask = dense["response_mask"].float()
        g = torch.Generator().manual_seed(3)
        adv = (torch.randn(6, 1, generator=g) * torch.ones_like(mask)) * mask  # GRPO: one advantage per sequence
        # old log-probs off by up to +-0.4: some ratios leave [0.8, 1.2], so the clip matters
        old = (new0 + (torch.rand(new0.shape, generator=g) - 0.5) * 0.8) * mask
        out = _update(backend, actor_cfg, dense, advantages=adv, old_log_probs=old)
        want = _verl_objective(actor_cfg, old, new0, adv, mask, mode)
        assert out.loss == pytest.approx(want, rel=1e-4, abs=1e-6), (mode, out.loss, want)
        assert out.metrics["pg_loss"] == [pytest.approx(want, rel=1e-4, abs=1e-6)]
        assert out.metrics["grad_norm"][0] > 0 and math.isfinite(out.metrics["grad_norm"][0])
        assert out.global_token_num == [len(p) + len(r) for p, r in zip(prompts, responses)]
        # gradient direction: the server's step lowers verl's objective on the same batch
        after = _verl_objective(actor_cfg, old, _response_log_probs(backend, td, dense), adv, mask, mode)
        assert after < want, (mode, want, after)
    finally:
        asyncio.run(backend.destroy())


def test_negated_advantages_raise_verl_objective(server, tmp_path):
    """The direction check can fail: the same step with the advantages' sign flipped raises it."""
    backend, actor_cfg = _update_backend(server, tmp_path, 4)
    try:
        _, _, dense = batch(4, seed=11)
        td = to_no_padding(dense)
        new0 = _response_log_probs(backend, td, dense)
        mask = dense["response_mask"].float()
        adv = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]) * mask
        _update(backend, actor_cfg, dense, advantages=-adv, old_log_probs=new0 * mask)
        before = _verl_objective(actor_cfg, new0 * mask, new0, adv, mask, "token-mean")
        after = _verl_objective(
            actor_cfg, new0 * mask, _response_log_probs(backend, td, dense), adv, mask, "token-mean"
        )
        assert after > before
    finally:
        asyncio.run(backend.destroy())


def test_shuffled_epochs_follow_verls_make_iterator_order(server, tmp_path):
    """shuffle=True, 2 mini-batches x 2 epochs, advantages that differ per row: one update_actor
    gives the per-step losses and final log-probs of the same model trained one mini-batch per
    call, unshuffled, in the order verl's own ``make_iterator`` draws (and step 1's loss is verl's
    objective on verl's first mini-batch)."""
    from omegaconf import OmegaConf

    from verl.remote_backend.registry import RemoteBackendRegistry
    from verl.utils import tensordict_utils as tu

    n, mini, epochs, seed = 8, 4, 2, 5
    cfg = backend_config(
        server,
        tmp_path,
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.optim.lr=0.002",
        "actor_rollout_ref.actor.optim.weight_decay=0",
    )
    actor_cfg = OmegaConf.create(OmegaConf.to_container(cfg.actor_rollout_ref.actor, resolve=True))
    _, _, dense = batch(n, seed=13)
    rows = tu.get_tensordict({"row": torch.arange(n)})
    order = [mb["row"] for mb in tu.make_iterator(rows, mini_batch_size=mini, epochs=epochs, seed=seed,
                                                  dataloader_kwargs={"shuffle": True})]  # fmt: skip
    assert torch.cat(order[:2]).tolist() != list(range(n))
    cls = RemoteBackendRegistry.get("tinker")
    shuffled, ordered = cls.from_config(cfg), cls.from_config(cfg)
    try:
        td = to_no_padding(dense)
        lp0 = run(
            shuffled.compute_log_prob(
                td, ref=False, calculate_entropy=False, rollout_n=1, temperature=1.0, pad_token_id=0
            )
        )
        new0 = _padded(lp0.log_probs, dense, td)
        mask = dense["response_mask"].float()
        g = torch.Generator().manual_seed(4)
        dense["advantages"] = torch.randn(n, 1, generator=g) * mask
        dense["old_log_probs"] = (new0 + (torch.rand(new0.shape, generator=g) - 0.5) * 0.4) * mask
        out = run(
            shuffled.update_actor(
                to_no_padding(
                    dense, mini_batch_size=mini, epochs=epochs, seed=seed, dataloader_kwargs={"shuffle": True}
                ),
                actor_config=actor_cfg,
                pad_token_id=0,
                rollout_n=1,
                temperature=1.0,
            )
        )
        want = []
        for rows_of_step in order:
            part = to_no_padding(
                dense[rows_of_step], mini_batch_size=mini, epochs=1, seed=0, dataloader_kwargs={"shuffle": False}
            )
            want.append(
                run(ordered.update_actor(part, actor_config=actor_cfg, pad_token_id=0, rollout_n=1, temperature=1.0))
            )
        first = order[0]
        verl_first = _verl_objective(actor_cfg, dense["old_log_probs"][first], new0[first], dense["advantages"][first],
                                     mask[first], "token-mean")  # fmt: skip
        assert out.metrics["pg_loss"][0] == pytest.approx(verl_first, rel=1e-4, abs=1e-6)
        assert out.metrics["pg_loss"] == pytest.approx([w.loss for w in want], rel=1e-4, abs=1e-6)
        assert out.metrics["grad_norm"] == pytest.approx([w.metrics["grad_norm"][0] for w in want], rel=1e-4)
        after = [
            run(
                b.compute_log_prob(td, ref=False, calculate_entropy=False, rollout_n=1, temperature=1.0, pad_token_id=0)
            )
            for b in (shuffled, ordered)
        ]
        assert (after[0].log_probs - lp0.log_probs).abs().max() > 1e-3  # it trained
        torch.testing.assert_close(after[0].log_probs, after[1].log_probs, rtol=0, atol=1e-5)
    finally:
        asyncio.run(shuffled.destroy())
        asyncio.run(ordered.destroy())


# --------------------------------------------------------------------------- sampling and handles
def test_generate_follows_update_weights_through_a_handle(server, tmp_path):
    from verl.remote_backend.registry import RemoteBackendRegistry

    cls = RemoteBackendRegistry.get("tinker")
    cfg = backend_config(server, tmp_path)
    owner = cls.from_config(cfg)
    try:
        handle = owner.reconnect_handle()
        assert json.loads(json.dumps(handle)) == handle  # picklable/plain
        assert API_KEY not in json.dumps(handle) and API_KEY not in repr(owner.__dict__.get("cfg"))  # no credential
        rollout = cls.from_config(cfg, handle=handle)
        params = {"max_tokens": 12, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "seed": 5}
        out = run(rollout.generate([5, 17, 33, 99], params))
        assert 1 <= len(out.token_ids) <= 12 and len(out.log_probs) == len(out.token_ids)
        eos = set(owner._eos_ids)
        assert eos, "the tiny model's EOS id must be known"
        # an EOS can only be the last token: sampling stops there
        assert not (set(out.token_ids[:-1]) & eos)
        # the owner's first training-client request (seq 1 of its numbering) ...
        probe = to_no_padding(batch(2, seed=2)[2])
        lp_owner = run(
            owner.compute_log_prob(
                probe, ref=False, calculate_entropy=False, rollout_n=1, temperature=1.0, pad_token_id=0
            )
        )
        # ... does not answer a re-attached client's first request (its own seq 1 before the fix: the owner's old result
        # or a 409); train the actor hard towards one token, publish, and the re-attached sampler follows after wake_up
        forwarder = cls.from_config(cfg, handle=handle)
        target = 42
        run(_train_towards(forwarder, cfg, target))
        assert run(forwarder.update_weights())["policy_version"] == 1
        run(rollout.wake_up())
        after = run(rollout.generate([5, 17, 33, 99], {**params, "max_tokens": 6, "temperature": 0.0}))
        assert after.token_ids[0] == target, after
        asyncio.run(rollout.destroy())  # re-attached: must not unload the owner's model
        # ... but drops its SDK session: no heartbeat left to warn every 10 s once the server is gone
        assert _heartbeat_stops(rollout), "a destroyed client's SDK session still sends heartbeats"
        # owner and re-attached client read the same trained weights: equal to each other, moved from before
        again = [
            run(
                b.compute_log_prob(
                    probe, ref=False, calculate_entropy=False, rollout_n=1, temperature=1.0, pad_token_id=0
                )
            )
            for b in (forwarder, owner)
        ]
        torch.testing.assert_close(again[0].log_probs, again[1].log_probs, rtol=0, atol=1e-6)
        assert (again[1].log_probs - lp_owner.log_probs).abs().max() > 1e-3
        asyncio.run(forwarder.destroy())
        # the owner's destroy returns only once the server has unloaded the model (it answers the request with a
        # future and runs it after queued forward passes): before that, a re-attached client could still compute
        asyncio.run(owner.destroy())
        assert _model_status(server, owner.model_id) == "unloaded"
    finally:
        asyncio.run(owner.destroy())
        asyncio.run(owner.destroy())  # idempotent


def _heartbeat_stops(backend, within_s: float = 10.0) -> bool:
    """Whether the SDK session ``backend`` opened stops its heartbeat task within ``within_s``
    (tinker 0.25 cancels it on the SDK's own event-loop thread, so it ends shortly after)."""
    task = backend._service._session_holder._session_heartbeat_task
    deadline = time.monotonic() + within_s
    while not task.done() and time.monotonic() < deadline:
        time.sleep(0.1)
    return task.done()


def _model_status(server: TinkerServer, model_id: str) -> str:
    """The server's own record of a model (``loaded``, ``unloading``, ``unloaded``...), over plain HTTP."""
    import urllib.request

    req = urllib.request.Request(
        f"{server.base_url}/api/v1/get_info",
        data=json.dumps({"model_id": model_id}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())["status"]


async def _train_towards(backend, cfg, target: int) -> None:
    from omegaconf import OmegaConf

    actor_cfg = OmegaConf.create(OmegaConf.to_container(cfg.actor_rollout_ref.actor, resolve=True))
    actor_cfg.optim.lr = 0.05
    prompt = [5, 17, 33, 99]
    dense = dense_rollout_batch([prompt, prompt], [[target, target], [7, 8]])
    mask = dense["response_mask"].float()
    dense["advantages"] = torch.tensor([[1.0], [-1.0]]) * mask
    dense["old_log_probs"] = torch.zeros_like(mask)
    td = to_no_padding(dense, mini_batch_size=2, epochs=1, seed=0, dataloader_kwargs={"shuffle": False})
    for _ in range(8):
        lp = await backend.compute_log_prob(
            to_no_padding(dense_rollout_batch([prompt, prompt], [[target, target], [7, 8]])),
            ref=False,
            calculate_entropy=False,
            rollout_n=1,
            temperature=1.0,
            pad_token_id=0,
        )
        dense["old_log_probs"] = _padded(lp.log_probs, dense, td) * mask
        td = to_no_padding(dense, mini_batch_size=2, epochs=1, seed=0, dataloader_kwargs={"shuffle": False})
        await backend.update_actor(td, actor_config=actor_cfg, pad_token_id=0, rollout_n=1, temperature=1.0)


# --------------------------------------------------------------------------- refusals before Ray
@pytest.mark.parametrize(
    "override, needle",
    [
        ("actor_rollout_ref.model.lora_rank=0", "actor_rollout_ref.model.lora_rank=0 is unset"),
        ("actor_rollout_ref.actor.use_kl_loss=true", "use_kl_loss=True"),
        ("actor_rollout_ref.actor.grad_clip=1.0", "grad_clip=1.0"),
    ],
)
def test_entry_point_refuses_before_ray(server, tmp_path, override, needle):
    """Through the real entry point (the full matrix of refusals is in test_tinker_config.py)."""
    train, test = build_gsm8k(tmp_path / "data", max_train=8, max_test=4)
    ov = small_ci_overrides(
        model=server.model, train=train, test=test, ckpt_dir=tmp_path / "ckpt", steps=1, backend="tinker"
    )
    start = time.monotonic()
    res = run_entry(ov + tinker_overrides(server) + [override], workdir=tmp_path / "run", timeout_s=120)
    assert res.returncode != 0
    assert needle in res.output, res.tail()
    assert "supported" in res.output
    assert "Started a local Ray instance" not in res.output
    assert time.monotonic() - start < 60


# --------------------------------------------------------------------------- conformance kit
def test_the_conformance_kit_passes_for_tinker(server, tmp_path):
    """Every check of ``python -m verl.remote_backend.testing --backend tinker`` passes (none skipped):
    re-attach in another Ray process, alignment, batching invariance, update direction, resume..."""
    import subprocess
    import sys

    from verl.remote_backend.testing.conformance import CHECKS

    args = [
        "--backend",
        "tinker",
        f"actor_rollout_ref.model.path={server.model}",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        *tinker_overrides(server),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "verl.remote_backend.testing", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    statuses = {
        p[1]: p[0] for p in (line.split() for line in proc.stdout.splitlines()) if len(p) >= 2 and p[1] in CHECKS
    }
    assert statuses == {check: "PASS" for check in CHECKS}, proc.stdout[-4000:]


# --------------------------------------------------------------------------- end to end
def _gsm8k_overrides(server, tmp_path, ckpt, *, steps, save_freq=-1):
    train, test = build_gsm8k(tmp_path / "data")
    return (
        small_ci_overrides(
            model=server.model,
            train=train,
            test=test,
            ckpt_dir=ckpt,
            steps=steps,
            backend="tinker",
            save_freq=save_freq,
        )
        + tinker_overrides(server)
        + [
            "actor_rollout_ref.actor.optim.lr=0.01",
            # dense reward that varies within a GRPO group, so updates have a gradient
            f"reward.custom_reward_function.path={REPO_ROOT / 'tests' / 'support' / 'toy_reward.py'}",
            "reward.custom_reward_function.name=digit_share",
        ]
    )


def test_grpo_on_gsm8k_end_to_end_then_resume(server, tmp_path):
    ckpt = tmp_path / "ckpt"
    log_start = server.log_path.stat().st_size
    first = run_entry(
        _gsm8k_overrides(server, tmp_path, ckpt, steps=2, save_freq=2), workdir=tmp_path / "run1", timeout_s=900
    )
    assert first.returncode == 0, first.tail()
    with open(server.log_path, "rb") as fh:
        fh.seek(log_start)
        served = fh.read().decode(errors="replace")
    # the forwarder published sampler weights and the rollout process looked them up (wake_up)
    assert "POST /api/v1/save_weights_for_sampler" in served and "/checkpoints" in served
    for step in (1, 2):
        data = first.step(step)
        for key in LOGGED_STEP_METRICS:
            assert key in data and math.isfinite(float(data[key])), f"step {step}: {key}={data.get(key)}"
        print(f"[tinker e2e] step {step}: timing_s/step={data.get('timing_s/step')}")
    assert max(float(first.step(s)["actor/grad_norm"]) for s in (1, 2)) > 0
    record = json.loads((ckpt / "global_step_2" / "actor" / "tinker_checkpoint.json").read_text())
    assert record["tinker_path"].startswith("tinker://") and record["step"] == 2
    print(f"[tinker e2e] 2 steps in {first.wall_s:.0f}s, peak PSS {first.peak_pss_gb:.1f} GB")

    ov = [o for o in _gsm8k_overrides(server, tmp_path, ckpt, steps=3) if not o.startswith("trainer.resume_mode")]
    second = run_entry(ov + ["trainer.resume_mode=auto"], workdir=tmp_path / "run2", timeout_s=900)
    assert second.returncode == 0, second.tail()
    steps = [m["step"] for m in second.metrics]
    assert steps == [3], steps  # resumed after step 2, ran only step 3
    assert "tinker" in second.output
    # the API key was on both command lines (tinker_overrides): moved to TINKER_API_KEY, printed and written nowhere
    for entry_run in (first, second):
        assert API_KEY not in entry_run.output
    assert files_holding([tmp_path], API_KEY) == []


def test_server_killed_mid_run_fails_clearly(server, tmp_path):
    """The module's server is SIGKILLed during step 1 of a run (the last test of this file, so no
    second server is started for it; :func:`server` restarts it for any test run after this one)."""
    ov = _gsm8k_overrides(server, tmp_path, tmp_path / "ckpt", steps=3)
    log_before = len(server.log_path.read_text(errors="replace"))  # earlier tests sampled too
    killed_at: dict = {}

    def killer() -> None:
        # mid-step: once this run's rollout sampling has reached the server
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if "/api/v1/asample" in server.log_path.read_text(errors="replace")[log_before:]:
                time.sleep(1)
                server.kill()
                killed_at["t"] = time.monotonic()
                return
            time.sleep(0.5)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    started = time.monotonic()
    res = run_entry(ov, workdir=tmp_path / "run", timeout_s=600)
    thread.join(timeout=5)
    ended = started + res.wall_s  # the child's exit (wall_s stops before leftovers are reaped)
    assert "t" in killed_at, res.tail()
    assert res.returncode != 0
    assert "BackendDiedError" in res.output or "died" in res.output, res.tail()
    assert server.base_url in res.output, res.tail()
    print(f"[tinker kill] run exited {ended - killed_at['t']:.1f}s after the server was killed")
    assert ended - killed_at["t"] < 30, ended - killed_at["t"]
    assert API_KEY not in res.output and files_holding([tmp_path / "run"], API_KEY) == []  # nor in a failure
