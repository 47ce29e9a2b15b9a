"""One switch: ``trainer.remote_backend=<name>`` on verl's own GRPO command line is all a user adds.

The fast tests here derive and validate the composed config (no Ray); the slow ones run verl's
GRPO line through the entry point, with the local backend and with an adapter registered from
outside the package.
"""

from __future__ import annotations

import copy
import math
import re

import pytest
from omegaconf import OmegaConf
from support.remote_e2e import (
    REQUIRED_STEP_METRICS,
    compose,
    release_switch,
    verl_grpo_gsm8k_line,
)

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.launch.derive import derive_remote_settings, describe, explicit_override_keys
from verl.remote_backend.launch.rules import check_required_settings, required_settings
from verl.remote_backend.launch.validation import validate_remote_backend_config
from verl.remote_backend.verl_versions import verl_glue

pytestmark = pytest.mark.every_verl  # CI runs it on both releases (.ci/run)


@pytest.fixture(scope="module")
def assets(small_gsm8k_assets, tmp_path_factory):
    return {**small_gsm8k_assets, "ckpt": tmp_path_factory.mktemp("derive") / "ckpt"}


def verl_line(assets, backend="local", **changes) -> list[str]:
    line = verl_grpo_gsm8k_line(
        model=assets["model"], train=assets["train"], test=assets["test"], ckpt_dir=assets["ckpt"], backend=backend
    )
    keys = {c.split("=", 1)[0] for c in changes.values()}
    return [o for o in line if o.split("=", 1)[0] not in keys] + list(changes.values())


def test_verls_grpo_line_plus_the_switch_is_derived_into_a_valid_remote_run(assets):
    line = verl_line(assets)
    config = compose(line)
    with pytest.raises(ConfigError):  # as composed, verl's GPU layout cannot run remotely
        validate_remote_backend_config(config)
    changes = derive_remote_settings(config, explicit_override_keys(line))
    # 0.7.1: use_legacy_worker_impl; 0.9.1: TransferQueue's storage units (its V1 trainer is already sync)
    assert {(c.key, c.before, c.after) for c in changes} == release_switch().derived | {
        ("trainer.device", "cuda", "cpu"),
        ("actor_rollout_ref.rollout.name", "vllm", "remote"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", 2, 1),
        ("trainer.n_gpus_per_node", 8, 1),
    }
    plan = validate_remote_backend_config(config)
    assert plan.name == "local" and plan.num_forwarders == 1 and plan.num_replicas == 1
    line_printed = describe("local", changes)
    assert line_printed.startswith("[remote_backend] set for trainer.remote_backend=local: ")
    assert "actor_rollout_ref.rollout.name=remote (was vllm)" in line_printed
    assert derive_remote_settings(config, explicit_override_keys(line)) == []  # idempotent


@pytest.mark.parametrize("backend, single_forwarder", [("local", True), ("my-engine", False)])
def test_every_key_the_switch_sets_is_one_validation_checks(assets, backend, single_forwarder):
    """One table: each rule the switch applies is satisfied after it, and breaking any one of
    them again (a value neither required nor also accepted) is refused naming that key."""
    config = compose(verl_line(assets, backend=backend))
    changes = derive_remote_settings(config, explicit=None)
    rules = required_settings(config, backend, single_forwarder)
    # the rest are the release's defaults for a remote run (any value works; the user's is kept)
    defaults = {key for key, _, _ in verl_glue().release_defaults(config)}
    assert {c.key for c in changes} <= {r.key for r in rules} | defaults
    check_required_settings(config, backend, single_forwarder)  # the switch's result passes
    for rule in rules:
        broken = copy.deepcopy(config)
        OmegaConf.update(broken, rule.key, "not-" + str(rule.value), force_add=True)
        with pytest.raises(ConfigError, match=rf"^{re.escape(rule.key)}=.*Fix: set {re.escape(rule.key)}="):
            check_required_settings(broken, backend, single_forwarder)


def test_nothing_is_derived_on_verls_own_path(assets):
    line = [o for o in verl_line(assets) if not o.startswith("trainer.remote_backend=")]
    config = compose(line)
    before = str(config)
    assert derive_remote_settings(config, explicit_override_keys(line)) == []
    assert str(config) == before


@pytest.mark.parametrize(
    "override, match",
    [
        (
            f"{release_switch().key}={release_switch().refused}",
            rf"(?i){release_switch().key}='?{release_switch().refused}'? was set explicitly",
        ),
        ("trainer.device=cuda", r"trainer.device='cuda' was set explicitly.*computes nothing on an accelerator"),
        ("actor_rollout_ref.rollout.name=my_engine", r"actor_rollout_ref.rollout.name='my_engine' was set explicitly"),
    ],
)
def test_an_explicit_value_the_remote_path_cannot_honour_is_refused(assets, override, match):
    line = verl_line(assets, change=override)
    config = compose(line)
    with pytest.raises(ConfigError, match=match) as err:
        derive_remote_settings(config, explicit_override_keys(line))
    assert "Fix: drop " + override.split("=")[0] in str(err.value)


def test_the_same_values_left_at_verls_defaults_are_derived_without_complaint(assets):
    """``trainer.device`` is ``cuda`` by verl's default: derived, not refused, when not on the command line."""
    line = verl_line(assets)
    config = compose(line)
    changes = derive_remote_settings(config, explicit=None)
    assert ("trainer.device", "cuda", "cpu") in {(c.key, c.before, c.after) for c in changes}


def test_explicit_override_keys_reads_hydra_syntax():
    assert explicit_override_keys(["a.b=1", "+c.d=2", "++e=3", "~f", "hydra.run.dir=x"]) == {"a.b", "c.d", "e", "f"}


# ---------------------------------------------------------------- end to end
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ["local", "my-engine"])
def test_verls_grpo_command_line_runs_with_only_the_switch_added(verl_grpo_line_run, backend):
    """verl's GRPO line, sizes changed for this machine, ``verl.trainer.main_ppo`` replaced by
    ``verl.remote_backend.main_ppo`` and ``trainer.remote_backend`` added: it trains on CPU,
    for the built-in local backend and for a third-party adapter (``VERL_USE_EXTERNAL_MODULES``).
    The run is the session's (conftest ``verl_grpo_line_run``), shared with test_e2e_grpo_gsm8k
    and test_third_party_adapter_e2e."""
    result = verl_grpo_line_run(backend).result
    assert result.returncode == 0, result.tail()
    derived = [ln for ln in result.output.splitlines() if ln.startswith("[remote_backend] set for")]
    assert len(derived) == 1 and "actor_rollout_ref.rollout.name=remote (was vllm)" in derived[0], derived
    assert "trainer.n_gpus_per_node=1 (was 8)" in derived[0]
    metrics = result.console_step(1)  # the line's logger is console + wandb (offline), no file
    for key in REQUIRED_STEP_METRICS:
        logged = "perf/mfu/actor" if key == "actor/mfu" else key
        assert math.isfinite(float(metrics[logged])), logged
    assert float(metrics["actor/kl_loss"]) >= 0  # verl's KL loss from the line, computed by the backend
    if backend == "my-engine":
        assert "[my-engine] update_actor" in result.output
