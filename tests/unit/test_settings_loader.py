"""The one settings loader, the one error hierarchy, and the format-agnostic checkpoint core."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Optional

import pytest
from omegaconf import OmegaConf

from verl.remote_backend.errors import BackendError, BackendOutputError, BackendTransportError, ConfigError
from verl.remote_backend.settings.loader import block, build_settings, load_settings, select, setting


@dataclass(frozen=True)
class _Inner:
    size: int = setting(2, ge=1)


@dataclass(frozen=True)
class _Settings:
    mode: str = setting("a", choices=("a", "b"))
    ratio: float = setting(0.5, ge=0, lt=1)
    limit: Optional[float] = setting(10.0, gt=0)
    enabled: bool = True
    inner: _Inner = field(default_factory=_Inner)

    def __post_init__(self) -> None:
        if self.mode == "b" and not self.enabled:
            raise ConfigError("x.mode=b needs x.enabled=true")


def test_the_loader_builds_typed_nested_settings_in_one_call():
    cfg = OmegaConf.create({"x": {"mode": "b", "ratio": 0, "limit": None, "inner": {"size": 3}}})
    assert load_settings(_Settings, cfg, "x") == _Settings(mode="b", ratio=0.0, limit=None, inner=_Inner(3))
    assert load_settings(_Settings, OmegaConf.create({}), "x") == _Settings()  # absent block: defaults
    assert isinstance(load_settings(_Settings, cfg, "x").ratio, float)


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"mdoe": "a"}, r"unknown key\(s\) \['x.mdoe'\]"),
        ({"inner": {"sise": 1}}, r"unknown key\(s\) \['x.inner.sise'\]"),
        ({"inner": {"size": 0}}, r"x.inner.size=0: must be >= 1"),
        ({"inner": {"size": 1.5}}, r"x.inner.size=1.5: must be a whole number"),
        ({"mode": "c"}, r"x.mode='c': must be one of \['a', 'b'\]"),
        ({"ratio": 1}, r"x.ratio=1: must be in \[0, 1\)"),
        ({"ratio": None}, r"x.ratio=None: must be set"),
        ({"limit": "5"}, r"x.limit='5': must be a number or null"),
        ({"enabled": 1}, r"x.enabled=1: must be true or false"),
        ({"mode": "b", "enabled": False}, r"x.mode=b needs x.enabled=true"),
    ],
)
def test_the_loader_names_the_full_dotted_key(raw, match):
    with pytest.raises(ConfigError, match=match):
        build_settings(_Settings, raw, "x")


def test_the_reader_walks_omegaconf_mappings_and_config_objects():
    @dataclass
    class Actor:
        ppo_epochs: int = 2

    cfg = OmegaConf.create({"a": {"b": 1, "ref": "${a.b}", "missing": "???", "none": None}})
    assert select(cfg, "a.ref") == 1  # interpolation of the value reached
    assert select(cfg, "a.missing", "d") == "d" and select(cfg, "a.none", "d") == "d" and select(cfg, "z.y", 3) == 3
    assert select({"actor": Actor()}, "actor.ppo_epochs") == 2
    assert block(cfg, "nothing") == {}
    with pytest.raises(ConfigError, match="a.b must be a mapping"):
        block(cfg, "a.b")


def test_one_error_hierarchy():
    from verl.workers.remote_client.arctic.errors import (
        ArcticBackendError,
        ArcticResponseError,
        ArcticServerError,
        ArcticUnreachableError,
    )

    assert issubclass(ConfigError, ValueError)
    assert issubclass(ArcticBackendError, BackendError)
    assert issubclass(ArcticUnreachableError, BackendTransportError) and issubclass(
        ArcticUnreachableError, ConnectionError
    )
    assert issubclass(ArcticResponseError, BackendOutputError)
    err = pickle.loads(pickle.dumps(ArcticServerError("rejected", status=503, detail="busy")))  # crosses Ray
    assert (type(err), str(err), err.status, err.detail) == (ArcticServerError, "rejected", 503, "busy")


def test_the_checkpoint_core_asks_the_backend_about_its_own_files(tmp_path):
    import torch

    from verl.remote_backend.checkpoints import complete_checkpoints, parse_global_step

    for step in (1, 2):
        (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
        torch.save({}, tmp_path / f"global_step_{step}" / "data.pt")
    seen = []

    def format_problem(actor_dir, step):
        seen.append((actor_dir, step))
        return "bad weights" if step == 2 else None

    assert complete_checkpoints(str(tmp_path)) == [str(tmp_path / "global_step_2"), str(tmp_path / "global_step_1")]
    assert complete_checkpoints(str(tmp_path), format_problem=format_problem) == [str(tmp_path / "global_step_1")]
    assert sorted(seen) == [(str(tmp_path / f"global_step_{k}" / "actor"), k) for k in (1, 2)]
    assert parse_global_step("runs/global_step_3/global_step_40/actor") == 40
    assert parse_global_step("/ckpt/my_global_step_4/actor") is None  # a whole path component only


def test_each_validation_rule_stands_alone():
    from verl.remote_backend.launch import validation

    cfg = OmegaConf.create(
        {"trainer": {"default_hdfs_dir": "hdfs://x", "device": "cpu", "n_gpus_per_node": 2, "nnodes": 1}}
    )
    with pytest.raises(
        ConfigError, match=r"^trainer.default_hdfs_dir='hdfs://x': .*Fix: set trainer.default_hdfs_dir=null"
    ):
        validation.check_no_hdfs(cfg)
    validation.check_forwarder_count(cfg)
    with pytest.raises(ConfigError, match=r"^trainer.remote_backend='retry': .*not a backend"):
        validation.check_backend_name("retry")
    cfg = OmegaConf.merge(cfg, {"ray_kwargs": {"ray_init": {"num_cpus": 2}}})
    with pytest.raises(ConfigError, match="at least 4"):  # runner + 2 forwarders, plus one
        validation.check_ray_cpus(cfg)
