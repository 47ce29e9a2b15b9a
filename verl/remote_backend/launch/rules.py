"""The keys a remote-backend run allows one value for: one table, read by the switch and by validation.

The switch (:func:`derive_remote_settings`) sets each applicable key to its value; validation
(:func:`check_required_settings`) refuses a config in which one still differs, with the same
reason. A rule is added here once and both sides follow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.settings.loader import select
from verl.remote_backend.verl_versions import verl_glue

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = [
    "REMOTE_ROLLOUT_NAME",
    "VERL_ROLLOUT_ENGINES",
    "RequiredSetting",
    "required_settings",
    "check_required_settings",
]

#: Rollout name of the replica that forwards ``generate`` to a remote backend.
REMOTE_ROLLOUT_NAME = "remote"

#: verl's own rollout engines: a value naming one describes the engine the backend replaces.
VERL_ROLLOUT_ENGINES = frozenset({"vllm", "sglang", "hf", "trtllm", "naive", "???"})

_PARALLEL_SIZES = (
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.data_parallel_size",
    "actor_rollout_ref.rollout.pipeline_model_parallel_size",
)


def _never(_value: Any) -> bool:
    return False


@dataclass(frozen=True)
class RequiredSetting:
    """One key of verl's config with the value a remote-backend run needs.

    ``also_accepted``: other values that are just as valid (the rollout may be named after the
    backend). ``refuse_explicit(value)``: an explicit command-line value the switch must not
    overwrite silently, because the user asked for something the remote path cannot do.
    """

    key: str
    value: Any
    reason: str
    also_accepted: frozenset = frozenset()
    refuse_explicit: Callable[[Any], bool] = field(default=_never, compare=False)

    def accepts(self, current: Any) -> bool:
        """Whether ``current`` already satisfies the rule."""
        return current == self.value or current in self.also_accepted

    def fix(self) -> str:
        """What validation tells the user to do."""
        return f"set {self.key}={self.value}"


def required_settings(config: "DictConfig", name: str, single_forwarder: bool) -> list[RequiredSetting]:
    """The rules that apply to ``config`` for backend ``name``, in the order they are reported.

    ``single_forwarder``: the backend owns its parallelism (``requires_single_forwarder``), so
    the forwarder count (``n_gpus_per_node * nnodes``) must be one.
    """
    # The installed release's own keys first (verl_versions/: 0.7.1's worker path, 0.9.1's trainer).
    rules = [
        RequiredSetting(key, value, reason, refuse_explicit=lambda v, refused=refused: v in refused)
        for key, value, reason, refused in verl_glue().RELEASE_REQUIRED_SETTINGS
        if select(config, key) is not None
    ]
    rules += [
        RequiredSetting(
            "trainer.device",
            "cpu",
            "the verl side (driver, forwarders) computes nothing on an accelerator; the backend owns "
            f"its devices (remote_backend.{name}.*)",
            refuse_explicit=lambda v: v in ("cuda", "npu"),
        ),
        RequiredSetting(
            "actor_rollout_ref.rollout.name",
            REMOTE_ROLLOUT_NAME,
            "generation goes through the backend's sampler, not a rollout engine of verl's",
            also_accepted=frozenset({name}),
            refuse_explicit=lambda v: v is not None and v not in VERL_ROLLOUT_ENGINES,
        ),
    ]
    rules += [
        RequiredSetting(key, 1, "the backend parallelises sampling itself (one rollout replica per forwarder)")
        for key in _PARALLEL_SIZES
        if select(config, key) is not None
    ]
    if select(config, "algorithm.rollout_correction.bypass_mode", False):
        rules.append(
            RequiredSetting(
                "actor_rollout_ref.rollout.calculate_log_probs",
                True,
                "algorithm.rollout_correction.bypass_mode=true uses the sampler's log-probs as old log-probs",
                refuse_explicit=lambda v: v is False,
            )
        )
    if single_forwarder:
        reason = (
            f"backend {name!r} owns its parallelism: exactly one CPU forwarder (its devices: remote_backend.{name}.*)"
        )
        rules += [RequiredSetting("trainer.n_gpus_per_node", 1, reason), RequiredSetting("trainer.nnodes", 1, reason)]
    return rules


def check_required_settings(config: "DictConfig", name: str, single_forwarder: bool) -> None:
    """Raise :class:`ConfigError` for the first rule ``config`` breaks (the entry point's switch
    sets them all; this catches configs that bypass it or change a key afterwards)."""
    for rule in required_settings(config, name, single_forwarder):
        current = select(config, rule.key)
        if not rule.accepts(current):
            raise ConfigError.for_setting(rule.key, current, rule.reason, rule.fix())
