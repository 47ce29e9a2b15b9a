"""Unit tests of the pure reliability pieces and of ``BackendGuard`` (no Ray, no server)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from omegaconf import OmegaConf
from support.aio import run_async as run

from verl.remote_backend.errors import BackendDiedError, BackendTimeoutError, BackendTransportError
from verl.remote_backend.reliability.guard import BackendGuard, log_location, run_with_timeout, supports_health
from verl.remote_backend.reliability.policy import (
    IDEMPOTENT_OPS,
    NEVER_RETRIED_OPS,
    LivenessSettings,
    ReliabilitySettings,
    RetryPolicy,
    TimeoutSettings,
    is_death_error,
    is_retryable,
    is_transient_error,
    timeout_key,
)


def settings(**timeouts) -> ReliabilitySettings:
    return ReliabilitySettings(
        timeouts=TimeoutSettings(**{"health": 0.5, **timeouts}),
        liveness=LivenessSettings(enabled=True, interval_s=0.1, failures=2),
        retry=RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.05, jitter=0.0),
    )


# ---------------------------------------------------------------- settings
def test_defaults_suit_each_op_and_every_key_is_in_the_yaml():
    t = TimeoutSettings()
    assert t.health <= 30 < t.update_actor and t.generate >= 600 and t.compute_log_prob >= 600
    from support.remote_e2e import compose

    cfg = compose(["trainer.remote_backend=local"])
    # the yaml declares every key with the dataclass defaults (users set them without "+")
    assert ReliabilitySettings.from_main_config(cfg) == ReliabilitySettings()
    assert set(cfg.remote_backend.timeouts) == set(TimeoutSettings.__dataclass_fields__)


def test_settings_read_overrides_and_reject_bad_values():
    cfg = OmegaConf.create(
        {"remote_backend": {"timeouts": {"generate": 5, "update_actor": None}, "retry": {"attempts": 1}}}
    )
    s = ReliabilitySettings.from_main_config(cfg)
    assert s.timeouts.generate == 5.0 and s.timeouts.update_actor is None and s.retry.attempts == 1
    assert ReliabilitySettings.from_main_config(OmegaConf.create({})) == ReliabilitySettings()
    for block, match in [
        ({"timeouts": {"generat": 5}}, r"unknown key\(s\) \['remote_backend.timeouts.generat'\]"),
        ({"timeouts": {"generate": 0}}, r"remote_backend.timeouts.generate=0: must be > 0"),
        ({"timeouts": {"generate": "x"}}, "must be a number"),
        ({"liveness": {"failures": 0}}, "failures=0: must be >= 1"),
        ({"liveness": {"enabled": "yes"}}, "must be true or false"),
        ({"retry": {"jitter": 1.5}}, r"jitter=1.5: must be in \[0, 1\)"),
    ]:
        with pytest.raises(ValueError, match=match):
            ReliabilitySettings.from_main_config(OmegaConf.create({"remote_backend": block}))


def test_timeout_keys_name_the_shared_block():
    assert timeout_key("update_actor") == "remote_backend.timeouts.update_actor"
    assert timeout_key("compute_ref_log_prob") == "remote_backend.timeouts.compute_log_prob"
    assert TimeoutSettings(compute_log_prob=7).limit("compute_ref_log_prob") == 7


# ---------------------------------------------------------------- retry policy
def test_backoff_is_exponential_capped_and_jittered():
    p = RetryPolicy(attempts=6, base_delay_s=0.5, max_delay_s=4.0, jitter=0.0)
    assert list(p.delays()) == [0.5, 1.0, 2.0, 4.0, 4.0]
    j = RetryPolicy(attempts=50, base_delay_s=1.0, max_delay_s=1.0, jitter=0.25)
    delays = list(j.delays(random.Random(0)))
    assert all(0.75 <= d <= 1.25 for d in delays) and len(set(delays)) > 10
    assert list(RetryPolicy(attempts=1).delays()) == []


def test_only_transport_errors_on_idempotent_ops_are_retried():
    assert IDEMPOTENT_OPS.isdisjoint(NEVER_RETRIED_OPS)
    for op in ("update_actor", "update_weights", "save_checkpoint", "generate"):
        assert not is_retryable(op, ConnectionResetError("reset"))
    for op in ("health", "compute_log_prob", "load_checkpoint"):
        assert is_retryable(op, ConnectionRefusedError("refused"))
        assert is_retryable(op, BackendTransportError("flaky"))
        assert not is_retryable(op, ValueError("bad input"))
        assert not is_retryable(op, BackendTimeoutError(op=op, backend="b", limit_s=1, key="k"))


def test_ray_errors_are_classified_by_name():
    import ray.exceptions as rex

    assert is_death_error(rex.ActorDiedError())
    assert not is_death_error(rex.ActorUnavailableError("x", b"0" * 16))
    assert is_transient_error(rex.ActorUnavailableError("x", b"0" * 16))
    assert not is_death_error(RuntimeError("boom"))


# ---------------------------------------------------------------- guard
class FakeBackend:
    """Speaks the guard's optional capabilities; behaviour set per test."""

    def __init__(self, *, healthy=True, with_health=True):
        self.healthy = healthy
        self.calls = 0
        self.probes = 0
        if not with_health:
            self.health = None  # type: ignore[assignment]

    async def health(self):
        self.probes += 1
        if self.healthy is None:
            await asyncio.sleep(3600)  # frozen
        if not self.healthy:
            raise ConnectionRefusedError("connection refused")

    def log_location(self):
        return "/var/log/fake.log"


def test_capabilities_are_detected():
    assert supports_health(FakeBackend()) and not supports_health(FakeBackend(with_health=False))
    assert log_location(FakeBackend()) == "/var/log/fake.log"
    assert "has no log_location()" in log_location(object())


def test_a_call_past_its_limit_names_op_backend_limit_and_key():
    guard = BackendGuard(FakeBackend(), name="fake", settings=settings(update_actor=0.3))
    start = time.monotonic()
    with pytest.raises(BackendTimeoutError) as err:
        run(guard.call("update_actor", lambda: asyncio.sleep(60)))
    assert time.monotonic() - start < 2
    msg = str(err.value)
    assert "'fake'" in msg and "update_actor did not finish within 0.3s" in msg
    assert "remote_backend.timeouts.update_actor" in msg
    assert err.value.op == "update_actor" and err.value.limit_s == 0.3


def test_results_and_input_errors_pass_through():
    guard = BackendGuard(FakeBackend(), name="fake", settings=settings())

    async def ok():
        return {"x": 1}

    async def bad():
        raise ValueError("prompt_ids is empty")

    assert run(guard.call("compute_log_prob", ok)) == {"x": 1}
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        run(guard.call("generate", bad))
    assert guard.dead is None


def test_transient_errors_on_reads_are_retried_then_succeed():
    backend = FakeBackend()
    guard = BackendGuard(backend, name="fake", settings=settings())

    async def flaky():
        backend.calls += 1
        if backend.calls < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    assert run(guard.call("compute_log_prob", flaky)) == "ok" and backend.calls == 3


def test_updates_are_never_resent():
    backend = FakeBackend()
    guard = BackendGuard(backend, name="fake", settings=settings())

    async def update():
        backend.calls += 1
        raise ConnectionResetError("reset by peer")

    with pytest.raises(ConnectionResetError):
        run(guard.call("update_actor", update))
    assert backend.calls == 1  # sent once, healthy backend: the transport error itself surfaces


def test_a_failed_call_on_an_unhealthy_backend_is_a_death_with_its_logs():
    backend = FakeBackend(healthy=False)
    guard = BackendGuard(backend, name="fake", settings=settings())

    async def update():
        raise ConnectionResetError("reset by peer")

    with pytest.raises(BackendDiedError) as err:
        run(guard.call("update_actor", update))
    msg = str(err.value)
    assert "remote backend 'fake' died during update_actor" in msg and "/var/log/fake.log" in msg
    assert "health probe failed too" in msg
    # later calls fail at once, without reaching the backend
    with pytest.raises(BackendDiedError, match="found dead earlier"):
        run(guard.call("compute_log_prob", lambda: asyncio.sleep(60)))


def test_the_watchdog_fails_in_flight_calls_when_the_backend_stops_answering():
    backend = FakeBackend(healthy=True)
    guard = BackendGuard(backend, name="fake", settings=settings(update_actor=60, generate=60))

    async def scenario():
        calls = [
            asyncio.ensure_future(guard.call(op, lambda: asyncio.sleep(60))) for op in ("update_actor", "generate")
        ]
        await asyncio.sleep(0.35)
        assert backend.probes >= 2 and not any(c.done() for c in calls)  # healthy: probes pass, calls wait
        backend.healthy = None  # frozen: probes time out (health limit 0.5s)
        start = time.monotonic()
        results = await asyncio.gather(*calls, return_exceptions=True)
        return results, time.monotonic() - start

    results, waited = run(scenario())
    assert all(isinstance(r, BackendDiedError) for r in results), results
    assert "2 consecutive health probes failed" in str(results[0]) and "no answer to health() within 0.5s" in str(
        results[0]
    )
    assert waited < 3


def test_a_ray_actor_death_is_recognised_without_a_probe():
    import ray.exceptions as rex

    backend = FakeBackend(with_health=False)
    guard = BackendGuard(backend, name="fake", settings=settings())

    async def dies():
        raise rex.ActorDiedError()

    with pytest.raises(BackendDiedError, match="died during generate: ActorDiedError"):
        run(guard.call("generate", dies))


def test_a_call_on_a_destroyed_client_is_reported_as_a_stop_not_a_death(caplog):
    """Teardown destroys the rollout servers' clients while the agent loop may still submit a
    request; that request's failure is the run's own shutdown, not a crash."""
    from verl.remote_backend.errors import BackendClosedError, BackendStoppedError

    guard = BackendGuard(FakeBackend(with_health=False), name="local", settings=settings())

    async def after_destroy():
        raise BackendClosedError("this LocalBackend was destroyed; create or re-attach a new one")

    with caplog.at_level("WARNING", logger="verl.remote_backend.reliability.guard"):
        with pytest.raises(
            BackendStoppedError, match=r"'local' was stopped during generate \(.*was destroyed.*\).*not a crash"
        ):
            run(guard.call("generate", after_destroy))
    assert not [r for r in caplog.records if r.levelname == "ERROR"], "a stop must not be logged as an error"
    assert "died" not in str(guard.dead)


def test_an_engine_stopped_by_ray_kill_is_reported_as_a_stop_not_a_death(caplog):
    """Our teardown kills the engine actor after another failure; calls still in flight must say so,
    not announce a crash (the real cause is reported first, elsewhere)."""
    import ray

    from verl.remote_backend.errors import BackendStoppedError

    @ray.remote
    class Engine:
        async def generate(self):
            await asyncio.sleep(60)

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        engine = Engine.remote()
        guard = BackendGuard(FakeBackend(with_health=False), name="local", settings=settings())

        async def in_flight_then_teardown():
            call = asyncio.ensure_future(guard.call("generate", lambda: engine.generate.remote()))
            await asyncio.sleep(1.0)
            ray.kill(engine, no_restart=True)  # what LocalBackend.destroy() does
            return await call

        with caplog.at_level("WARNING", logger="verl.remote_backend.reliability.guard"):
            with pytest.raises(
                BackendStoppedError, match=r"'local' was stopped during generate \(.*ray.kill.*\).*not a crash"
            ):
                run(in_flight_then_teardown())
        assert not [r for r in caplog.records if r.levelname == "ERROR"], "a stop must not be logged as an error"
        assert "died" not in str(guard.dead)
    finally:
        if started:
            ray.shutdown()


def test_run_with_timeout_bounds_sync_and_async_teardown():
    assert run_with_timeout(lambda: 3, op="create", backend="b", limit_s=1) == 3

    async def adestroy():
        await asyncio.sleep(0)
        return "done"

    assert run_with_timeout(adestroy, op="destroy", backend="b", limit_s=1) == "done"
    start = time.monotonic()
    with pytest.raises(
        BackendTimeoutError, match=r"destroy did not finish within 0.2s.*remote_backend.timeouts.destroy"
    ):
        run_with_timeout(lambda: time.sleep(5), op="destroy", backend="b", limit_s=0.2)
    assert time.monotonic() - start < 1
    with pytest.raises(KeyError):
        run_with_timeout(lambda: {}["x"], op="create", backend="b", limit_s=1)


def test_errors_survive_pickling_as_ray_ships_them():
    """Ray pickles a worker's exception to the trainer; keyword-only constructors must not break that."""
    import pickle

    from verl.remote_backend.errors import BackendOutputError, BackendStoppedError, ResumeCheckpointError

    for err in (
        BackendTimeoutError(op="generate", backend="b", limit_s=3, key="remote_backend.timeouts.generate"),
        BackendDiedError(op="update_actor", backend="b", logs="/x.log", cause="gone"),
        BackendStoppedError(op="generate", backend="b", logs="/x.log", cause="killed by `ray.kill`"),
        BackendOutputError("bad shape"),
        ResumeCheckpointError("corrupt"),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.__dict__ == err.__dict__
    import ray.cloudpickle

    assert str(ray.cloudpickle.loads(ray.cloudpickle.dumps(err))) == "corrupt"
