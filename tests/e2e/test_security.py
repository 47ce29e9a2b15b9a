"""Security properties: nothing is unpickled from the network or from checkpoints; servers bind to localhost.

* Arctic's HTTP wire (``arctic_platform.wire``) is safetensors: a pickle payload is
  refused without running it.
* Our checkpoints load with safetensors / ``torch.load(weights_only=True)``: a
  checkpoint whose optimizer file is a malicious pickle is refused.
* No module of ours calls ``pickle.load(s)``, an unrestricted ``torch.load`` or
  ``yaml.load``, and every server we start defaults to 127.0.0.1.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import pytest
from support.remote_e2e import REPO_ROOT

OUR_CODE = [
    REPO_ROOT / "verl" / "remote_backend",
    REPO_ROOT / "verl" / "workers" / "remote_client",
    REPO_ROOT / "verl" / "workers" / "rollout" / "remote_rollout",
    REPO_ROOT / "tests" / "arctic_standin",
    REPO_ROOT / "examples",
]


def _sources():
    for root in OUR_CODE:
        yield from sorted(root.rglob("*.py"))


class _Payload:
    """Unpickling this would create the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_no_unsafe_deserialisation_in_our_code():
    offenders = []
    for path in _sources():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\bpickle\.loads?\(|cloudpickle\.loads?\(|\byaml\.load\(|\bmarshal\.loads?\(", code):
                offenders.append(f"{path}:{n}: {line.strip()}")
            if "torch.load(" in code and "weights_only=True" not in code:
                offenders.append(f"{path}:{n}: {line.strip()}")
    assert not offenders, "unsafe deserialisation:\n" + "\n".join(offenders)


def test_servers_we_start_default_to_localhost():
    for path in _sources():
        text = path.read_text()
        # a string literal binding all interfaces (prose explaining why we do not is fine)
        assert not re.search(r"[\"']0\.0\.0\.0[\"']", text), f"{path} binds 0.0.0.0"
    standin = (REPO_ROOT / "tests" / "arctic_standin" / "server.py").read_text()
    assert re.search(r'argv = \["--host", "127\.0\.0\.1"\] \+ argv', standin)  # Arctic's own default is "localhost"
    from verl.workers.remote_client.arctic.config import ArcticConfig

    assert ArcticConfig().host == "127.0.0.1"
    yaml_text = (REPO_ROOT / "verl" / "remote_backend" / "config" / "backend" / "arctic.yaml").read_text()
    assert re.search(r"^host: 127\.0\.0\.1$", yaml_text, re.M)


def test_the_arctic_wire_refuses_pickle_without_running_it(tmp_path):
    wire = pytest.importorskip("arctic_platform.wire")
    import torch

    marker = tmp_path / "pwned"
    for blob in (pickle.dumps(_Payload(str(marker))), _torch_save_bytes(tmp_path, {"x": torch.ones(2)})):
        with pytest.raises(Exception, match="(?i)pickle|safetensors"):
            wire.loads(blob)
    assert not marker.exists()
    # and the real format round-trips tensors
    out = wire.loads(wire.dumps({"batch": {"x": torch.arange(3.0)}}))
    assert torch.equal(out["batch"]["x"], torch.arange(3.0))


def _torch_save_bytes(tmp_path: Path, obj) -> bytes:
    import torch

    path = tmp_path / "legacy.pt"
    torch.save(obj, path)
    return path.read_bytes()


def test_a_checkpoint_with_a_pickled_payload_is_refused(tiny_model_dir, tmp_path):
    """A tampered optimizer.pt (with a matching manifest) must not execute on load."""
    import json

    from verl.workers.remote_client.local.checkpoint import MANIFEST, CheckpointError, _sha256
    from verl.workers.remote_client.local.config import EngineSettings
    from verl.workers.remote_client.local.engine import LocalEngine

    engine = LocalEngine(EngineSettings(model_path=tiny_model_dir))
    ckpt = engine.save_checkpoint(str(tmp_path / "global_step_1" / "actor"), 1)
    marker = tmp_path / "pwned"
    optim = os.path.join(ckpt, "optimizer.pt")
    import torch

    torch.save({"optimizer": _Payload(str(marker))}, optim)  # pickles the payload object
    manifest = json.loads(Path(ckpt, MANIFEST).read_text())
    manifest["files"]["optimizer.pt"] = {"sha256": _sha256(optim), "bytes": os.path.getsize(optim)}
    Path(ckpt, MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="could not be loaded"):
        engine.load_checkpoint(ckpt, 1)
    assert not marker.exists()


# --------------------------------------------------------------------------- credentials
class _OneSecret:
    """Stands for a backend class: only ``secret_settings`` is read on these paths."""

    @classmethod
    def secret_settings(cls) -> dict[str, str]:
        return {"remote_backend.tinker.api_key": "VRB_TEST_API_KEY"}


@pytest.fixture
def clean_secret_state(monkeypatch):
    from verl.remote_backend.launch import secrets

    monkeypatch.setattr(secrets, "_moved", [])
    monkeypatch.delenv("VRB_TEST_API_KEY", raising=False)
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return secrets


def test_a_credential_on_the_command_line_goes_to_its_variable_not_to_hydra(clean_secret_state):
    pytest.importorskip("tinker")
    argv = ["trainer.remote_backend=tinker", "remote_backend.tinker.api_key=tml-abc", "trainer.total_epochs=1"]
    kept = clean_secret_state.move_secret_overrides(argv)
    assert kept == ["trainer.remote_backend=tinker", "trainer.total_epochs=1"]
    assert os.environ["TINKER_API_KEY"] == "tml-abc"
    # the same override for a run on another backend is that backend's business: left alone
    other = ["trainer.remote_backend=local", "++remote_backend.tinker.api_key='tml-x'"]
    assert clean_secret_state.move_secret_overrides(other) == other


@pytest.mark.parametrize("value", ["tml-from-a-file", "${oc.env:VRB_SECRET_SOURCE}"])
def test_a_credential_in_the_composed_config_is_moved_and_masked_in_hydras_record(
    clean_secret_state, monkeypatch, tmp_path, value
):
    from omegaconf import OmegaConf

    monkeypatch.setenv("VRB_SECRET_SOURCE", "tml-from-a-file")
    config = OmegaConf.create({"remote_backend": {"tinker": {"api_key": value}}, "trainer": {}})
    OmegaConf.set_struct(config, True)
    record = tmp_path / ".hydra"
    record.mkdir()
    (record / "config.yaml").write_text("remote_backend:\n  tinker:\n    api_key: tml-from-a-file\n")
    (record / "overrides.yaml").write_text("- trainer.total_epochs=1\n")
    moved = clean_secret_state.hide_secrets(config, _OneSecret, record)
    assert moved == ["remote_backend.tinker.api_key"]
    assert os.environ["VRB_TEST_API_KEY"] == "tml-from-a-file"
    assert config.remote_backend.tinker.api_key is None
    assert "tml-from-a-file" not in OmegaConf.to_yaml(config, resolve=True)
    assert "tml-from-a-file" not in (record / "config.yaml").read_text()
    assert "api_key: '***'" in (record / "config.yaml").read_text()
    assert (record / "overrides.yaml").read_text() == "- trainer.total_epochs=1\n"  # untouched


def test_a_moved_credential_and_an_existing_ray_cluster_are_refused_naming_the_setting(clean_secret_state):
    from omegaconf import OmegaConf

    from verl.remote_backend.errors import ConfigError

    config = OmegaConf.create({"remote_backend": {"tinker": {"api_key": "tml-q"}}, "ray_kwargs": {"ray_init": {}}})
    moved = clean_secret_state.hide_secrets(config, _OneSecret)
    clean_secret_state.check_secrets_reach_workers(config, moved)  # a cluster this run starts: fine
    config.ray_kwargs.ray_init.address = "ray://10.0.0.1:10001"
    clean_secret_state.check_secrets_reach_workers(config)  # nothing moved: nothing to reach the workers
    with pytest.raises(ConfigError) as info:
        clean_secret_state.check_secrets_reach_workers(config, moved)
    message = str(info.value)
    assert "remote_backend.tinker.api_key" in message and "10.0.0.1" in message and "tml-q" not in message


def test_a_malformed_secret_declaration_names_the_adapter():
    from verl.remote_backend.launch.secrets import declared_secrets

    class Bad:
        @classmethod
        def secret_settings(cls):
            return {"remote_backend.x.token": "not a variable"}

    with pytest.raises(TypeError, match=r"Bad.secret_settings\(\) must return"):
        declared_secrets(Bad)


def _everything_a_run_left(root: Path, result) -> list[str]:
    """Where the credential shows: the console, any file under ``root``, any Ray session log."""
    from support.leaks import files_holding, ray_session_dirs

    places = [str(p) for p in files_holding([root, *ray_session_dirs()], SECRET)]
    return (["console"] if SECRET in result.output else []) + places


SECRET = "my-engine-token-5d1f0c7be93a"  # support.credentials.TEST_TOKEN, spelled out: what is searched for


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_declared_credential_reaches_every_process_and_nothing_prints_or_writes_it(verl_grpo_line_run):
    """verl's GRPO line with the third-party adapter and its token on the command line (conftest):
    the token arrives in the owner, the forwarder and the rollout server, and appears nowhere -
    console, run.log, Hydra's files, checkpoints, wandb's offline run, Ray's session logs."""
    from support.credentials import TEST_TOKEN, token_digest

    assert TEST_TOKEN == SECRET
    shared = verl_grpo_line_run("my-engine")
    result = shared.result
    assert result.returncode == 0, result.tail()
    created = [line for line in result.output.splitlines() if "[my-engine] from_config" in line]
    assert len(created) >= 3, created  # owner, forwarder, rollout server
    assert all(f"token={token_digest(SECRET)}" in line for line in created), created
    assert _everything_a_run_left(shared.ckpt.parent, result) == []
    assert "ray init kwargs" in result.output and "'remote_backend'" in result.output  # verl did print its config


def test_a_run_refused_for_its_credential_prints_and_writes_it_nowhere(small_gsm8k_assets, tmp_path):
    """Fails before Ray (the credential cannot reach an existing cluster's workers): the error
    names the setting, and the token is in neither the output nor the run's files."""
    from support.credentials import TOKEN_KEY
    from support.remote_e2e import external_modules_env, run_entry, small_ci_overrides

    overrides = small_ci_overrides(
        model=small_gsm8k_assets["model"],
        train=small_gsm8k_assets["train"],
        test=small_gsm8k_assets["test"],
        ckpt_dir=tmp_path / "ckpt",
        steps=1,
        backend="my-engine",
    )
    overrides += [f"{TOKEN_KEY}={SECRET}", "+ray_kwargs.ray_init.address=ray://10.0.0.1:10001"]
    env = external_modules_env("support.third_party_adapter")
    result = run_entry(overrides, workdir=tmp_path / "run", env_extra=env, timeout_s=180)
    assert result.returncode != 0
    assert f"{TOKEN_KEY}='***'" in result.output, result.tail()
    assert "10.0.0.1" in result.output and "Started a local Ray instance" not in result.output
    assert _everything_a_run_left(tmp_path, result) == []
