"""Bad configurations fail before any worker starts, naming the setting and the fix.

Each case composes the entry point's config and calls the entry point's ``run``:
the error must come from validation on the driver, before ``ray.init`` (so no
placement group, worker or engine ever starts).
"""

from __future__ import annotations

import pytest
import ray
from support.remote_e2e import REMOTE_BASE_OVERRIDES, compose
from support.stub_backend import StubBackend

from verl.remote_backend import RemoteBackend, RemoteBackendRegistry, UnknownBackendError
from verl.remote_backend.errors import ConfigError
from verl.remote_backend.launch.rules import REMOTE_ROLLOUT_NAME
from verl.remote_backend.launch.validation import required_ray_cpus, validate_remote_backend_config
from verl.remote_backend.main_ppo import run

# The smallest valid remote-backend config; each test changes one thing.
GOOD = list(REMOTE_BASE_OVERRIDES)


@pytest.fixture(scope="module", autouse=True)
def _model_dir(tmp_path_factory):
    """Validation checks actor_rollout_ref.model.path (and its context length): give GOOD a real one."""
    model = tmp_path_factory.mktemp("cfg_model")
    (model / "config.json").write_text('{"model_type": "qwen2", "max_position_embeddings": 4096}')
    GOOD.append(f"actor_rollout_ref.model.path={model}")
    yield
    GOOD.pop()


def _with(*changes: str) -> list[str]:
    keys = {c.split("=", 1)[0] for c in changes}
    return [o for o in GOOD if o.split("=", 1)[0] not in keys] + list(changes)


def _fails_before_workers(overrides, error=ConfigError):
    assert not ray.is_initialized()
    with pytest.raises(error) as info:
        run(compose(overrides))
    assert not ray.is_initialized(), "validation must run before ray.init"
    return str(info.value)


def _refused_by_validation(overrides) -> str:
    """For keys the entry point derives (``launch/derive.py``): the entry point would set them, so
    call the validation the trainer also runs - what a launcher that skips the entry point meets."""
    with pytest.raises(ConfigError) as info:
        validate_remote_backend_config(compose(overrides))
    assert not ray.is_initialized()
    return str(info.value)


def test_the_minimal_config_is_valid():
    plan = validate_remote_backend_config(compose(GOOD))
    assert plan.name == "local" and plan.num_forwarders == 1 and plan.num_replicas == 1
    assert plan.resume_from is None
    assert REMOTE_ROLLOUT_NAME == "remote"


def test_unknown_backend_lists_the_known_ones_and_how_to_register():
    message = _fails_before_workers(_with("trainer.remote_backend=nope"), UnknownBackendError)
    assert "trainer.remote_backend=nope" in message
    assert "local" in message and "arctic" in message
    assert "RemoteBackendRegistry.register" in message


def test_two_forwarders_for_a_single_forwarder_backend_is_refused():
    message = _refused_by_validation(_with("trainer.n_gpus_per_node=2"))
    assert message.startswith("trainer.n_gpus_per_node=2:"), message
    assert "exactly one CPU forwarder" in message
    assert "Fix: set trainer.n_gpus_per_node=1" in message


def test_rollout_parallelism_is_refused():
    # verl's default tensor_model_parallel_size=2 would give 1 forwarder // 2 = 0 rollout replicas
    message = _refused_by_validation(_with("actor_rollout_ref.rollout.tensor_model_parallel_size=2"))
    assert message.startswith("actor_rollout_ref.rollout.tensor_model_parallel_size=2:"), message
    assert "the backend parallelises sampling itself" in message
    assert "Fix: set actor_rollout_ref.rollout.tensor_model_parallel_size=1" in message


@pytest.mark.parametrize(
    "change, setting, fix",
    [
        ("trainer.use_legacy_worker_impl=auto", "trainer.use_legacy_worker_impl", "use_legacy_worker_impl=disable"),
        ("trainer.device=cuda", "trainer.device", "set trainer.device=cpu"),
        ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.name", "rollout.name=remote"),
    ],
)
def test_keys_the_entry_point_derives_are_still_checked_by_validation(change, setting, fix):
    message = _refused_by_validation(_with(change))
    assert message.startswith(setting), message
    assert "Fix:" in message and fix in message


def test_the_entry_point_refuses_an_explicit_value_it_cannot_derive_before_ray_starts():
    assert not ray.is_initialized()
    overrides = _with("trainer.use_legacy_worker_impl=enable")
    with pytest.raises(ConfigError, match=r"use_legacy_worker_impl='enable' was set explicitly"):
        run(compose(overrides), explicit_keys={"trainer.use_legacy_worker_impl"})
    assert not ray.is_initialized()


@pytest.mark.parametrize(
    "change, setting, fix",
    [
        ("algorithm.adv_estimator=gae", "algorithm.adv_estimator", "adv_estimator=grpo"),
        ("critic.enable=true", "critic.enable", "critic.enable=null"),
        ("reward.reward_model.enable=true", "reward.reward_model.enable", "reward_model.enable=false"),
        ("trainer.default_hdfs_dir=hdfs://x", "trainer.default_hdfs_dir", "default_hdfs_dir=null"),
        ("ray_kwargs.ray_init.num_cpus=1", "ray_kwargs.ray_init.num_cpus", "at least 3"),
        (
            "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
            "actor_rollout_ref.rollout.checkpoint_engine.backend",
            "backend=naive",
        ),
    ],
)
def test_other_unsupported_settings_name_the_setting_and_the_fix(change, setting, fix):
    message = _fails_before_workers(_with(change))
    assert message.startswith(setting), message
    assert "Fix:" in message and fix in message


def _never_created(cls, main_config, *, handle=None):
    raise AssertionError("validation must fail before the backend is created")


#: the nine methods only: no load_checkpoint
_NoResumeBackend = StubBackend.variant(
    "NoResumeBackend", load_checkpoint=RemoteBackend.load_checkpoint, from_config=classmethod(_never_created)
)


@pytest.fixture
def no_resume_backend():
    RemoteBackendRegistry.register("test-no-resume")(_NoResumeBackend)
    yield "test-no-resume"
    RemoteBackendRegistry.unregister("test-no-resume")


def _fake_checkpoint(root, step: int) -> None:
    import torch

    (root / f"global_step_{step}" / "actor").mkdir(parents=True)
    torch.save({}, root / f"global_step_{step}" / "data.pt")  # verl's dataloader state
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))


def test_resume_with_a_backend_that_cannot_load_fails_at_start_up(no_resume_backend, tmp_path):
    _fake_checkpoint(tmp_path, 4)
    overrides = _with(
        f"trainer.remote_backend={no_resume_backend}",
        "trainer.resume_mode=auto",
        f"trainer.default_local_dir={tmp_path}",
    )
    message = _fails_before_workers(overrides)
    assert message.startswith("trainer.resume_mode='auto'")
    assert str(tmp_path / "global_step_4") in message and "cannot load checkpoints" in message
    assert "Fix: set trainer.resume_mode=disable" in message
    # resume_path asks explicitly
    message = _fails_before_workers(
        _with(
            f"trainer.remote_backend={no_resume_backend}",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={tmp_path}/global_step_4",
        )
    )
    assert "cannot load checkpoints" in message


def test_auto_resume_without_a_checkpoint_starts_from_scratch_even_without_load(no_resume_backend, tmp_path):
    overrides = _with(
        f"trainer.remote_backend={no_resume_backend}",
        "trainer.resume_mode=auto",
        f"trainer.default_local_dir={tmp_path}",
    )
    plan = validate_remote_backend_config(compose(overrides))
    assert plan.resume_from is None


def test_local_backend_resume_is_accepted(tmp_path):
    from verl.workers.remote_client.local.checkpoint import write_checkpoint_dir

    _fake_checkpoint(tmp_path, 2)
    # the local engine's own format inside actor/, which its checkpoint_problem verifies
    write_checkpoint_dir(
        str(tmp_path / "global_step_2" / "actor"), 2, {"model.safetensors": lambda f: open(f, "wb").write(b"w")}
    )
    plan = validate_remote_backend_config(
        compose(_with("trainer.resume_mode=auto", f"trainer.default_local_dir={tmp_path}"))
    )
    assert plan.resume_from == str(tmp_path / "global_step_2")


def test_required_ray_cpus_counts_runner_and_forwarders():
    assert required_ray_cpus(compose(GOOD)) == 2


# ------------------------------------------------------------------ arctic: its own rules, before Ray
@pytest.mark.parametrize(
    "change, expected",
    [
        ("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm", "loss_agg_mode='seq-mean-token-sum-norm'"),
        ("actor_rollout_ref.actor.entropy_coeff=0.01", "entropy_coeff=0.01"),
        ("actor_rollout_ref.actor.kl_loss_type=full", "kl_loss_type='full'"),
        ("remote_backend.arctic.protocol=grpc", "remote_backend.arctic.protocol='grpc': must be one of http, ray"),
    ],
)
def test_arctic_settings_its_server_cannot_honour_fail_before_ray(change, expected):
    pytest.importorskip("arctic_platform")
    overrides = _with("trainer.remote_backend=arctic", "actor_rollout_ref.actor.use_kl_loss=true", change)
    message = _fails_before_workers(overrides)
    assert expected in message and "Fix" in message


def test_arctic_resume_from_a_step_the_server_never_saved_fails_before_ray(tmp_path):
    """The driver checks what Arctic's server writes (DeepSpeed's checkpoint-N/latest), not the local manifest."""
    from verl.remote_backend.errors import ResumeCheckpointError

    pytest.importorskip("arctic_platform")
    _fake_checkpoint(tmp_path, 2)  # verl's part complete; Arctic's DeepSpeed files absent
    overrides = _with(
        "trainer.remote_backend=arctic", "trainer.resume_mode=auto", f"trainer.default_local_dir={tmp_path}"
    )
    message = _fails_before_workers(overrides, ResumeCheckpointError)
    assert "global_step_2" in message and "checkpoint-2/latest is missing" in message


@pytest.mark.parametrize(
    "change, setting, fix",
    [
        ("actor_rollout_ref.rollout.n=0", "actor_rollout_ref.rollout.n=0", "set rollout.n >= 1"),
        ("actor_rollout_ref.actor.ppo_epochs=0", "actor_rollout_ref.actor.ppo_epochs=0", "set ppo_epochs >= 1"),
        # 6 prompts cannot split into mini-batches of 4 (verl would find out after a full rollout)
        ("actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "(e.g. 3)"),
        (
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "a divisor of 6",
        ),
    ],
)
def test_batch_sizes_that_do_not_divide_fail_before_ray(change, setting, fix):
    base = ["data.train_batch_size=6", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=3"]
    message = _fails_before_workers(_with(*base, change))
    assert message.startswith(setting) and fix in message, message


# ------------------------------------------------------------------ data files, read before Ray
def _parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def test_a_train_file_without_the_prompt_column_fails_before_ray(tmp_path):
    train = _parquet(tmp_path / "train.parquet", [{"question": "1+1?", "data_source": "openai/gsm8k"}])
    message = _fails_before_workers(_with(f"data.train_files={train}"))
    assert message.startswith(f"data.train_files: {train} has no 'prompt' column") and "data.prompt_key" in message


def test_empty_prompts_are_counted_and_fail_before_ray(tmp_path):
    good = [{"role": "user", "content": "What is 2 + 3?"}]
    rows = [{"prompt": good}, {"prompt": [{"role": "user", "content": "  "}]}, {"prompt": good}, {"prompt": []}]
    val = _parquet(tmp_path / "val.parquet", rows)
    message = _fails_before_workers(_with(f"data.val_files={val}"))
    assert message.startswith(f"{val}: 2 of 4 rows have an empty 'prompt' (first: row 1)") and "Fix" in message


def test_overlong_prompts_kept_by_the_filter_setting_fail_before_ray(tiny_model_dir, tmp_path):
    model = tiny_model_dir
    rows = [
        {"prompt": [{"role": "user", "content": "short"}]},
        {"prompt": [{"role": "user", "content": "long " * 200}]},
    ]
    train = _parquet(tmp_path / "train.parquet", rows)
    base = _with(f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", "data.max_prompt_length=64")
    message = _fails_before_workers(base + ["data.filter_overlong_prompts=false"])
    assert "1 prompt(s) are longer than data.max_prompt_length=64" in message and "first: row 1" in message
    assert "Fix: set data.filter_overlong_prompts=true" in message
    validate_remote_backend_config(compose(base + ["data.filter_overlong_prompts=true"]))  # verl filters them itself


def test_local_engine_on_cuda_without_a_gpu_fails_before_ray_instead_of_waiting():
    import torch

    if torch.cuda.device_count() > 0:
        pytest.skip("this machine has a GPU: device=cuda is valid here")
    message = _fails_before_workers(_with("remote_backend.local.device=cuda"))
    assert message.startswith("remote_backend.local.device='cuda': this machine has no visible CUDA GPU")
    assert "Fix: set remote_backend.local.device=cpu" in message
    # joining an existing cluster: its GPUs may be elsewhere, so this check stays out of the way
    validate_remote_backend_config(
        compose(_with("remote_backend.local.device=cuda", "+ray_kwargs.ray_init.address=auto"))
    )


# --------------------------------------------------------------------------- verl's bypass mode
_BYPASS = "algorithm.rollout_correction.bypass_mode=true"


def test_bypass_mode_is_accepted_on_the_local_engine_and_asks_the_sampler_for_log_probs():
    from verl.remote_backend.launch.derive import derive_remote_settings

    config = compose(_with(_BYPASS))
    derived = {d.key: d.after for d in derive_remote_settings(config)}
    assert derived.get("actor_rollout_ref.rollout.calculate_log_probs") is True
    assert validate_remote_backend_config(config).name == "local"
    # without the switch's help (a launcher that skips the entry point), validation names the key
    message = _refused_by_validation(_with(_BYPASS, "actor_rollout_ref.rollout.calculate_log_probs=false"))
    assert message.startswith("actor_rollout_ref.rollout.calculate_log_probs=False"), message
    with pytest.raises(ConfigError, match=r"calculate_log_probs=False was set explicitly"):
        run(compose(_with(_BYPASS, "actor_rollout_ref.rollout.calculate_log_probs=false")),
            explicit_keys={"actor_rollout_ref.rollout.calculate_log_probs"})  # fmt: skip


@pytest.mark.parametrize(
    "change, setting, needle",
    [
        ("remote_backend.local.sampler_dtype=bfloat16", "algorithm.rollout_correction.bypass_mode", "sampler_dtype"),
        ("remote_backend.local.autocast_dtype=bfloat16", "algorithm.rollout_correction.bypass_mode", "autocast"),
        ("algorithm.rollout_correction.loss_type=reinforce", "algorithm.rollout_correction.loss_type", "REINFORCE"),
        ("algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is", "weights"),
        ("algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs", "rejection"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.policy_loss.loss_mode", "gspo"),
    ],
)
def test_bypass_mode_where_it_would_change_training_is_refused_before_ray(change, setting, needle):
    message = _fails_before_workers(_with(_BYPASS, change))
    assert message.startswith(setting), message
    assert needle in message and "Fix:" in message and "bypass_mode=false" in message


def test_bypass_mode_on_a_backend_that_does_not_vouch_for_its_sampler_is_refused(no_resume_backend):
    message = _fails_before_workers(_with(f"trainer.remote_backend={no_resume_backend}", _BYPASS))
    assert message.startswith("algorithm.rollout_correction.bypass_mode=True"), message
    assert "does not declare that its sampler's log-probs equal its trainer's" in message
