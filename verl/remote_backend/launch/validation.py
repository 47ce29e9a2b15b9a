"""Whether a composed config can run on a remote backend: one small function per rule.

:func:`validate_remote_backend_config` runs the rules in order on the Ray driver, before
``ray.init`` (entry point) and again before the trainer creates the backend, so a bad
setting fails in seconds. Each rule is a pure function of the config (the resume rule also
looks at the checkpoint) raising :class:`ConfigError` naming the setting, its value and
the fix. Add a rule here (not in the trainer) and call it from the runner.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from verl.remote_backend.base import RemoteBackend, requires_single_forwarder, supports_resume
from verl.remote_backend.checkpoints import check_resume_checkpoint, select_resume_checkpoint
from verl.remote_backend.errors import ConfigError
from verl.remote_backend.launch.backend_keys import SHARED_BLOCKS, check_no_stray_backend_keys
from verl.remote_backend.launch.bypass_mode import check_bypass_mode
from verl.remote_backend.launch.data_checks import check_data_files
from verl.remote_backend.launch.rules import check_required_settings
from verl.remote_backend.registry import RemoteBackendRegistry
from verl.remote_backend.reliability.policy import ReliabilitySettings
from verl.remote_backend.settings.loader import select
from verl.remote_backend.settings.verl_config import local_model_dir
from verl.remote_backend.verl_versions import verl_glue

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = [
    "RemoteRunPlan",
    "backend_name",
    "validate_remote_backend_config",
    "required_ray_cpus",
    "RESERVED_BLOCKS",
]

#: Keys of the shared ``remote_backend`` block that are not backends.
RESERVED_BLOCKS = SHARED_BLOCKS

# Logical Ray CPUs the runner itself holds (verl's TaskRunner asks for one).
_RUNNER_CPUS = 1
# Logical CPUs each forwarder's placement-group bundle reserves (see CPUResourcePoolManager).
FORWARDER_CPUS = 1

_fail = ConfigError.for_setting


@dataclass(frozen=True)
class RemoteRunPlan:
    """What a valid config resolves to (used by the trainer and the entry point)."""

    backend_cls: type[RemoteBackend]
    name: str
    num_forwarders: int
    num_replicas: int
    resume_from: Optional[str]


def validate_remote_backend_config(
    config: "DictConfig", *, check_resume: bool = True, scan_files: bool = True
) -> Optional[RemoteRunPlan]:
    """Check every rule a remote-backend run depends on, in order; return the resolved plan.

    Returns ``None`` when ``trainer.remote_backend`` is null (verl's own path, nothing to
    check). ``check_resume=False`` skips the resume rule; ``scan_files=False`` skips the
    rules that read whole files (the data files' prompts, the backend's check of its
    checkpoint files): the trainer re-validates with it, after the entry point's full pass.

    Raises:
        ConfigError: the first violated rule.
        ResumeCheckpointError: the checkpoint to resume from is missing or partial.
        UnknownBackendError, BackendImportError: from the registry (the latter
            with the install command of a backend's optional dependency).
    """
    name = backend_name(config)
    if name is None:
        return None
    check_backend_name(name)
    backend_cls = RemoteBackendRegistry.get(name)
    check_no_stray_backend_keys(config, name, backend_cls)
    check_required_settings(config, name, requires_single_forwarder(backend_cls))
    verl_glue().check_release_settings(config)
    check_forwarder_count(config)
    check_batch_sizes(config)
    check_no_critic(config)
    check_no_reward_model(config)
    check_checkpoint_engine(config)
    check_no_hdfs(config)
    check_ray_cpus(config)
    ReliabilitySettings.from_main_config(config)  # remote_backend.{timeouts, liveness, retry}
    local_model = local_model_dir(config)
    check_context(config, name, local_model)
    if scan_files:
        check_data_files(config, tokenizer=_length_tokenizer(config, local_model))
    check_backend_rules(backend_cls, config)
    check_bypass_mode(config, backend_cls)
    resume_from = resume_checkpoint(config, name, backend_cls, verify_files=scan_files) if check_resume else None
    return RemoteRunPlan(
        backend_cls=backend_cls,
        name=name,
        num_forwarders=_num_forwarders(config),
        num_replicas=_num_forwarders(config),  # one replica per forwarder: the rollout parallel sizes are 1
        resume_from=resume_from,
    )


def backend_name(config: "DictConfig") -> Optional[str]:
    """``trainer.remote_backend``, or ``None`` when unset/null (verl's own path)."""
    name = select(config, "trainer.remote_backend")
    if name in (None, "", "null", "None"):
        return None
    return str(name)


def backend_class_or_none(name: Optional[str]) -> Optional[type[RemoteBackend]]:
    """The class registered as ``name``, or ``None`` when ``name`` is ``None`` or nothing usable
    provides it: for start-up steps that run before validation, which reports the name with the
    known ones and the fix."""
    if name is None:
        return None
    try:
        return RemoteBackendRegistry.get(name)
    except Exception:  # noqa: BLE001 - validate_remote_backend_config raises it, named
        return None


def required_ray_cpus(config: "DictConfig") -> int:
    """Logical Ray CPUs the runner, the forwarder pool and (verl 0.9.1's V1 trainer) TransferQueue's
    actors reserve (a backend's own actors come on top)."""
    return _RUNNER_CPUS + FORWARDER_CPUS * _num_forwarders(config) + verl_glue().transfer_queue_cpus(config)


def _num_forwarders(config: "DictConfig") -> int:
    return int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)


# ---------------------------------------------------------------- the rules, in the order they run
def check_backend_name(name: str) -> None:
    """``trainer.remote_backend`` must not name one of the shared (non-backend) blocks."""
    if name in RESERVED_BLOCKS:
        raise _fail(
            "trainer.remote_backend",
            name,
            f"remote_backend.{name} holds the shared reliability settings, not a backend",
            "name a registered backend (e.g. local or arctic)",
        )


def check_forwarder_count(config: "DictConfig") -> None:
    """At least one forwarder worker (``n_gpus_per_node * nnodes`` of them)."""
    n_fwd = _num_forwarders(config)
    if n_fwd < 1:
        raise _fail(
            "trainer.n_gpus_per_node * trainer.nnodes",
            n_fwd,
            "at least one forwarder worker is needed",
            "set trainer.n_gpus_per_node=1 trainer.nnodes=1",
        )


def check_batch_sizes(config: "DictConfig") -> None:
    """``rollout.n`` and the PPO batch-size divisibility rules, which verl itself checks only after a rollout."""
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    n = int(rollout.get("n", 1))
    if n < 1:
        raise _fail(
            "actor_rollout_ref.rollout.n",
            n,
            "every prompt needs at least one sampled response",
            "set rollout.n >= 1 (GRPO needs >= 2)",
        )
    epochs = int(actor.get("ppo_epochs", 1))
    if epochs < 1:
        raise _fail(
            "actor_rollout_ref.actor.ppo_epochs", epochs, "an update needs at least one pass", "set ppo_epochs >= 1"
        )
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


def check_no_critic(config: "DictConfig") -> None:
    """Remote backends provide no critic: neither ``critic.enable`` nor an estimator that needs one."""
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


def check_no_reward_model(config: "DictConfig") -> None:
    """A model-based reward needs verl's own GPU workers, which a remote-backend run does not start."""
    if config.reward.reward_model.get("enable", False):
        raise _fail(
            "reward.reward_model.enable",
            True,
            "a model-based reward needs GPU workers of verl's own, which a remote-backend run does not start",
            "set reward.reward_model.enable=false and use a rule-based or custom reward function",
        )


def check_checkpoint_engine(config: "DictConfig") -> None:
    """Weights move inside the backend: verl's checkpoint engine must be the no-op ``naive`` one."""
    ce_backend = config.actor_rollout_ref.rollout.checkpoint_engine.get("backend", "naive")
    if ce_backend != "naive":
        raise _fail(
            "actor_rollout_ref.rollout.checkpoint_engine.backend",
            ce_backend,
            "weights move inside the backend (its update_weights), not through verl's checkpoint engines",
            "set actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        )


def check_no_hdfs(config: "DictConfig") -> None:
    """Checkpoints go to verl's local path only."""
    hdfs = config.trainer.get("default_hdfs_dir")
    if hdfs is not None:
        raise _fail(
            "trainer.default_hdfs_dir",
            hdfs,
            "remote backends write checkpoints to verl's local path only",
            "set trainer.default_hdfs_dir=null and copy trainer.default_local_dir yourself",
        )


def check_ray_cpus(config: "DictConfig") -> None:
    """An explicit ``ray_init.num_cpus`` must cover the runner and the forwarders' bundles."""
    ray_cpus = select(config, "ray_kwargs.ray_init.num_cpus")
    needed = required_ray_cpus(config)
    if ray_cpus is not None and float(ray_cpus) < needed:
        raise _fail(
            "ray_kwargs.ray_init.num_cpus",
            ray_cpus,
            f"the task runner, {_num_forwarders(config)} forwarder(s) and TransferQueue's actors (verl 0.9.1's "
            f"V1 trainer) reserve {needed} logical Ray CPUs (plus what the backend's own actors ask for); "
            "placement groups would wait forever",
            f"set ray_kwargs.ray_init.num_cpus to at least {needed + 1} "
            "(logical CPUs may exceed physical cores) or leave it null",
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


def check_context(config: "DictConfig", name: str, local_model: Optional[str]) -> None:
    """Prompt + response must fit the model context (and the backend's/rollout's ``max_model_len``)."""
    rollout = config.actor_rollout_ref.rollout
    limits = {}
    model_ctx = _model_context(local_model)
    if model_ctx is not None:
        limits[f"the model's max_position_embeddings ({local_model}/config.json)"] = model_ctx
    for key in ("actor_rollout_ref.rollout.max_model_len", f"remote_backend.{name}.max_model_len"):
        value = select(config, key)
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


def check_backend_rules(backend_cls: type[RemoteBackend], config: "DictConfig") -> None:
    """The backend's own ``check_config`` (its message names the key and the fix)."""
    try:
        backend_cls.check_config(config)
    except ConfigError:
        raise
    except ValueError as exc:  # a backend's plain ValueError: same contract, one error class
        raise ConfigError(str(exc)) from None


def resume_checkpoint(
    config: "DictConfig", name: str, backend_cls: type[RemoteBackend], *, verify_files: bool = True
) -> Optional[str]:
    """The checkpoint the run would resume from (``None``: starts from scratch), after checking it.

    The backend must be able to load checkpoints, and the checkpoint must be complete:
    verl's part always, the backend's own files (its ``checkpoint_problem``) when
    ``verify_files``.

    Raises:
        ConfigError: a resume with a backend that has no ``load_checkpoint``.
        ResumeCheckpointError: the checkpoint is missing, partial or corrupt.
    """
    trainer = config.trainer
    resume_from = select_resume_checkpoint(
        str(trainer.get("resume_mode", "auto")), trainer.get("resume_from_path"), str(trainer.default_local_dir)
    )
    if resume_from is None:
        return None
    if not supports_resume(backend_cls):
        raise _fail(
            "trainer.resume_mode",
            trainer.resume_mode,
            f"this run would resume from {resume_from}, but backend {name!r} cannot load checkpoints "
            "(it has no `async load_checkpoint(path, step)`)",
            "set trainer.resume_mode=disable to start from scratch, or point trainer.default_local_dir "
            "at an empty directory",
        )
    format_problem = backend_cls.checkpoint_problem if verify_files else None
    check_resume_checkpoint(resume_from, format_problem=format_problem)
    return resume_from


# ---------------------------------------------------------------- helpers
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
