"""Fault injection, Arctic's in-process Ray server (``remote_backend.arctic.protocol=ray``).

The Ray counterparts of ``test_fault_injection_slow.py``'s Arctic cases: the server, here the
``ArcticRLRayServerState`` actor that arctic-platform's ``RayTransport`` started in this test's
Ray cluster, is SIGKILLed or SIGSTOPped while a forwarder's ``compute_log_prob`` is in flight.
As for HTTP, a hang is armed in the training job's DeepSpeed worker first (the stand-in's
``standin_arm_hang``), so the call is surely in flight when the fault lands. Each case checks the
error type and message, the time from fault to error, and that the server's processes are gone
(the state actor and the DeepSpeed worker actors it owns); the killed case also keeps the
checkpoint saved before it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from pathlib import Path

import pytest
from arctic_standin.harness import mid_call_batch
from arctic_standin.ray_setup import own_ray_cluster
from support.aio import FaultTimer, call_then_inject, run_async
from support.forwarder import in_process_forwarder
from support.processes import gone

from verl.remote_backend.errors import BackendDiedError

pytestmark = pytest.mark.slow

DEATH_BOUND_S = 30  # as for HTTP (issue 7: <= 30 s)
run = functools.partial(run_async, cap_s=120)

#: when the last injected fault's call ended (call_then_inject)
_fault_timer = FaultTimer()


@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("arctic_platform")
    with own_ray_cluster(logical_gpus=1) as ray:
        yield ray


@pytest.fixture
def arctic_ray(ray_cluster, tiny_model_dir, monkeypatch, tmp_path):
    """An owner on Arctic's Ray server, a forwarder re-attached to it, and the server's process ids."""
    from arctic_standin.harness import compose_config
    from omegaconf import OmegaConf, open_dict

    from verl.remote_backend import RemoteBackendRegistry

    ray = ray_cluster
    cfg = compose_config(
        tiny_model_dir,
        str(tmp_path / "ckpt"),
        8000,
        ["actor_rollout_ref.actor.use_kl_loss=false", "remote_backend.arctic.protocol=ray"],
    )
    with open_dict(cfg):
        for key, value in {
            "remote_backend.timeouts": {"health": 1.0},
            "remote_backend.liveness": {"interval_s": 0.5, "failures": 2},
        }.items():
            OmegaConf.update(cfg, key, value, merge=True)
    owner = RemoteBackendRegistry.create("arctic", cfg)
    state = owner._ray_state
    workers = ray.get(state.get_training_workers.remote())
    pids = {
        "state": ray.get(state.__ray_call__.remote(lambda _self: os.getpid())),
        "workers": [ray.get(w.__ray_call__.remote(lambda _self: os.getpid())) for w in workers],
    }
    try:
        forwarder = in_process_forwarder(cfg, owner.reconnect_handle(), monkeypatch)
        yield {"owner": owner, "forwarder": forwarder, "cfg": cfg, "pids": pids, "workers": workers}
    finally:
        try:
            os.kill(pids["state"], signal.SIGKILL)  # a SIGSTOPped actor ignores Ray's own kill
        except ProcessLookupError:
            pass
        asyncio.run(owner.destroy())
        assert gone(pids["state"], within_s=20), "Arctic's state actor outlived the test"


def _arm_hang(env) -> None:
    env["forwarder"]  # noqa: B018 - the forwarder exists (and slept the sampler) before the hang is armed
    import ray

    ray.get([w.standin_arm_hang.remote("forward_no_grad", 600) for w in env["workers"]])


def _signal_state_actor_mid_log_prob(arctic_ray, sig: int):
    """A forwarded ``compute_log_prob`` with ``sig`` sent to Arctic's state actor 1 s into it
    (timed by ``_fault_timer``)."""
    pid, cfg = arctic_ray["pids"]["state"], arctic_ray["cfg"]
    call = arctic_ray["forwarder"].compute_log_prob(mid_call_batch(cfg))
    return run(call_then_inject(lambda: os.kill(pid, sig), call, delay_s=1.0, timer=_fault_timer))


def test_arctic_ray_server_state_actor_killed_mid_call(fault, arctic_ray):
    fwd, pids = arctic_ray["forwarder"], arctic_ray["pids"]
    saved = run(
        fwd.save_checkpoint(str(Path(arctic_ray["cfg"].trainer.default_local_dir) / "global_step_1" / "actor"), None, 1)
    )
    fault.protect(saved)
    _arm_hang(arctic_ray)
    with fault.expect(
        BackendDiedError,
        match=r"'arctic' died during compute_log_prob: .*ArcticRLRayServerState actor .*Its logs: .*logs",
        within_s=DEATH_BOUND_S,
    ):
        _signal_state_actor_mid_log_prob(arctic_ray, signal.SIGKILL)
    assert _fault_timer.seconds < DEATH_BOUND_S
    assert gone(pids["state"], within_s=20)
    assert all(gone(pid, within_s=20) for pid in pids["workers"]), "the DeepSpeed workers outlived their state actor"


def test_arctic_ray_server_state_actor_frozen_mid_call(fault, arctic_ray):
    """SIGSTOP: the actor stays 'alive' to Ray and nothing answers - only the liveness probes can tell."""
    _arm_hang(arctic_ray)
    with fault.expect(
        BackendDiedError,
        match=r"'arctic' died during .*2 consecutive health probes failed.*Its logs: .*ArcticRLRayServerState",
        within_s=DEATH_BOUND_S,
    ):
        _signal_state_actor_mid_log_prob(arctic_ray, signal.SIGSTOP)
    assert _fault_timer.seconds < 15  # by design ~3 s: interval 0.5 s + 2 probes of 1 s + backoff
