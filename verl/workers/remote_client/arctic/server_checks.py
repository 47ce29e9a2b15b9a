"""Settings Arctic RL 0.1.4's server would fail on after the first rollout, or silently train wrongly: refused up front.

Each rule names the key, the value, what the server does with it (with where in arctic-platform) and the fix.
:func:`server_problems` is called by ``ArcticBackend.check_config`` before Ray starts; nothing here talks to a
server or imports ``arctic_platform`` at module level.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Optional

from verl.remote_backend.settings.loader import select
from verl.remote_backend.settings.verl_config import model_path
from verl.workers.remote_client.arctic.config import CONFIG_KEY, ArcticConfig

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["server_problems", "FLASH_ATTENTION_KINDS", "zorro_model_types"]

#: attn_implementation values whose varlen kernel keeps packed sequences apart (Arctic packs each micro-batch
#: into one row ``[1, T]`` and passes an all-ones mask; any other kernel lets sequences attend to each other).
FLASH_ATTENTION_KINDS = ("flash_attention_2", "flash_attention_3")


def zorro_model_types() -> tuple[set[str], dict[str, str]]:
    """ZoRRo Train's supported ``model_type`` values and aliases, read from Arctic's own patcher."""
    from arctic_platform.rl.zorro_train import qwen_model_patcher

    return set(qwen_model_patcher.SUPPORTED_MODEL_TYPES), dict(qwen_model_patcher.MODEL_TYPE_ALIASES)


def _model_type(main_config: "DictConfig") -> Optional[str]:
    path = os.path.join(str(model_path(main_config)), "config.json")
    try:
        with open(path) as fh:
            return json.load(fh).get("model_type")
    except (OSError, ValueError):
        return None  # a hub id: the server resolves it; nothing to check offline


def server_problems(main_config: "DictConfig", arctic: ArcticConfig) -> list[str]:
    """One message per setting Arctic's server cannot run as verl means it; empty when none."""
    problems: list[str] = []
    p, model = CONFIG_KEY, "actor_rollout_ref.model"

    lora_rank = int(select(main_config, f"{model}.lora_rank", 0) or 0)
    if lora_rank > 0:
        problems.append(
            f"{model}.lora_rank={lora_rank}: Arctic RL's on-prem server trains every weight (it has no LoRA), so the "
            "run would be full fine-tuning at a LoRA learning rate, and verl's no-adapter reference call would go to "
            f"the log-prob job. Fix: set {model}.lora_rank=0 (and a full fine-tuning optim.lr)"
        )

    attn = select(main_config, f"{model}.override_config.attn_implementation", None)
    attn = (arctic.ds_worker or {}).get("attn_implementation", attn)
    if attn is not None and attn not in FLASH_ATTENTION_KINDS:
        problems.append(
            f"attn_implementation={attn!r} ({model}.override_config.attn_implementation or {p}.ds_worker): "
            "Arctic packs "
            "each micro-batch into one row with an all-ones attention mask, which only flash-attention's varlen "
            "kernel splits at the sequence boundaries; with this kernel every sequence attends to the ones before it. "
            f"Fix: use one of {list(FLASH_ATTENTION_KINDS)} (the default), or unset it"
        )

    if arctic.zorro.train:
        model_type = _model_type(main_config)
        if model_type is not None:
            supported, aliases = zorro_model_types()
            if aliases.get(model_type, model_type) not in supported:
                problems.append(
                    f"{p}.zorro.train=true with a model of model_type={model_type!r}: ZoRRo Train's patched forward "
                    f"supports {sorted(supported)} only (Arctic's qwen_model_patcher refuses it at /initialize). "
                    f"Fix: set {p}.zorro.train=false, or train a Qwen3-family model"
                )

    if arctic.zorro.load_balancer:
        problems += _load_balancer_problems(main_config, arctic)
    return problems


def _load_balancer_problems(main_config: "DictConfig", arctic: ArcticConfig) -> list[str]:
    """What Arctic's load balancer (``rl/zorro_train/seqlen_balancing.py``, run on every forward) raises on."""
    p, actor, rollout = CONFIG_KEY, "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    n = int(select(main_config, f"{rollout}.n", 1))
    group = int(arctic.zorro.max_rollouts or n)
    prompt = int(select(main_config, "data.max_prompt_length", 512))
    response = int(
        select(main_config, f"{rollout}.response_length", None) or select(main_config, "data.max_response_length", 512)
    )
    budget = int(select(main_config, f"{actor}.ppo_max_token_len_per_gpu", 16384))
    problems = []
    need = prompt + response * group
    if budget < need:
        problems.append(
            f"{actor}.ppo_max_token_len_per_gpu={budget}: Arctic's load balancer ({p}.zorro.load_balancer=true) needs "
            f"at least max_prompt_length + response_length x group = {prompt} + {response} x {group} = {need} tokens "
            f"per GPU and raises on every request otherwise. Fix: raise it to >= {need}, lower {p}.zorro.max_rollouts "
            f"(now {group}), or set {p}.zorro.load_balancer=false"
        )
    gpus = int(arctic.training_gpus)
    mini_rows = int(select(main_config, f"{actor}.ppo_mini_batch_size", 1)) * n
    if gpus > 1 and (n % group != 0 or (mini_rows // gpus) % group != 0 or mini_rows % gpus != 0):
        problems.append(
            f"{p}.training_gpus={gpus} with {actor}.ppo_mini_batch_size x rollout.n = {mini_rows} rows per optimizer "
            f"step and groups of {group} rows: Arctic's load balancer gives each GPU the same number of rows and "
            "keeps a group on one GPU, so rows per GPU must be a multiple of the group size (it raises otherwise). "
            f"Fix: make ppo_mini_batch_size x rollout.n / training_gpus a multiple of {group}, or set "
            f"{p}.zorro.load_balancer=false"
        )
    return problems
