"""The ``arctic`` adapter + the real arctic-platform client against the CPU stand-in server.

Nothing is patched: the adapter builds arctic-platform's own client, which talks
HTTP (DSSST1 safetensors bodies) to ``tests/arctic_standin/server.py``, a separate
process driving the ``local`` engine. Parity tests run the same batches through
the ``local`` backend (its own Ray actor) and compare.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import time

import pytest
import requests
import torch
from arctic_standin.harness import FOUR_ROWS, compose_config, free_port, make_batch, standin_command
from support.aio import run_async as run

from verl.remote_backend import RemoteBackendRegistry
from verl.utils import tensordict_utils as tu
from verl.workers.remote_client.arctic.errors import (
    ArcticResponseError,
    ArcticServerError,
    ArcticTimeoutError,
    ArcticUnreachableError,
    PromptRoundTripError,
)

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def env(standin_server, tiny_model_dir, tmp_path_factory):
    import ray

    from verl.utils.config import omega_conf_to_dataclass

    root = tmp_path_factory.mktemp("arctic")
    model = tiny_model_dir
    cfg = compose_config(
        model,
        str(root / "ckpt"),
        standin_server.port,
        [
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.kl_loss_coef=0.1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        ],
    )
    started_ray = not ray.is_initialized()
    if started_ray:  # the local backend's engine is a Ray actor
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    arctic = local = None
    try:
        arctic = RemoteBackendRegistry.create("arctic", cfg)
        local = RemoteBackendRegistry.create("local", cfg)
        from transformers import AutoTokenizer

        yield {
            "cfg": cfg,
            "arctic": arctic,
            "local": local,
            "server": standin_server.process,
            "url": standin_server.url,
            "tok": AutoTokenizer.from_pretrained(model),
            "actor": omega_conf_to_dataclass(cfg.actor_rollout_ref.actor),
            "root": root,
        }
    finally:
        if arctic is not None:
            run(arctic.destroy())
        if local is not None:
            asyncio.run(local.destroy())
        if started_ray:
            ray.shutdown()


def batch(env, seed=0, **kw):
    tok = env["tok"]
    args = dict(
        **FOUR_ROWS,
        vocab=len(tok),
        pad_token_id=tok.pad_token_id,
        seed=seed,
        with_update_fields=True,
    )
    args.update(kw)
    return make_batch(**args)


def log_probs(backend, data, env, *, ref=False, entropy=True):
    return run(
        backend.compute_log_prob(
            data,
            ref=ref,
            calculate_entropy=entropy,
            rollout_n=2,
            temperature=TEMPERATURE,
            pad_token_id=env["tok"].pad_token_id,
        )
    )


def arm(env, endpoint, kind, **extra):
    requests.post(
        f"{env['url']}/_standin/fault", json={"endpoint": endpoint, "kind": kind, **extra}, timeout=10
    ).raise_for_status()


# ----------------------------------------------------------------------------- parity
@pytest.mark.parametrize("ref", [False, True])
def test_log_prob_parity_with_local(env, ref):
    data = batch(env)
    a = log_probs(env["arctic"], data, env, ref=ref)
    b = log_probs(env["local"], data, env, ref=ref)
    t = int(data["input_ids"].offsets()[-1])
    assert a.log_probs.shape == (t,)
    for key in ("log_probs", "entropy"):
        diff = (getattr(a, key) - getattr(b, key)).abs().max().item()
        assert diff <= 1e-5, f"{key}: max |arctic - local| = {diff}"
    assert a.device.type == "cpu"


@pytest.mark.parametrize("ref", [False, True])
def test_log_prob_requests_are_split_by_verls_log_prob_micro_batches_with_identical_results(env, ref):
    """Each /forward carries verl's log-prob micro-batch (x the job's accumulation steps), not the whole batch."""
    from omegaconf import OmegaConf, open_dict

    from verl.workers.remote_client.arctic.client import ArcticBackend

    cfg = env["cfg"].copy()
    with open_dict(cfg):
        OmegaConf.update(cfg, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 1)
        OmegaConf.update(cfg, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 1)
    split = ArcticBackend.from_config(cfg, handle=env["arctic"].reconnect_handle())  # the same jobs, other settings
    try:
        data = batch(env, seed=5)
        calls = lambda: requests.get(f"{env['url']}/_standin/calls", timeout=10).json().get("/forward", 0)  # noqa: E731
        before = calls()
        whole = log_probs(env["arctic"], data, env, ref=ref)
        middle = calls()
        parts = log_probs(split, data, env, ref=ref)
        after = calls()
    finally:
        run(split.destroy())
    # 4 rows: the log-prob job takes 1 row per request; the training job 1 row x its 4 accumulation steps
    assert (middle - before, after - middle) == ((1, 4) if ref else (1, 1))
    for key in ("log_probs", "entropy"):
        assert (
            torch.equal(getattr(whole, key), getattr(parts, key))
            or (getattr(whole, key) - getattr(parts, key)).abs().max() < 1e-6
        )


def test_update_with_mini_batches_other_than_the_jobs_is_refused_naming_the_keys(env):
    """DeepSpeed's job was created for ppo_mini_batch_size x rollout.n rows per step; other sizes would be split
    into the wrong micro-batches on the server, so the adapter refuses them before sending anything."""
    from verl.remote_backend.errors import ConfigError

    data = batch(env, seed=1)
    tu.assign_non_tensor(data, mini_batch_size=2, epochs=1, seed=5, dataloader_kwargs={"shuffle": False})
    with pytest.raises(ConfigError, match=r"mini-batches of 2 samples.*created for 4 samples.*ppo_mini_batch_size"):
        run(env["arctic"].update_actor(data, actor_config=env["actor"], pad_token_id=env["tok"].pad_token_id,
                                       rollout_n=2, temperature=TEMPERATURE))  # fmt: skip


def test_generate_token_ids_in_and_out_match_local(env):
    tok = env["tok"]
    for name in ("arctic", "local"):
        run(env[name].update_weights())
    params = {"max_tokens": 6, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    for text in ("how many apples", "Question: 12 + 7 ="):
        ids = tok(text)["input_ids"]
        a = run(env["arctic"].generate(ids, dict(params)))
        b = run(env["local"].generate(ids, dict(params)))
        assert a.token_ids == b.token_ids and 0 < len(a.token_ids) <= 6
        assert a.log_probs == pytest.approx(b.log_probs, abs=1e-5)
        assert a.stop_reason == "completed"


def test_generate_fails_loudly_when_prompt_ids_do_not_survive_text(env):
    tok = env["tok"]
    ids = tok("how many apples")["input_ids"]
    # Spell one merged BPE token as its single-character tokens: same text, non-canonical ids.
    at = next(i for i, t in enumerate(ids) if len(tok.convert_ids_to_tokens(t)) >= 2)
    chars = [tok.convert_tokens_to_ids(c) for c in tok.convert_ids_to_tokens(ids[at])]
    split = ids[:at] + chars + ids[at + 1 :]
    assert tok.decode(split) == tok.decode(ids)
    with pytest.raises(PromptRoundTripError, match=f"first difference at position {at}"):
        run(env["arctic"].generate(split, {"max_tokens": 2}))


def test_colocated_weight_sync_first_empties_the_training_cache(env):
    """Arctic's Ray server empties the training job's cache inside wake_inference; over HTTP the adapter does
    (weight sync goes through /operation)."""

    def count(path):
        return requests.get(f"{env['url']}/_standin/calls", timeout=10).json().get(path, 0)

    log_probs(env["arctic"], batch(env, seed=7), env)  # colocated: the sampler goes to sleep
    before = (count("/empty-training-cache"), count("/operation"))
    run(env["arctic"].update_weights())
    assert count("/empty-training-cache") == before[0] + 1 and count("/operation") > before[1]


def test_checkpoint_save_and_load_restore_weights(env):
    data = batch(env, seed=3)
    actor_dir = str(env["root"] / "ckpt" / "global_step_3" / "actor")
    path = run(env["arctic"].save_checkpoint(actor_dir, 3))
    # DeepSpeed's layout, written by Arctic's worker: checkpoint-3/latest -> global_step<K>/mp_rank_00_model_states.pt
    assert path == os.path.join(actor_dir, "checkpoint-3")
    tag = open(os.path.join(path, "latest")).read().strip()
    assert tag.startswith("global_step") and os.path.isfile(os.path.join(path, tag, "mp_rank_00_model_states.pt"))
    assert type(env["arctic"]).checkpoint_problem(actor_dir, 3) is None
    before = log_probs(env["arctic"], data, env).log_probs
    tu.assign_non_tensor(data, mini_batch_size=4, epochs=1, seed=0, dataloader_kwargs={"shuffle": False})
    run(
        env["arctic"].update_actor(
            data.copy(), actor_config=env["actor"], pad_token_id=env["tok"].pad_token_id, rollout_n=2, temperature=1.0
        )
    )
    moved = log_probs(env["arctic"], data, env).log_probs
    assert (moved - before).abs().max() > 1e-4
    run(env["arctic"].load_checkpoint(actor_dir, 3))
    restored = log_probs(env["arctic"], data, env).log_probs
    assert torch.equal(restored, before)


def test_resume_the_server_cannot_satisfy_fails_instead_of_training_from_scratch(env, tmp_path):
    """Arctic answers /load-checkpoint with HTTP 200 and global_step 0 when DeepSpeed finds nothing;
    the adapter turns that into ResumeCheckpointError, and the driver-side check names the missing file."""
    from verl.remote_backend.errors import ResumeCheckpointError

    empty_actor_dir = str(tmp_path / "global_step_7" / "actor")
    os.makedirs(empty_actor_dir)
    assert "checkpoint-7/latest is missing" in type(env["arctic"]).checkpoint_problem(empty_actor_dir, 7)
    with pytest.raises(
        ResumeCheckpointError, match=r"did not restore verl's step 7 .* reports DeepSpeed global_step=0"
    ):
        run(env["arctic"].load_checkpoint(empty_actor_dir, 7))


def test_reconnect_handle_attaches_without_new_jobs_and_detaches_safely(env):
    handle = pickle.loads(pickle.dumps(env["arctic"].reconnect_handle()))
    jobs_before = requests.get(f"{env['url']}/status", timeout=10).json()["jobs"]
    other = type(env["arctic"]).from_config(env["cfg"], handle=handle)
    data = batch(env, seed=4)
    assert torch.equal(log_probs(other, data, env).log_probs, log_probs(env["arctic"], data, env).log_probs)
    run(other.destroy())
    run(other.destroy())  # idempotent
    assert requests.get(f"{env['url']}/status", timeout=10).json()["jobs"] == jobs_before
    log_probs(env["arctic"], data, env)  # the owner still works


def test_foreign_handle_is_refused(env):
    with pytest.raises(ValueError, match="not an arctic-backend handle"):
        type(env["arctic"]).from_config(env["cfg"], handle={"backend": "local", "actor": None})


# ----------------------------------------------------------------------------- failures
def test_http_error_carries_the_servers_detail(env):
    arm(env, "/forward", "http_error", status=500, detail="injected: CUDA out of memory on rank 0")
    with pytest.raises(ArcticServerError, match="injected: CUDA out of memory on rank 0") as err:
        log_probs(env["arctic"], batch(env), env)
    assert err.value.status == 500 and "127.0.0.1:" in str(err.value) and "compute_log_prob" in str(err.value)


@pytest.mark.parametrize(
    "kind,pattern",
    [
        ("missing_key", r"response\.batch lacks key 'logprobs'"),
        ("wrong_shape", r"response\.batch\.logprobs has shape \(4, 10\), expected \(4, 11\)"),
        ("nan", r"logprobs: \d+ non-finite"),
    ],
)
def test_malformed_forward_response_is_named(env, kind, pattern):
    arm(env, "/forward", kind, key="logprobs")
    with pytest.raises(ArcticResponseError, match=pattern):
        log_probs(env["arctic"], batch(env), env)


def test_generate_result_without_token_ids_is_named(env):
    run(env["arctic"].update_weights())  # earlier log-prob calls put the colocated sampler to sleep
    arm(env, "/generate", "missing_key", key="token_ids")
    with pytest.raises(ArcticResponseError, match="lacks key 'token_ids'"):
        run(env["arctic"].generate(env["tok"]("how many")["input_ids"], {"max_tokens": 2}))


def test_request_timeout_names_op_and_limit(env):
    handle = env["arctic"].reconnect_handle()
    handle["client_config"]["request_timeout"] = 1.5
    impatient = type(env["arctic"]).from_config(env["cfg"], handle=handle)
    arm(env, "/forward", "hang", seconds=6)
    start = time.monotonic()
    with pytest.raises(ArcticTimeoutError, match=r"compute_log_prob did not finish within 1\.5s"):
        log_probs(impatient, batch(env), env)
    assert time.monotonic() - start < 5
    run(impatient.destroy())


def _creation_failure(env, port: int) -> tuple[Exception, float]:
    """The error creating the arctic backend against ``127.0.0.1:port`` raises (2 s connect timeout)
    and the seconds until it did; creating it successfully fails the test."""
    from omegaconf import OmegaConf

    cfg = env["cfg"].copy()
    OmegaConf.update(cfg, "remote_backend.arctic.port", port)
    OmegaConf.update(cfg, "remote_backend.arctic.connect_timeout_s", 2)
    start = time.monotonic()
    try:
        RemoteBackendRegistry.create("arctic", cfg)
    except Exception as exc:  # noqa: BLE001 - the caller checks type and message
        return exc, time.monotonic() - start
    raise AssertionError(f"an arctic backend was created against 127.0.0.1:{port}")


def test_unreachable_server_is_named_within_bounded_time(env):
    port = free_port()  # nothing listens here
    error, seconds = _creation_failure(env, port)
    assert isinstance(error, ArcticUnreachableError) and f"127.0.0.1:{port} is unreachable" in str(error), error
    assert seconds < 6


def test_silent_server_is_named_within_bounded_time(env):
    """A socket that accepts connections but never answers (a hung server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sink:
        sink.bind(("127.0.0.1", 0))
        sink.listen(8)
        port = sink.getsockname()[1]
        error, seconds = _creation_failure(env, port)
        assert isinstance(error, ArcticUnreachableError) and f"127.0.0.1:{port}" in str(error), error
        assert seconds < 6


def test_launched_server_lifecycle_and_death_mid_call(env, tmp_path):
    """launch_server=true starts a server bound to 127.0.0.1; the server dying inside a call
    surfaces as unreachable, quickly; destroy() still completes and the process is gone."""
    from omegaconf import OmegaConf

    port = free_port()
    cfg = env["cfg"].copy()
    OmegaConf.update(cfg, "actor_rollout_ref.actor.use_kl_loss", False)
    OmegaConf.update(cfg, "trainer.default_local_dir", str(tmp_path))
    for key, value in {
        "port": port,
        "launch_server": True,
        "launch_command": standin_command(),
        "startup_timeout_s": 120,
    }.items():
        OmegaConf.update(cfg, f"remote_backend.arctic.{key}", value)
    backend = RemoteBackendRegistry.create("arctic", cfg)
    proc = backend._server.proc
    try:
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=5).ok
        data = batch(env)
        tu.assign_non_tensor(data, mini_batch_size=4, epochs=1, seed=0, dataloader_kwargs={"shuffle": False})
        log_probs(backend, data, env, entropy=False)
        requests.post(
            f"http://127.0.0.1:{port}/_standin/fault", json={"endpoint": "/forward-backward", "kind": "exit"}, timeout=5
        )
        start = time.monotonic()
        with pytest.raises(ArcticUnreachableError, match=f"127.0.0.1:{port} is unreachable during update_actor"):
            run(
                backend.update_actor(
                    data, actor_config=env["actor"], pad_token_id=env["tok"].pad_token_id, rollout_n=2, temperature=1.0
                )
            )
        assert time.monotonic() - start < 5
        assert proc.wait(timeout=10) == 17  # the stand-in's exit code for this fault
    finally:
        run(backend.destroy())
    assert proc.poll() is not None
