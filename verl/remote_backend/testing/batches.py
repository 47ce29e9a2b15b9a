"""verl-shaped batches for exercising a backend without a trainer: the padded rollout batch verl
holds after generation, and the no-padding (nested-jagged) batch its forwarder sends, made by
verl's own ``left_right_2_no_padding``."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from tensordict import TensorDict

__all__ = ["PAD_ID", "dense_rollout_batch", "to_no_padding", "random_rollouts", "random_update_batch"]

#: pad id of the padded layout (masked out everywhere, so any id works)
PAD_ID = 0


def dense_rollout_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    prompt_width: Optional[int] = None,
    response_width: Optional[int] = None,
    extra: Optional[dict[str, torch.Tensor]] = None,
) -> TensorDict:
    """The padded batch verl holds after generation: ``prompts [B, P]`` left-padded,
    ``responses`` / ``response_mask [B, R]`` right-padded, ``input_ids`` / ``attention_mask`` /
    ``position_ids [B, P + R]``, plus ``extra`` ``[B, R]`` fields (advantages, old log-probs, ...)."""
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
    return TensorDict(
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


def to_no_padding(dense: TensorDict, **non_tensor: Any) -> TensorDict:
    """What the forwarder hands a backend: verl's ``left_right_2_no_padding`` of ``dense`` (a
    copy; ``input_ids`` / ``position_ids`` become nested-jagged) with ``non_tensor`` fields
    (``calculate_entropy``, ``temperature``, ``mini_batch_size``, ``epochs``, ...) assigned."""
    from verl.remote_backend.launch.cpu_compat import install_flash_attn_fallback
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    install_flash_attn_fallback()  # verl's unpad helpers need flash_attn otherwise
    td = left_right_2_no_padding(dense.clone())
    if non_tensor:
        tu.assign_non_tensor(td, **non_tensor)
    return td


def random_rollouts(
    n: int,
    *,
    seed: int,
    vocab: int = 500,
    prompt_len: tuple[int, int] = (3, 9),
    response_len: tuple[int, int] = (2, 10),
) -> tuple[list[list[int]], list[list[int]]]:
    """``n`` random prompts and responses of varied lengths; ids in ``[3, vocab)`` avoid the
    usual special tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(n):
        lp = int(torch.randint(prompt_len[0], prompt_len[1] + 1, (1,), generator=g))
        lr = int(torch.randint(response_len[0], response_len[1] + 1, (1,), generator=g))
        prompts.append(torch.randint(3, vocab, (lp,), generator=g).tolist())
        responses.append(torch.randint(3, vocab, (lr,), generator=g).tolist())
    return prompts, responses


def random_update_batch(
    n: int,
    *,
    seed: int,
    mini_batch_size: int,
    epochs: int = 1,
    advantages: Optional[Sequence[float]] = None,
    with_ref: bool = False,
    **rollout_shape: Any,
) -> TensorDict:
    """What verl's forwarder sends ``update_actor``: ``n`` random rollouts (:func:`random_rollouts`
    with ``seed`` and ``rollout_shape``) with one advantage per sequence (``advantages``, or
    standard normal draws from ``seed``: rewards that vary), old log-probs of -6.2 on every
    response token (and reference log-probs equal to them when ``with_ref``), in mini-batches of
    ``mini_batch_size`` rows taken in order, ``epochs`` passes, temperature 1, no entropy."""
    prompts, responses = random_rollouts(n, seed=seed, **rollout_shape)
    dense = dense_rollout_batch(prompts, responses)
    mask = dense["response_mask"].float()
    if advantages is None:
        per_row = torch.randn(n, 1, generator=torch.Generator().manual_seed(seed))
    else:
        per_row = torch.tensor(advantages, dtype=torch.float32)[:, None]
    dense["old_log_probs"] = -6.2 * mask
    if with_ref:
        dense["ref_log_prob"] = -6.2 * mask
    dense["advantages"] = per_row.expand_as(mask) * mask
    return to_no_padding(
        dense,
        mini_batch_size=mini_batch_size,
        global_batch_size=mini_batch_size,
        epochs=epochs,
        seed=0,
        dataloader_kwargs={"shuffle": False},
        calculate_entropy=False,
        temperature=1.0,
    )
