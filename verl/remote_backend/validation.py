"""One place that decides whether a composed config can run on a remote backend.

:func:`validate_remote_backend_config` is called by the entry point on the Ray
driver *before* ``ray.init`` and again by :class:`RemoteBackendTrainer` before
it creates the backend, so a bad setting fails in seconds, before any worker,
placement group or engine starts. Every error is a :class:`RemoteBackendConfigError`
whose message names the offending setting, its value and the fix.

The checks are pure functions of the config (plus, for resume, a look at the
checkpoint directory); none imports Ray or starts anything. Extend this module
(not the trainer) when a new rule is needed.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from verl.remote_backend.base import RemoteBackend, requires_single_forwarder, supports_resume
from verl.remote_backend.checkpoints import checkpoint_problem, resume_failure, step_of, tracker_target_problem
from verl.remote_backend.data_checks import DataFileError, check_data_files
from verl.remote_backend.registry import RemoteBackendRegistry
from verl.remote_backend.reliability import ReliabilitySettings

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = [
    "RemoteBackendConfigError",
    "RemoteRunPlan",
    "backend_name",
    "validate_remote_backend_config",
    "required_ray_cpus",
    "REMOTE_ROLLOUT_NAME",
]

#: Rollout name of the replica that forwards ``generate`` to a remote backend.
REMOTE_ROLLOUT_NAME = "remote"

# Logical Ray CPUs the runner itself holds (verl's TaskRunner asks for one).
_RUNNER_CPUS = 1
# Logical CPUs each forwarder's placement-group bundle reserves (see CPUResourcePoolManager).
FORWARDER_CPUS = 1


class RemoteBackendConfigError(ValueError):
    """A setting that cannot work with ``trainer.remote_backend``; the message names it and the fix."""


@dataclass(frozen=True)
class RemoteRunPlan:
    """What a valid config resolves to (used by the trainer and the entry point)."""

    backend_cls: type[RemoteBackend]
    name: str
    num_forwarders: int
    num_replicas: int
    resume_from: Optional[str]


def backend_name(config: "DictConfig") -> Optional[str]:
    """``trainer.remote_backend``, or ``None`` when unset/null (verl's own path)."""
    trainer = config.get("trainer") or {}
    name = trainer.get("remote_backend") if hasattr(trainer, "get") else None
    if name in (None, "", "null", "None"):
        return None
    return str(name)


def required_ray_cpus(config: "DictConfig") -> int:
    """Logical Ray CPUs the runner and the forwarder pool reserve (a backend's own actors come on top)."""
    return _RUNNER_CPUS + FORWARDER_CPUS * _num_forwarders(config)


def _num_forwarders(config: "DictConfig") -> int:
    return int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)


def _fail(setting: str, value: Any, problem: str, fix: str) -> RemoteBackendConfigError:
    return RemoteBackendConfigError(f"{setting}={value!r}: {problem}. Fix: {fix}")


def check_single_forwarder(name: str, single: bool, config: "DictConfig") -> None:
    """Raise when a backend that owns its parallelism would get more than one forwarder."""
    n = _num_forwarders(config)
    if single and n != 1:
        raise _fail(
            "trainer.n_gpus_per_node * trainer.nnodes",
            f"{config.trainer.n_gpus_per_node} * {config.trainer.nnodes}",
            f"backend {name!r} owns all of its parallelism and needs exactly one CPU forwarder, "
            f"but this asks for {n}",
            "set trainer.n_gpus_per_node=1 trainer.nnodes=1 (the backend's own GPUs are set under "
            f"remote_backend.{name}.*)",
        )


def _find_resume_checkpoint(config: "DictConfig") -> Optional[str]:
    """The checkpoint folder verl's ``_load_checkpoint`` would load, or ``None``.

    Raises ``ResumeCheckpointError`` when verl's tracker names a step whose folder
    is gone: verl would then start from scratch without a word.
    """
    mode = config.trainer.get("resume_mode", "auto")
    if mode == "disable":
        return None
    if mode == "resume_path":
        return str(config.trainer.get("resume_from_path"))
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    folder = config.trainer.default_local_dir
    if not os.path.isabs(folder):
        folder = os.path.join(os.getcwd(), folder)
    missing = tracker_target_problem(folder)
    if missing is not None:
        raise resume_failure(os.path.join(folder, "global_step_<tracked>"), missing)
    return find_latest_ckpt_path(folder)


#: Keys of the shared ``remote_backend`` block that are not backends.
RESERVED_BLOCKS = ("timeouts", "liveness", "retry")
# "org/name" Hugging Face hub ids: the forwarder (and a server-side engine) may fetch these.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_REMOTE_PREFIXES = ("hdfs://", "s3://", "gs://", "http://", "https://")


def _check_model_path(config: "DictConfig") -> Optional[str]:
    """``actor_rollout_ref.model.path`` must be set and, when local, a model directory.

    Returns the local directory (``None`` for a hub id or a remote URI, which are
    fetched later)."""
    raw = config.actor_rollout_ref.model.get("path")
    setting = "actor_rollout_ref.model.path"
    if raw is None or not str(raw).strip():
        raise _fail(setting, raw, "no model is set", f"set {setting}=<Hugging Face model directory>")
    path = str(raw).strip()
    if path.startswith(_REMOTE_PREFIXES):
        return None
    local = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(local):
        if not os.path.isfile(os.path.join(local, "config.json")):
            raise _fail(setting, path, "the directory has no config.json, so it is not a Hugging Face model",
                        f"point {setting} at the folder holding the model's config.json")
        return local
    if _HUB_ID.match(path) and not os.path.exists(local):
        return None  # e.g. Qwen/Qwen2.5-0.5B-Instruct
    raise _fail(
        setting,
        path,
        "no such model directory",
        f"download the model first (e.g. `huggingface-cli download <repo> --local-dir <dir>`) and set {setting}=<dir>",
    )


def _model_context(local_model: Optional[str]) -> Optional[int]:
    """``max_position_embeddings`` of a local model's config.json (top level or ``text_config``)."""
    if local_model is None:
        return None
    try:
        with open(os.path.join(local_model, "config.json")) as fh:
            hf = json.load(fh)
    except (OSError, ValueError):
        return None
    for node in (hf, hf.get("text_config") or {}):
        value = node.get("max_position_embeddings") if isinstance(node, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def _check_context(config: "DictConfig", name: str, local_model: Optional[str]) -> None:
    """Prompt + response must fit the model context (and the backend's/rollout's ``max_model_len``)."""
    rollout = config.actor_rollout_ref.rollout
    limits = {}
    model_ctx = _model_context(local_model)
    if model_ctx is not None:
        limits[f"the model's max_position_embeddings ({local_model}/config.json)"] = model_ctx
    for key in ("actor_rollout_ref.rollout.max_model_len", f"remote_backend.{name}.max_model_len"):
        from omegaconf import OmegaConf

        value = OmegaConf.select(config, key, default=None)
        if isinstance(value, int) and value > 0:
            limits[key] = value
    if not limits:
        return
    source, context = min(limits.items(), key=lambda item: item[1])
    prompt, response = int(rollout.prompt_length), int(rollout.response_length)
    if response > context:
        raise _fail(
            "data.max_response_length",
            response,
            f"the response length is above the model context: {source} = {context}",
            f"set data.max_response_length <= {context} (and data.max_prompt_length + it <= {context})",
        )
    if prompt + response > context:
        raise _fail(
            "data.max_prompt_length + data.max_response_length",
            f"{prompt} + {response}",
            f"prompt + response ({prompt + response} tokens) exceed the model context: {source} = {context}",
            f"lower data.max_prompt_length / data.max_response_length so they sum to <= {context}",
        )


def _check_batch_sizes(config: "DictConfig") -> None:
    """``rollout.n`` and the PPO batch-size divisibility rules, which verl itself checks only after a rollout."""
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    n = int(rollout.get("n", 1))
    if n < 1:
        raise _fail("actor_rollout_ref.rollout.n", n, "every prompt needs at least one sampled response", "set rollout.n >= 1 (GRPO needs >= 2)")
    epochs = int(actor.get("ppo_epochs", 1))
    if epochs < 1:
        raise _fail("actor_rollout_ref.actor.ppo_epochs", epochs, "an update needs at least one pass", "set ppo_epochs >= 1")
    train = int(config.data.train_batch_size)
    mini = int(actor.ppo_mini_batch_size)
    if mini < 1 or train < mini or train % mini:
        raise _fail(
            "actor_rollout_ref.actor.ppo_mini_batch_size",
            mini,
            f"data.train_batch_size={train} prompts must split into whole PPO mini-batches of {mini} prompts",
            f"set ppo_mini_batch_size to a divisor of {train} (e.g. {_largest_divisor_at_most(train, mini)})",
        )
    micro = actor.get("ppo_micro_batch_size_per_gpu")
    if micro is not None and not actor.get("use_dynamic_bsz", False) and (mini * n) % int(micro):
        raise _fail(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
            int(micro),
            f"a mini-batch holds ppo_mini_batch_size x rollout.n = {mini * n} samples, not a multiple of it",
            f"set ppo_micro_batch_size_per_gpu to a divisor of {mini * n}",
        )


def _length_tokenizer(config: "DictConfig", local_model: Optional[str]) -> Any:
    """The model's tokenizer when prompt lengths must be checked up front (filtering off), else ``None``."""
    if local_model is None or bool(config.data.get("filter_overlong_prompts", True)):
        return None
    from transformers import AutoTokenizer

    path = config.actor_rollout_ref.model.get("tokenizer_path") or local_model
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=bool(config.data.get("trust_remote_code", False)))
    except Exception:  # no tokenizer there: verl's own loader reports it
        return None


def _largest_divisor_at_most(value: int, limit: int) -> int:
    return max(d for d in range(1, max(1, min(value, limit)) + 1) if value % d == 0)


def validate_remote_backend_config(
    config: "DictConfig", *, check_resume: bool = True, scan_files: bool = True
) -> Optional[RemoteRunPlan]:
    """Check every rule a remote-backend run depends on; return the resolved plan.

    Returns ``None`` when ``trainer.remote_backend`` is null (verl's own path,
    nothing to check). Otherwise resolves the backend class through the registry
    (unknown names and failing imports raise the registry's own errors, which
    list the known names / the install command) and checks, in order: worker
    path, device, rollout name and replica count, single-forwarder constraint,
    unsupported verl features (critic, reward model, HDFS, non-naive weight
    sync), the shared ``remote_backend.{timeouts,liveness,retry}`` block, the
    model path and that prompt + response fit the model context and, when
    ``check_resume``, that a requested resume is possible from a complete
    checkpoint (see :mod:`verl.remote_backend.checkpoints`). ``scan_files=False`` skips
    the checks that read whole files (the data files' prompts, the resume checkpoint's
    checksums): the trainer re-validates with it, after the entry point did the full pass.

    Raises:
        RemoteBackendConfigError: the first violated rule.
        ResumeCheckpointError: the checkpoint to resume from is missing or partial.
        UnknownBackendError, BackendImportError: from the registry (the latter
            with the install command of a backend's optional dependency).
    """
    name = backend_name(config)
    if name is None:
        return None
    if name in RESERVED_BLOCKS:
        raise _fail(
            "trainer.remote_backend",
            name,
            f"remote_backend.{name} holds the shared reliability settings, not a backend",
            "name a registered backend (e.g. local or arctic)",
        )
    backend_cls = RemoteBackendRegistry.get(name)
    trainer, rollout = config.trainer, config.actor_rollout_ref.rollout

    impl = trainer.get("use_legacy_worker_impl", "auto")
    if impl != "disable":
        raise _fail(
            "trainer.use_legacy_worker_impl",
            impl,
            "remote backends plug into verl's new worker path (nested-jagged TensorDict batches) only",
            "set trainer.use_legacy_worker_impl=disable",
        )
    if trainer.get("device", "cuda") != "cpu":
        raise _fail(
            "trainer.device",
            trainer.get("device"),
            "the verl side of a remote-backend run (driver and forwarders) computes nothing on an accelerator",
            f"set trainer.device=cpu; the backend's accelerators are configured under remote_backend.{name}.*",
        )

    allowed_rollout = sorted({REMOTE_ROLLOUT_NAME, name})
    if rollout.get("name") not in allowed_rollout:
        raise _fail(
            "actor_rollout_ref.rollout.name",
            rollout.get("name"),
            "generation must go through the backend's sampler",
            f"set actor_rollout_ref.rollout.name={REMOTE_ROLLOUT_NAME}",
        )
    n_fwd = _num_forwarders(config)
    if n_fwd < 1:
        raise _fail(
            "trainer.n_gpus_per_node * trainer.nnodes",
            n_fwd,
            "at least one forwarder worker is needed",
            "set trainer.n_gpus_per_node=1 trainer.nnodes=1",
        )
    per_replica = (
        int(rollout.tensor_model_parallel_size)
        * int(rollout.get("data_parallel_size", 1))
        * int(rollout.get("pipeline_model_parallel_size", 1))
    )
    num_replicas = n_fwd // per_replica
    if num_replicas == 0 or n_fwd % per_replica:
        raise _fail(
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
            int(rollout.tensor_model_parallel_size),
            f"verl builds (forwarders {n_fwd}) // (tensor * data * pipeline parallel size {per_replica}) = "
            f"{num_replicas} rollout replicas{' (not a whole number)' if n_fwd % per_replica else ''}; "
            "the backend parallelises sampling itself",
            "set actor_rollout_ref.rollout.tensor_model_parallel_size=1 (and data/pipeline_model_parallel_size=1)",
        )
    _check_batch_sizes(config)
    single = requires_single_forwarder(backend_cls)
    if single:
        check_single_forwarder(name, True, config)

    from verl.trainer.ppo.utils import need_critic

    if config.critic.get("enable") is True:
        raise _fail(
            "critic.enable",
            True,
            "remote backends do not provide a critic (value model)",
            "set critic.enable=null (or false) and use a critic-free estimator such as algorithm.adv_estimator=grpo",
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verl warns "Disabled critic ..." itself later
        critic_needed = need_critic(config)
    if critic_needed:
        raise _fail(
            "algorithm.adv_estimator",
            str(config.algorithm.adv_estimator),
            "this estimator needs a critic (value model), which remote backends do not provide",
            "use a critic-free estimator, e.g. algorithm.adv_estimator=grpo",
        )
    if config.reward.reward_model.get("enable", False):
        raise _fail(
            "reward.reward_model.enable",
            True,
            "a model-based reward needs GPU workers of verl's own, which a remote-backend run does not start",
            "set reward.reward_model.enable=false and use a rule-based or custom reward function",
        )
    ce_backend = rollout.checkpoint_engine.get("backend", "naive")
    if ce_backend != "naive":
        raise _fail(
            "actor_rollout_ref.rollout.checkpoint_engine.backend",
            ce_backend,
            "weights move inside the backend (its update_weights), not through verl's checkpoint engines",
            "set actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        )
    if trainer.get("default_hdfs_dir") is not None:
        raise _fail(
            "trainer.default_hdfs_dir",
            trainer.default_hdfs_dir,
            "remote backends write checkpoints to verl's local path only",
            "set trainer.default_hdfs_dir=null and copy trainer.default_local_dir yourself",
        )
    ray_cpus = config.get("ray_kwargs", {}).get("ray_init", {}).get("num_cpus")
    if ray_cpus is not None and float(ray_cpus) < required_ray_cpus(config):
        raise _fail(
            "ray_kwargs.ray_init.num_cpus",
            ray_cpus,
            f"the task runner and {n_fwd} forwarder(s) reserve {required_ray_cpus(config)} logical Ray CPUs "
            "(plus what the backend's own actors ask for); placement groups would wait forever",
            f"set ray_kwargs.ray_init.num_cpus to at least {required_ray_cpus(config) + 1} "
            "(logical CPUs may exceed physical cores) or leave it null",
        )

    try:
        ReliabilitySettings.from_main_config(config)
    except ValueError as exc:
        raise RemoteBackendConfigError(
            f"{exc}. Fix: see the commented remote_backend.timeouts/liveness/retry block in remote_ppo_trainer.yaml"
        ) from None
    local_model = _check_model_path(config)
    _check_context(config, name, local_model)
    if scan_files:
        try:
            check_data_files(config, tokenizer=_length_tokenizer(config, local_model))
        except DataFileError as exc:
            raise RemoteBackendConfigError(str(exc)) from None
    try:
        backend_cls.check_config(config)
    except RemoteBackendConfigError:
        raise
    except ValueError as exc:  # the backend's own rule: its message names the key and the fix
        raise RemoteBackendConfigError(str(exc)) from None

    resume_from = _find_resume_checkpoint(config) if check_resume else None
    if resume_from is not None and not supports_resume(backend_cls):
        raise _fail(
            "trainer.resume_mode",
            trainer.resume_mode,
            f"this run would resume from {resume_from}, but backend {name!r} cannot load checkpoints "
            "(it has no `async load_checkpoint(path, step)`)",
            "set trainer.resume_mode=disable to start from scratch, or point trainer.default_local_dir "
            "at an empty directory",
        )
    if resume_from is not None:
        problem = checkpoint_problem(resume_from, checksums=scan_files) or backend_cls.checkpoint_problem(
            os.path.join(resume_from, "actor"), step_of(resume_from)
        )
        if problem is not None:
            raise resume_failure(resume_from, problem)
    return RemoteRunPlan(
        backend_cls=backend_cls,
        name=name,
        num_forwarders=n_fwd,
        num_replicas=num_replicas,
        resume_from=resume_from,
    )
