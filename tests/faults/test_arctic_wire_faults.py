"""Wire faults between the arctic adapter and an Arctic RL server (Arctic's own server code, the
CPU stand-in of tests/arctic_standin), through the verl-side forwarder and rollout server - the
guard's time limits, liveness and retry policy in force, as in a run:

* a server that accepts connections and never answers (a TCP proxy that stops forwarding);
* a server that answers slowly (the proxy delays every answer), below and above the op's limit;
* a server restarted between two steps (a fresh process on the same port, without our jobs).

Every case is counted in the fault ledger (tests/faults/conftest.py).
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections import Counter

import pytest
import torch
from support.aio import run_async
from support.forwarder import in_process_forwarder
from support.tcp_proxy import TcpProxy

from verl.remote_backend.errors import BackendDiedError, BackendTimeoutError

TEST_TIER = "integration"  # starts Ray, a server, an engine or a model (tiers: tests/conftest.py)

pytest.importorskip("arctic_platform")

#: the ops' limits in these tests (remote_backend.timeouts.*), small so that every case takes seconds
LIMITS = {"compute_log_prob": 2.0, "update_actor": 3.0, "generate": 2.0, "health": 1.0}
#: the guard's bound plus a slack for a loaded 2-core machine
SLACK_S = 3.0
#: endpoints that change the model: counted on both sides of the wire
TRAINING_ENDPOINTS = ("/forward-backward", "/step")

run = functools.partial(run_async, cap_s=60)  # a hang fails the test instead of blocking the suite


def wire_config(tiny_model_dir: str, ckpt_dir: str, port: int, **liveness):
    from arctic_standin.harness import compose_config
    from omegaconf import OmegaConf, open_dict

    cfg = compose_config(tiny_model_dir, ckpt_dir, port, ["actor_rollout_ref.actor.use_kl_loss=false"])
    with open_dict(cfg):
        OmegaConf.update(cfg, "remote_backend.timeouts", dict(LIMITS), merge=True)
        # the watchdog probes rarely here, so the op's own time limit is what ends a silent call
        OmegaConf.update(cfg, "remote_backend.liveness", {"interval_s": 60.0, **liveness}, merge=True)
    return cfg


class Client:
    """The verl side of one arctic backend: the owner (trainer), a forwarder and a rollout server."""

    def __init__(self, cfg, monkeypatch) -> None:
        from transformers import AutoTokenizer

        from verl.remote_backend import RemoteBackendRegistry
        from verl.workers.rollout.remote_rollout.server import RemoteRolloutServer

        self.cfg = cfg
        self.owner = RemoteBackendRegistry.create("arctic", cfg)
        self.forwarder = in_process_forwarder(cfg, self.owner.reconnect_handle(), monkeypatch)
        self.rollout = RemoteRolloutServer(cfg, self.owner.reconnect_handle(), 0)
        self.tok = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)

    def warm_up(self) -> None:
        """One call of each op straight on the owner, outside the guard: the server's first forward,
        backward and sampling are slow (compilation, allocation), far over these tests' limits."""
        from verl.utils.config import omega_conf_to_dataclass

        pad = self.tok.pad_token_id
        kw = dict(rollout_n=2, temperature=1.0, pad_token_id=pad)
        run(self.owner.compute_log_prob(self.batch(), ref=False, calculate_entropy=False, **kw), cap_s=300)
        actor = omega_conf_to_dataclass(self.cfg.actor_rollout_ref.actor)
        run(self.owner.update_actor(self.batch(update=True), actor_config=actor, **kw), cap_s=300)
        run(self.owner.generate(self.tok("how many")["input_ids"], {"max_tokens": 2}), cap_s=300)

    def batch(self, *, update: bool = False, seed: int = 0):
        from arctic_standin.harness import EIGHT_ROWS, make_batch

        from verl.utils import tensordict_utils as tu

        data = make_batch(**EIGHT_ROWS, vocab=len(self.tok), pad_token_id=self.tok.pad_token_id, seed=seed,
                          with_update_fields=update)  # fmt: skip
        tu.assign_non_tensor(data, calculate_entropy=False, temperature=1.0)
        if update:  # verl's update fields: 2 PPO mini-batches of 4 rows (ppo_mini_batch_size 2 x rollout.n 2)
            tu.assign_non_tensor(data, mini_batch_size=4, global_batch_size=8, epochs=1, seed=0,
                                 dataloader_kwargs={"shuffle": False})  # fmt: skip
        return data

    def call(self, op: str):
        """A coroutine running ``op`` the way verl's trainer and agent loop do."""
        if op == "compute_log_prob":
            return self.forwarder.compute_log_prob(self.batch())
        if op == "update_actor":
            return self.forwarder.update_actor(self.batch(update=True))
        if op == "generate":
            prompt = self.tok("how many apples")["input_ids"]
            return self.rollout.generate("r0", prompt_ids=prompt, sampling_params={"max_tokens": 4, "seed": 7})
        raise ValueError(op)

    def destroy(self) -> None:
        run(self.owner.destroy())


def show(outcome) -> None:
    """What the user reads first (``pytest -s`` shows it; the README quotes these lines)."""
    print(f"[wire fault] {outcome.seconds:.2f}s: {str(outcome.error).splitlines()[0]}")


def calls(url: str) -> Counter:
    import requests

    return Counter(requests.get(f"{url}/_standin/calls", timeout=10).json())


def training_calls(counter: Counter) -> dict[str, int]:
    return {path: counter[path] for path in TRAINING_ENDPOINTS}


# ---------------------------------------------------------------- a server that never answers, a slow one
@pytest.fixture(scope="module")
def proxied(standin_server, ray_session, tiny_model_dir, tmp_path_factory):
    """The shared stand-in behind a TCP proxy, and a client that talks to it only through the proxy."""
    with TcpProxy(standin_server.port) as proxy, pytest.MonkeyPatch.context() as mp:
        cfg = wire_config(tiny_model_dir, str(tmp_path_factory.mktemp("arctic_wire") / "ckpt"), proxy.port)
        client = Client(cfg, mp)
        try:
            client.warm_up()
            yield proxy, client, standin_server
        finally:
            client.destroy()


@pytest.mark.parametrize("op", ["compute_log_prob", "update_actor", "generate"])
def test_silent_server_fails_each_op_within_its_limit_naming_op_address_and_key(fault, proxied, op):
    proxy, client, server = proxied
    run(client.call("compute_log_prob"))  # a healthy call first: the connection is pooled, the jobs exist
    before = calls(server.url)
    limit = LIMITS[op]
    with proxy.black_hole():
        with fault.expect(
            BackendTimeoutError,
            match=rf"^remote backend 'arctic': {op} did not finish within {limit:g}s\. "
            rf".*remote_backend\.timeouts\.{op} .*127\.0\.0\.1:{proxy.port}",
            within_s=limit + SLACK_S,
        ) as outcome:
            run(client.call(op))
        assert outcome.seconds >= limit, f"failed before its limit ({outcome.seconds:.2f}s < {limit}s)"
        show(outcome)
        first_line = str(outcome.error).splitlines()[0]
        assert op in first_line and f"127.0.0.1:{proxy.port}" in first_line and f"timeouts.{op}" in first_line
    # nothing reached the server while it was silent, and nothing is re-sent once it answers again
    time.sleep(0.5)
    assert training_calls(calls(server.url)) == training_calls(before)
    run(client.call("compute_log_prob"))  # the same client works again once the server answers


@pytest.mark.slow
def test_silent_server_with_the_default_liveness_is_declared_dead_by_the_watchdog(fault, proxied, monkeypatch):
    """The shipped defaults: op limits of 30 min and more, health probes every 5 s with 10 s each -
    the watchdog ends a call to a silent server after ~25 s, long before the op's own limit."""
    from arctic_standin.harness import compose_config
    from omegaconf import OmegaConf

    proxy, client, _ = proxied
    cfg = compose_config(client.cfg.actor_rollout_ref.model.path, client.cfg.trainer.default_local_dir, proxy.port,
                         ["actor_rollout_ref.actor.use_kl_loss=false"])  # fmt: skip
    OmegaConf.update(cfg, "remote_backend.arctic.connect_timeout_s", 10)  # arctic.yaml's default
    forwarder = in_process_forwarder(cfg, client.owner.reconnect_handle(), monkeypatch)
    with proxy.black_hole():
        with fault.expect(
            BackendDiedError,
            match=r"^remote backend 'arctic' died during compute_log_prob: 2 consecutive health probes failed "
            rf"\(last: .*(timeouts\.health|connect_timeout_s).*127\.0\.0\.1:{proxy.port}",
            within_s=35,
        ) as outcome:
            run(forwarder.compute_log_prob(client.batch()))
        show(outcome)


def test_slow_server_below_the_limit_gives_the_same_answers(fault, proxied):
    proxy, client, server = proxied
    prompt = client.tok("how many apples")["input_ids"]
    params = {"max_tokens": 4, "seed": 7}
    direct_lp = run(client.call("compute_log_prob"))["log_probs"].values()
    direct_gen = run(client.rollout.generate("r1", prompt_ids=prompt, sampling_params=params))
    before, sent_before = calls(server.url), proxy.requests_sent()
    with proxy.slow(0.3):  # each call makes 1-3 requests: well under its 2-3 s limit
        start = time.monotonic()
        slow_lp = run(client.call("compute_log_prob"))["log_probs"].values()
        lp_s = time.monotonic() - start
        slow_gen = run(client.rollout.generate("r2", prompt_ids=prompt, sampling_params=params))
        out = run(client.call("update_actor"))
    assert lp_s >= 0.3, f"the proxy added no latency ({lp_s:.2f}s)"
    print(f"[wire fault] slow server (+0.3 s per answer): compute_log_prob took {lp_s:.2f}s, same log-probs")
    torch.testing.assert_close(slow_lp, direct_lp, rtol=0, atol=0)
    assert slow_gen.token_ids == direct_gen.token_ids and len(slow_gen.token_ids) > 0
    metrics = out.get_non_tensor("metrics") if hasattr(out, "get_non_tensor") else out["metrics"]
    assert metrics, "the update returned no metrics"
    after, sent = calls(server.url), proxy.requests_sent()
    # two mini-batches: exactly two forward-backward and two optimizer steps, each sent once
    done = {p: after[p] - before[p] for p in TRAINING_ENDPOINTS}
    assert done == {"/forward-backward": 2, "/step": 2}, done
    assert {p: sent[p] - sent_before[p] for p in TRAINING_ENDPOINTS} == done
    # counted in the ledger: a delay under the limit must surface as nothing but the right answers
    limit = LIMITS["compute_log_prob"]
    fault.observed("0.3 s per answer, under the limits", surfaced=True, seconds=lp_s, within_s=limit)


def test_slow_server_above_the_update_limit_fails_and_never_resends_a_step(fault, proxied):
    proxy, client, server = proxied
    run(client.call("compute_log_prob"))  # the colocated sampler is asleep: the update starts with its first step
    before, sent_before = calls(server.url), proxy.requests_sent()
    latency = 1.4  # forward-backward + step of the first mini-batch take > 2.8 s; the limit is 3 s
    with proxy.slow(latency):
        with fault.expect(
            BackendTimeoutError,
            match=rf"^remote backend 'arctic': update_actor did not finish within 3s\. .*remote_backend\.timeouts"
            rf"\.update_actor .*127\.0\.0\.1:{proxy.port}",
            within_s=LIMITS["update_actor"] + SLACK_S,
        ) as outcome:
            run(client.call("update_actor"))
        show(outcome)
        time.sleep(latency + 1.0)  # every answer still on its way has arrived: the abandoned call is over
    after, sent = calls(server.url), proxy.requests_sent()
    done = {p: after[p] - before[p] for p in TRAINING_ENDPOINTS}
    attempted = {p: sent[p] - sent_before[p] for p in TRAINING_ENDPOINTS}
    # each request the client made reached the server exactly once; no mini-batch was sent twice
    assert done == attempted, (done, attempted)
    assert 1 <= done["/forward-backward"] <= 2 and done["/step"] <= done["/forward-backward"], done
    assert done["/forward-backward"] <= done["/step"] + 1, done
    time.sleep(1.0)
    assert training_calls(calls(server.url)) == training_calls(after), "a training call was sent after the timeout"


# ---------------------------------------------------------------- a server restarted between two steps
@pytest.fixture
def own_standin(tmp_path):
    """A stand-in of this test's own (the shared one is never killed): ``(port, start, stop)``."""
    from arctic_standin.harness import free_port, standin_command

    from verl.workers.remote_client.arctic.launcher import launch_server

    port = free_port()
    servers = []

    def start():  # as harness.start_standin, with room for a loaded machine (Ray alone may take minutes there)
        server = launch_server(host="127.0.0.1", port=port, training_gpus=1, sampling_gpus=1, log_prob_gpus=0,
                               colocate=True, command=standin_command(), startup_timeout_s=400,
                               log_dir=str(tmp_path / f"logs{len(servers)}"))  # fmt: skip
        servers.append(server)
        return server

    def kill(server):
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=30)

    try:
        yield port, start, kill
    finally:
        for server in servers:
            server.stop()


@pytest.mark.slow
def test_server_restarted_between_steps_is_named_and_nothing_trains_on_the_fresh_one(
    fault, own_standin, ray_session, tiny_model_dir, tmp_path, monkeypatch
):
    port, start, kill = own_standin
    first = start()
    cfg = wire_config(tiny_model_dir, str(tmp_path / "ckpt"), port)
    client = Client(cfg, monkeypatch)
    url = f"http://127.0.0.1:{port}"
    try:
        client.warm_up()
        run(client.call("update_actor"))  # step 1 trains on the first server
        saved = run(client.forwarder.save_checkpoint(str(tmp_path / "ckpt" / "global_step_1" / "actor"), None, 1))
        fault.protect(saved)
        kill(first)
        start()  # the same port, a fresh server: no jobs, no model
        for op in ("update_actor", "compute_log_prob", "generate"):
            attached = Client.__new__(Client)  # a fresh re-attached forwarder / rollout server per op
            attached.cfg, attached.tok, attached.owner = cfg, client.tok, client.owner
            attached.forwarder = in_process_forwarder(cfg, client.owner.reconnect_handle(), monkeypatch)
            from verl.workers.rollout.remote_rollout.server import RemoteRolloutServer

            attached.rollout = RemoteRolloutServer(cfg, client.owner.reconnect_handle(), 0)
            with fault.expect(
                BackendDiedError,
                match=rf"^remote backend 'arctic' died during {op}\b.*: the Arctic RL server at 127\.0\.0\.1:{port} "
                r"no longer holds this run's jobs \(.*is gone.*\): it has restarted",
                within_s=10,
            ) as outcome:
                run(attached.call(op))
            show(outcome)
        fresh = calls(url)
        assert training_calls(fresh) == {"/forward-backward": 0, "/step": 0}, fresh
        import requests

        assert requests.get(f"{url}/status", timeout=10).json()["jobs"] == {}, "a job was created on the fresh server"
    finally:
        client.destroy()
