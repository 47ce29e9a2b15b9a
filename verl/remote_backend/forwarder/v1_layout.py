"""verl 0.9.1's V1 batch layout -> the dense layout remote backends read.

Two verl trainers hand the forwarder the same samples in two layouts:

* the legacy one (verl 0.7.1, and 0.9.1 with ``trainer.use_v1=false``): ``input_ids`` and
  ``position_ids`` nested-jagged, everything else dense - ``prompts`` ``[B, P]`` left-padded,
  ``responses`` and every response-aligned field (``response_mask``, ``loss_mask``,
  ``old_log_probs``, ``ref_log_prob``, ``advantages``, ...) ``[B, R]`` right-padded, and
  ``attention_mask`` ``[B, P + R]``;
* the V1 one (0.9.1's ``PPOTrainerSync``, batches read from TransferQueue): every per-sample
  field nested-jagged and unpadded, no ``attention_mask``.

Backends are written against the first (the contract's layout: Arctic's payload, Tinker's datums,
the local engine's loss). :func:`to_dense_layout` turns a V1 batch into it, so every backend runs
unchanged on both trainers. What comes back needs no conversion: log-probs and entropy over the
full sequence are nested like ``input_ids`` in both.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from verl.remote_backend.transport.layout import packed_to_padded
from verl.utils import tensordict_utils as tu

__all__ = ["is_v1_layout", "to_dense_layout"]

#: Fields over the whole sequence (prompt + response): nested in both layouts, kept as they are.
SEQUENCE_FIELDS = frozenset({"input_ids", "position_ids"})


def _is_jagged(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_nested and value.layout == torch.jagged


def is_v1_layout(data: Any) -> bool:
    """True for a batch in the V1 layout: a ``TensorDict`` whose ``prompts`` are nested-jagged."""
    return isinstance(data, TensorDict) and "prompts" in data.keys() and _is_jagged(data.get("prompts"))


def _row_lengths(nested: torch.Tensor) -> torch.Tensor:
    return nested.offsets().diff().to(torch.int64)


def to_dense_layout(data: TensorDict, *, prompt_length: int, response_length: int, pad_token_id: int) -> TensorDict:
    """The legacy (dense) layout of a V1 batch, as the legacy trainer would have sent the same samples.

    Args:
        data: a V1 batch: nested-jagged ``prompts``, ``responses``, ``input_ids`` and the
            response-aligned fields; non-tensor entries are kept as they are.
        prompt_length: ``actor_rollout_ref.rollout.prompt_length``: the width ``P`` of the dense
            prompts (widened to the longest prompt if one is longer).
        response_length: ``actor_rollout_ref.rollout.response_length``: the width ``R`` of the
            response-aligned fields (widened likewise).
        pad_token_id: filler of the padded ``prompts`` and ``responses`` columns (0 elsewhere).

    Returns:
        A new ``TensorDict`` (``data`` is not changed): ``prompts`` ``[B, P]`` left-padded;
        ``responses`` and every other nested field whose rows are as long as the responses
        ``[B, R]`` right-padded; ``attention_mask`` ``[B, P + R]`` (int64: ones on each row's
        prompt and response tokens); ``input_ids``, ``position_ids`` and nested fields of other
        lengths unchanged; ``max_seq_len`` = ``P + R`` and ``max_response_len`` = ``R`` as the
        legacy trainer's unpadding sets them.

    Raises:
        ValueError: ``data`` is not a V1 batch (no nested ``prompts`` / ``responses``), or a row
            has an empty prompt (its response-aligned fields would be ambiguous).
    """
    if not is_v1_layout(data) or not _is_jagged(data.get("responses", None)):
        raise ValueError("to_dense_layout expects a V1 batch: nested-jagged 'prompts' and 'responses'")
    prompts, responses = data.get("prompts"), data.get("responses")
    prompt_lens, response_lens = _row_lengths(prompts), _row_lengths(responses)
    if bool((prompt_lens == 0).any()):
        raise ValueError(f"to_dense_layout: every row needs a prompt token (prompt lengths {prompt_lens.tolist()})")
    width_p = max(int(prompt_length), int(prompt_lens.max()) if prompt_lens.numel() else 0)
    width_r = max(int(response_length), int(response_lens.max()) if response_lens.numel() else 0)
    prompt_starts = width_p - prompt_lens

    dense: dict[str, torch.Tensor] = {
        "prompts": packed_to_padded(
            prompts.values(), prompts.offsets(), width_p, starts=prompt_starts, pad_value=pad_token_id
        ),
        "responses": packed_to_padded(responses.values(), responses.offsets(), width_r, pad_value=pad_token_id),
    }
    for key in data.keys():
        value = data.get(key)
        if key in dense or key in SEQUENCE_FIELDS or not _is_jagged(value):
            continue
        if value.shape[0] == len(response_lens) and torch.equal(_row_lengths(value), response_lens):
            dense[key] = packed_to_padded(value.values(), value.offsets(), width_r, pad_value=0)

    columns = torch.arange(width_p + width_r)
    starts = prompt_starts.unsqueeze(1)
    ends = (width_p + response_lens).unsqueeze(1)
    attention_mask = ((columns >= starts) & (columns < ends)).to(torch.int64)

    out = data.exclude(*dense)
    for key, value in dense.items():
        out.set(key, value)
    out.set("attention_mask", attention_mask)
    tu.assign_non_tensor(out, max_seq_len=width_p + width_r, max_response_len=width_r)
    return out
