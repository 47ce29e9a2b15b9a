"""``remote_backend.arctic.*``: yaml documentation, derivation from verl's config, lazy imports."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest
import yaml
from arctic_standin.harness import ARCTIC_YAML, compose_config

from verl.remote_backend.errors import ConfigError
from verl.workers.remote_client.arctic.config import ArcticConfig, load_arctic_config
from verl.workers.remote_client.arctic.derive import (
    build_client_config,
    check_loss_compatibility,
    derive_ds_config,
    derive_vllm_config,
)


@pytest.fixture(scope="module")
def base_cfg(tmp_path_factory):
    return compose_config("/models/tiny", str(tmp_path_factory.mktemp("ckpt")), 8123)


def _with(cfg, **updates):
    from omegaconf import OmegaConf, open_dict

    cfg = cfg.copy()
    for key, value in updates.items():
        with open_dict(cfg):
            OmegaConf.update(cfg, key.replace("__", "."), value, merge=True)
    return cfg


def test_yaml_keys_match_the_dataclass_and_are_all_documented():
    with open(ARCTIC_YAML) as fh:
        lines = fh.read().splitlines()
    raw = yaml.safe_load("\n".join(lines))

    def check(cls, block, prefix):
        names = {f.name for f in dataclasses.fields(cls)}
        assert set(block) == names, f"{prefix}: yaml {sorted(block)} vs dataclass {sorted(names)}"
        for f in dataclasses.fields(cls):
            value = block[f.name]
            if isinstance(value, dict) and dataclasses.is_dataclass(
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            ):
                check(type(f.default_factory()), value, f"{prefix}.{f.name}")

    check(ArcticConfig, raw, "remote_backend.arctic")
    # Every key line is directly preceded by a comment line.
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and ":" in stripped:
            prev = next(lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip())
            assert prev.startswith("#"), f"key without a comment above it: {line!r}"


def test_defaults_load_and_validate(base_cfg):
    cfg = load_arctic_config(base_cfg)
    assert cfg.protocol == "http" and cfg.host == "127.0.0.1" and cfg.port == 8123
    assert cfg.deepspeed == {"zero_optimization": {"stage": 1}}  # stage 0 cannot start with Arctic's bf16 defaults


def test_unknown_and_invalid_keys_are_named(base_cfg):
    with pytest.raises(ConfigError, match=r"remote_backend\.arctic\.colocat"):
        load_arctic_config(_with(base_cfg, remote_backend__arctic__colocat=True))
    with pytest.raises(ConfigError, match="cuda_ipc=true requires"):
        load_arctic_config(
            _with(base_cfg, remote_backend__arctic__colocate=False, remote_backend__arctic__weight_sync__cuda_ipc=True)
        )
    with pytest.raises(ConfigError, match=r"remote_backend\.arctic\.protocol='grpc': must be one of http, ray.*Fix"):
        load_arctic_config(_with(base_cfg, remote_backend__arctic__protocol="grpc"))
    assert load_arctic_config(_with(base_cfg, remote_backend__arctic__protocol="ray")).protocol == "ray"
    with pytest.raises(ConfigError, match=r"launch_server=true starts an HTTP server.*Fix"):
        load_arctic_config(
            _with(base_cfg, remote_backend__arctic__protocol="ray", remote_backend__arctic__launch_server=True)
        )


def test_deepspeed_config_derived_from_verl_actor(base_cfg):
    cfg = _with(
        base_cfg,
        actor_rollout_ref__actor__optim__lr=3e-6,
        actor_rollout_ref__actor__optim__betas=[0.8, 0.95],
        actor_rollout_ref__actor__optim__weight_decay=0.05,
        actor_rollout_ref__actor__optim__clip_grad=0.7,
        actor_rollout_ref__actor__ppo_mini_batch_size=2,
        actor_rollout_ref__rollout__n=4,
        actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu=2,
    )
    ds = derive_ds_config(cfg, load_arctic_config(cfg), n_gpus=2)
    assert ds["train_batch_size"] == 8  # ppo_mini_batch_size x rollout.n samples per optimizer step
    assert ds["train_micro_batch_size_per_gpu"] == 2 and ds["gradient_accumulation_steps"] == 2
    assert ds["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": 3e-6, "betas": [0.8, 0.95], "weight_decay": 0.05, "eps": 1e-8},
    }
    assert ds["gradient_clipping"] == 0.7
    assert "scheduler" not in ds  # constant LR, no warmup
    assert ds["zero_optimization"] == {"stage": 1}  # pass-through merged in


def test_lr_schedules_in_optimizer_steps(base_cfg):
    # 4 prompts per step, mini-batch of 2 prompts, 2 epochs -> 4 optimizer steps per global step.
    common = dict(
        data__train_batch_size=4,
        actor_rollout_ref__actor__ppo_mini_batch_size=2,
        actor_rollout_ref__actor__ppo_epochs=2,
        actor_rollout_ref__actor__optim__total_training_steps=10,
    )
    warm = _with(base_cfg, actor_rollout_ref__actor__optim__lr_warmup_steps_ratio=0.2, **common)
    ds = derive_ds_config(warm, load_arctic_config(warm), n_gpus=1)
    assert ds["scheduler"] == {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2, "warmup_num_steps": 8, "warmup_type": "linear"},
    }
    cos = _with(
        base_cfg,
        actor_rollout_ref__actor__optim__lr_scheduler_type="cosine",
        actor_rollout_ref__actor__optim__min_lr_ratio=0.1,
        **common,
    )
    sched = derive_ds_config(cos, load_arctic_config(cos), n_gpus=1)["scheduler"]
    assert sched["type"] == "WarmupCosineLR" and sched["params"]["total_num_steps"] == 40
    assert sched["params"]["cos_min_ratio"] == 0.1
    unknown = _with(
        base_cfg,
        actor_rollout_ref__actor__optim__lr_warmup_steps_ratio=0.1,
        actor_rollout_ref__actor__optim__total_training_steps=-1,
    )
    with pytest.raises(ConfigError, match="total_training_steps"):
        derive_ds_config(unknown, load_arctic_config(unknown), n_gpus=1)


def test_deepspeed_pass_through_wins(base_cfg):
    cfg = _with(
        base_cfg, remote_backend__arctic__deepspeed={"zero_optimization": {"stage": 3}, "gradient_clipping": 5.0}
    )
    ds = derive_ds_config(cfg, load_arctic_config(cfg), n_gpus=1)
    assert ds["zero_optimization"] == {"stage": 3} and ds["gradient_clipping"] == 5.0


def test_client_config_from_verl(base_cfg, tmp_path):
    cfg = _with(
        base_cfg,
        data__max_prompt_length=100,
        data__max_response_length=28,
        actor_rollout_ref__rollout__gpu_memory_utilization=0.4,
        trainer__default_local_dir=str(tmp_path),
    )
    cc = build_client_config(cfg, load_arctic_config(cfg))
    assert cc.model_name == "/models/tiny" and cc.max_seq_len == 128
    assert (cc.training_gpus, cc.sampling_gpus, cc.log_prob_gpus) == (1, 1, 0)  # no KL -> no reference job
    assert cc.training.checkpoint_path == str(tmp_path)
    assert cc.backend.protocol == "http" and cc.backend.host == "127.0.0.1" and not cc.backend.launch_local_server
    assert cc.sampling.vllm["gpu_memory_utilization"] == 0.4 and cc.sampling.vllm["max_model_len"] == 128
    assert cc.sampling.log_prob_engine == "deepspeed" and cc.sampling.log_prob_ds_config is None
    kl = _with(cfg, actor_rollout_ref__actor__use_kl_loss=True)
    cc = build_client_config(kl, load_arctic_config(kl))
    assert cc.log_prob_gpus == 1 and "optimizer" not in cc.sampling.log_prob_ds_config
    no_ref = _with(kl, remote_backend__arctic__log_prob_gpus=0)
    with pytest.raises(ConfigError, match="log_prob_gpus=0"):
        build_client_config(no_ref, load_arctic_config(no_ref))
    over = _with(cfg, remote_backend__arctic__sampling__vllm={"max_model_len": 64})
    vllm = derive_vllm_config(over, load_arctic_config(over))
    assert vllm["max_model_len"] == 64


def test_loss_compatibility_check(base_cfg):
    assert check_loss_compatibility(base_cfg, load_arctic_config(base_cfg)) == []
    cfg = _with(
        base_cfg,
        actor_rollout_ref__actor__policy_loss__loss_mode="gspo",
        actor_rollout_ref__actor__clip_ratio_high=0.28,
    )
    problems = check_loss_compatibility(cfg, load_arctic_config(cfg))
    assert any("loss_mode='gspo'" in p for p in problems) and any("clip_ratio_high=0.28" in p for p in problems)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def test_lazy_imports():
    out = _run(
        """
        import sys
        import verl.remote_backend
        from verl.remote_backend import RemoteBackendRegistry
        assert "arctic" in RemoteBackendRegistry.list()
        import verl.workers.remote_client.arctic.config, verl.workers.remote_client.arctic.payload
        import verl.workers.remote_client.arctic.bodies, verl.workers.remote_client.arctic.errors
        bad = [m for m in sys.modules if m.split(".")[0] in ("arctic_platform", "deepspeed", "vllm")]
        assert not bad, bad
        RemoteBackendRegistry.get("arctic")
        assert "arctic_platform.client" in sys.modules
        assert "deepspeed" not in sys.modules, "the adapter must not pull in DeepSpeed"
        print("ok")
        """
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


def test_missing_arctic_install_gives_the_install_hint():
    out = _run(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "arctic_platform" or name.startswith("arctic_platform."):
                    raise ModuleNotFoundError(f"No module named {name!r}")
        sys.meta_path.insert(0, Block())
        from verl.remote_backend import RemoteBackendRegistry, BackendImportError
        try:
            RemoteBackendRegistry.get("arctic")
        except BackendImportError as exc:
            print("HINT:", exc)
        """
    )
    assert "pip install 'verl-remote-backend[arctic]'" in out.stdout, out.stdout + out.stderr[-2000:]
