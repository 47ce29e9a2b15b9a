"""Shared helpers for the local-backend tests: the tiny model and verl-shaped batches.

Batches are built the way verl's trainer builds them for
``use_legacy_worker_impl=disable``: a dense, padded rollout batch (prompts
left-padded, responses right-padded) turned into the no-padding layout by
verl's own ``left_right_2_no_padding``, with its flash-attn helpers swapped for
transformers' pure-torch equivalents (flash_attn does not exist on CPU).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Sequence

import pytest
import torch
from tensordict import TensorDict

PAD_ID = 0


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from verl.remote_backend.testing.tiny_model import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("local_backend_tiny")))


async def engine_info(backend: Any) -> dict[str, Any]:
    """The local engine actor's live status (pid, global_step, policy_version, batches_run, ...)."""
    return await backend.reconnect_handle()["actor"].info.remote()


@contextlib.contextmanager
def cpu_attention_helpers() -> Iterator[None]:
    """Route verl.utils.attention_utils to transformers' pure-torch pad/unpad helpers."""
    import verl.utils.attention_utils as au
    from transformers.modeling_flash_attention_utils import _index_first_axis, _pad_input, _unpad_input

    original = au._get_attention_functions
    au._get_attention_functions = lambda: (_index_first_axis, _pad_input, None, _unpad_input)
    try:
        yield
    finally:
        au._get_attention_functions = original


def dense_rollout_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    prompt_width: Optional[int] = None,
    response_width: Optional[int] = None,
    extra: Optional[dict[str, torch.Tensor]] = None,
) -> TensorDict:
    """The padded rollout batch verl holds after generation (``DataProto.to_tensordict()`` shape)."""
    b = len(prompts)
    p = prompt_width or max(len(x) for x in prompts)
    r = response_width or max(len(x) for x in responses)
    prompt_ids = torch.full((b, p), PAD_ID, dtype=torch.long)
    response_ids = torch.full((b, r), PAD_ID, dtype=torch.long)
    attn = torch.zeros((b, p + r), dtype=torch.long)
    for i, (pr, rs) in enumerate(zip(prompts, responses)):
        prompt_ids[i, p - len(pr) :] = torch.tensor(pr)
        response_ids[i, : len(rs)] = torch.tensor(rs)
        attn[i, p - len(pr) : p + len(rs)] = 1
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    td = TensorDict(
        {
            "prompts": prompt_ids,
            "responses": response_ids,
            "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
            "attention_mask": attn,
            "position_ids": position_ids,
            "response_mask": attn[:, p:].clone(),
            **(extra or {}),
        },
        batch_size=[b],
    )
    return td


def to_no_padding(dense: TensorDict, **non_tensor: Any) -> TensorDict:
    """verl's ``left_right_2_no_padding`` (on a copy) plus ``tu.assign_non_tensor(**non_tensor)``."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    with cpu_attention_helpers():
        td = left_right_2_no_padding(dense.clone())
    if non_tensor:
        tu.assign_non_tensor(td, **non_tensor)
    return td


def random_rollouts(
    n: int, *, seed: int, vocab: int = 500, prompt_len: tuple[int, int] = (3, 9), response_len: tuple[int, int] = (2, 10)
) -> tuple[list[list[int]], list[list[int]]]:
    """Random prompts/responses of varied lengths (token ids >= 3 avoid the special tokens)."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(n):
        lp = int(torch.randint(prompt_len[0], prompt_len[1] + 1, (1,), generator=g))
        lr = int(torch.randint(response_len[0], response_len[1] + 1, (1,), generator=g))
        prompts.append(torch.randint(3, vocab, (lp,), generator=g).tolist())
        responses.append(torch.randint(3, vocab, (lr,), generator=g).tolist())
    return prompts, responses


def engine_settings(model_dir: str, **overrides: Any):
    from verl.workers.remote_client.local.config import EngineSettings

    base = dict(model_path=model_dir, optim={"lr": 1e-3, "weight_decay": 0.01})
    base.update(overrides)
    return EngineSettings(**base)


def main_config(model_dir: str, **actor_overrides: Any):
    """verl's real composed ``ppo_trainer`` config, pointed at the tiny model, with our block added."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf, open_dict

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer")
    with open_dict(cfg):
        cfg.actor_rollout_ref.model.path = model_dir
        cfg.actor_rollout_ref.actor.optim.lr = 1e-3
        cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 4
        cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 4
        cfg.actor_rollout_ref.actor.use_torch_compile = False
        for key, val in actor_overrides.items():
            OmegaConf.update(cfg, f"actor_rollout_ref.actor.{key}", val, merge=True)
        cfg.remote_backend = {"local": {"num_cpus": 1}}
    return cfg
