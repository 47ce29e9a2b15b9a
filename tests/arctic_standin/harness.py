"""Test helpers: start the stand-in server, compose a verl config, build verl-shaped batches."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import torch
import yaml
from support.ports import free_port  # noqa: F401 - re-exported: the stand-in's tests and workers take it from here

SERVER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "server.py")
ARCTIC_YAML = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "verl", "remote_backend", "config", "backend", "arctic.yaml",
)  # fmt: skip


def standin_command() -> list[str]:
    """argv prefix that starts the stand-in like ``python -m arctic_platform.common.http_server``."""
    return [sys.executable, SERVER_PATH]


def start_standin(port: int, log_dir: str, *, training_gpus=1, sampling_gpus=1, log_prob_gpus=0, colocate=True):
    """Launch the stand-in with the adapter's own launcher; returns its ``ServerProcess``."""
    from verl.workers.remote_client.arctic.launcher import launch_server

    return launch_server(
        host="127.0.0.1",
        port=port,
        training_gpus=training_gpus,
        sampling_gpus=sampling_gpus,
        log_prob_gpus=log_prob_gpus,
        colocate=colocate,
        command=standin_command(),
        startup_timeout_s=120,
        log_dir=log_dir,
    )


def compose_config(model_path: str, ckpt_dir: str, port: int, overrides: Optional[list[str]] = None) -> Any:
    """verl's ppo_trainer config + our arctic.yaml under remote_backend.arctic, with ``overrides``."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf, open_dict

    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        cfg = compose("ppo_trainer")
    with open_dict(cfg):
        cfg.remote_backend = {"arctic": OmegaConf.load(ARCTIC_YAML)}
        cfg.trainer.remote_backend = "arctic"
    base = [
        f"actor_rollout_ref.model.path={model_path}",
        f"trainer.default_local_dir={ckpt_dir}",
        "data.train_batch_size=4",
        "data.max_prompt_length=16",
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.use_kl_loss=false",
        f"remote_backend.arctic.port={port}",
        "remote_backend.arctic.device.type=cpu",
        "remote_backend.arctic.connect_timeout_s=5",
    ]
    for item in base + list(overrides or []):
        key, value = item.split("=", 1)
        with open_dict(cfg):
            OmegaConf.update(cfg, key, yaml.safe_load(value), merge=True)
    return cfg


#: 8 rows (4 prompts x rollout.n 2) of mixed prompt and response lengths, widths 6 + 5: the
#: layout of the parity and side-by-side batches (``make_batch(**EIGHT_ROWS, ...)``).
EIGHT_ROWS = dict(
    prompt_lens=[3, 6, 2, 5, 4, 6, 3, 1], response_lens=[4, 1, 5, 3, 5, 2, 5, 4], prompt_width=6, response_width=5
)

#: 4 rows of mixed prompt and response lengths, widths 6 + 5: the adapter tests' batches, over
#: HTTP and over Ray alike (``make_batch(**FOUR_ROWS, ...)``).
FOUR_ROWS = dict(prompt_lens=[3, 6, 2, 5], response_lens=[4, 1, 5, 3], prompt_width=6, response_width=5)


def make_batch(
    *,
    prompt_lens: list[int],
    response_lens: list[int],
    prompt_width: int,
    response_width: int,
    vocab: int,
    pad_token_id: int,
    seed: int = 0,
    with_update_fields: bool = False,
) -> Any:
    """A TensorDict laid out exactly as verl's trainer sends it (``left_right_2_no_padding``)."""
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(seed)
    b = len(prompt_lens)
    prompts = torch.full((b, prompt_width), pad_token_id, dtype=torch.long)
    responses = torch.full((b, response_width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((b, prompt_width + response_width), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        prompts[i, prompt_width - p :] = torch.randint(3, vocab, (p,), generator=g)
        responses[i, :r] = torch.randint(3, vocab, (r,), generator=g)
        mask[i, prompt_width - p : prompt_width + r] = 1
    input_ids = torch.cat([prompts, responses], dim=1)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0) * mask
    response_mask = mask[:, prompt_width:].clone()
    # What verl's left_right_2_no_padding makes (it needs flash_attn, absent on CPU machines).
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), mask.sum(-1).cumsum(0)])
    bool_mask = mask.bool()
    tensors = {
        "input_ids": torch.nested.nested_tensor_from_jagged(input_ids[bool_mask], offsets),
        "position_ids": torch.nested.nested_tensor_from_jagged(position_ids[bool_mask], offsets),
        "attention_mask": mask,
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
    }
    if with_update_fields:
        tensors["advantages"] = torch.randn((b, response_width), generator=g) * response_mask
        tensors["old_log_probs"] = (-torch.rand((b, response_width), generator=g) * 3) * response_mask
        tensors["ref_log_prob"] = (-torch.rand((b, response_width), generator=g) * 3) * response_mask
    td = tu.get_tensordict(tensors)
    tu.assign_non_tensor(td, max_seq_len=prompt_width + response_width, max_response_len=response_width)
    return td


def mid_call_batch(cfg):
    """2 rows for ``compute_log_prob`` (no entropy, temperature 1) in the tokenizer of ``cfg``'s model:
    the batch the fault tests call with while they kill or freeze the server."""
    from transformers import AutoTokenizer

    from verl.utils import tensordict_utils as tu

    tok = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)
    data = make_batch(prompt_lens=[3, 6], response_lens=[4, 2], prompt_width=6, response_width=4, vocab=len(tok),
                      pad_token_id=tok.pad_token_id)  # fmt: skip
    tu.assign_non_tensor(data, calculate_entropy=False, temperature=1.0)
    return data
