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
from remote_e2e import REPO_ROOT

TEST_TIER = "integration"  # starts Ray, a server, an engine or a model (tiers: tests/conftest.py)

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
