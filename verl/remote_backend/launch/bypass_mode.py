"""verl's bypass mode on the remote path: skip the old-log-prob recompute only where it is provably redundant.

``algorithm.rollout_correction.bypass_mode=true`` makes verl use the sampler's log-probs
(``rollout_log_probs``) as ``old_log_probs`` instead of recomputing them with the trainer. That
changes nothing only if the two are the same computation: the backend says whether they are for
this config (``RemoteBackend.rollout_log_prob_problem``). verl's bypass also swaps the policy loss
for its ``bypass_mode`` loss in the driver's copy of the actor config, which never reaches a
forwarder: the backend applies ``actor.policy_loss.loss_mode`` as configured. So only the bypass
variant whose loss is that loss is accepted (``ppo_clip`` on ``vanilla``, no importance weights, no
rejection sampling). Every refusal runs on the driver before Ray starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from verl.remote_backend.errors import ConfigError
from verl.remote_backend.settings.loader import select

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["BYPASS_KEY", "bypass_requested", "check_bypass_mode"]

BYPASS_KEY = "algorithm.rollout_correction.bypass_mode"
_CORRECTION = "algorithm.rollout_correction"
_RECOMPUTE = f"set {BYPASS_KEY}=false (old log-probs are then recomputed by the trainer)"


def bypass_requested(config: Any) -> bool:
    """Whether the run asks verl to use the sampler's log-probs as old log-probs."""
    return bool(select(config, BYPASS_KEY, False))


def check_bypass_mode(config: "DictConfig", backend_cls: type) -> None:
    """With bypass mode on: the backend vouches that its sampler's log-probs are its trainer's,
    and the loss verl would apply is the one the backend applies.

    Raises:
        ConfigError: naming the setting that breaks the guarantee and the fix.
    """
    if not bypass_requested(config):
        return
    problem = backend_cls.rollout_log_prob_problem(config)
    if problem:
        raise ConfigError.for_setting(
            BYPASS_KEY, True, f"the sampler's log-probs are not the trainer's for this run: {problem}", _RECOMPUTE
        )
    loss_type = select(config, f"{_CORRECTION}.loss_type", "ppo_clip")
    if loss_type != "ppo_clip":
        raise ConfigError.for_setting(
            f"{_CORRECTION}.loss_type",
            loss_type,
            "the backend applies actor_rollout_ref.actor.policy_loss.loss_mode; verl's bypass-mode REINFORCE loss "
            "is set in the driver's config only and would not reach it",
            f"use ppo_clip, or {_RECOMPUTE}",
        )
    for key in ("rollout_is", "rollout_rs"):
        value = select(config, f"{_CORRECTION}.{key}")
        if value is not None:
            raise ConfigError.for_setting(
                f"{_CORRECTION}.{key}",
                value,
                "in bypass mode verl applies importance weights / rejection sampling inside its bypass_mode "
                "loss, which is set in the driver's config only: the backend would train without them",
                f"set it to null, or {_RECOMPUTE}",
            )
    loss_mode = select(config, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla")
    if loss_mode != "vanilla":
        raise ConfigError.for_setting(
            "actor_rollout_ref.actor.policy_loss.loss_mode",
            loss_mode,
            "verl's bypass mode replaces the policy loss with its ppo_clip loss (vanilla PPO), while the backend "
            f"would apply {loss_mode}",
            f"use vanilla, or {_RECOMPUTE}",
        )
