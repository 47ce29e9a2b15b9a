"""Per-token log-probs and entropy of packed (nested-jagged) sequences, for the ``local`` engine.

One forward over verl's packed layout serves both ``compute_log_prob`` (no grad) and the policy
loss (with grad), so the two agree by construction. Pure functions over a Hugging Face causal LM;
no Ray, no optimizer.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from dataclasses import dataclass
from typing import Optional, Union

import torch
from tensordict import TensorDict

from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

__all__ = [
    "packed_forward",
    "shared_prefix_layout",
    "SharedPrefixLayout",
    "MIN_SHARED_PREFIX",
    "response_slots",
    "use_packed_rows",
    "PACKED_ROWS_ATTENTION",
    "row_slices",
    "jagged_rows",
    "get_input_tensors",
    "DTYPE_BY_NAME",
]

DTYPE_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def packed_forward(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    position_ids: Optional[torch.Tensor],
    *,
    temperature: Union[float, torch.Tensor] = 1.0,
    calculate_entropy: bool = False,
    entropy_requires_grad: bool = True,
    pad_token_id: int = 0,
    autocast_dtype: Optional[torch.dtype] = None,
    slots: Optional[torch.Tensor] = None,
    share_prefixes: bool = False,
) -> dict[str, torch.Tensor]:
    """Run ``model`` on the rows of ``input_ids`` and return packed per-token outputs.

    A model switched by :func:`use_packed_rows` gets the rows as one unpadded ``[1, T]``
    sequence with per-row causal attention; any other model gets them right-padded into a
    dense ``[B, max L_i]`` batch with an attention mask. Either way real tokens never attend
    to padding or to another row, and the result equals running each row on its own.

    Args:
        model: causal LM returning ``.logits [B, L, V]``.
        input_ids: NJT ``[B, j]`` of token ids (``torch.jagged`` layout).
        position_ids: NJT with the same offsets, or ``None`` for ``0..L_i-1``.
        temperature: scalar or per-row ``[B]``; logits are divided by it
            (clamped at 1e-8) before the softmax, as verl does.
        calculate_entropy: also return the per-token entropy of the
            temperature-scaled distribution.
        entropy_requires_grad: when False the entropy is computed under
            ``no_grad`` (a metric only), saving the autograd graph.
        pad_token_id: id written into padding slots (never attended to).
        autocast_dtype: run the model under ``torch.autocast`` with this dtype.
        slots: optional bool ``[T]``: only these slots are computed (the others are 0). The
            model then projects only their hidden states onto the vocabulary (its own
            ``logits_to_keep`` mask), which is most of the saving when prompts are long:
            the ``[T, V]`` logits and their backward shrink to ``[sum(slots), V]``.
        share_prefixes: on the packed path, consecutive rows that begin with the same tokens
            at the same positions (a GRPO group's samples of one prompt) run that common
            prefix once: its keys and values serve every row of the group, and the backward
            sums the rows' gradients into it. The same function of the weights (a causal
            token never sees what follows it), so the results differ from unshared rows by
            float32 summation order only (:func:`shared_prefix_layout`).

    Returns:
        ``{"log_probs": float32 [T], "entropy": float32 [T] (when asked)}``, ``T = sum(L_i)``,
        in ``input_ids.values()`` order: slot ``t`` holds ``log p(token[t+1] | token[:t+1])``
        and the last slot of each row is 0. They carry gradients when grad mode is on.
    """
    if not input_ids.is_nested:
        raise TypeError("input_ids must be a nested-jagged tensor (layout=torch.jagged), one row per sample")
    offsets = input_ids.offsets()
    lengths = offsets.diff()
    batch, max_len = lengths.numel(), int(lengths.max())
    device = next(model.parameters()).device

    if position_ids is not None and position_ids.dim() != 2:
        raise NotImplementedError("the local backend supports 1-D position ids per row (text models) only")
    packed = getattr(model.config, "_attn_implementation", None) == PACKED_ROWS_ATTENTION
    kept = slots is not None and _takes_logits_mask(type(model))
    layout = None  # the shared-prefix layout of the packed rows, when any prefix is shared
    if packed:  # one [1, T] row, no padding; attention runs row by row (see use_packed_rows)
        ids = input_ids.values().to(device)
        if position_ids is None:
            pos = torch.cat([torch.arange(int(n), device=device) for n in lengths])
        else:
            pos = position_ids.values().to(device)
        if share_prefixes:
            layout = shared_prefix_layout(ids, pos, offsets.tolist())
        if layout is not None:
            ids, pos = ids[layout.source], pos[layout.source]
            keep = layout.gather[slots.to(device=device, dtype=torch.bool)] if kept else None
        else:
            keep = slots.to(device=device, dtype=torch.bool)[None] if kept else None
        inputs = {"input_ids": ids[None], "position_ids": pos[None]}
    else:  # right-padded [B, max L_i] with an attention mask
        ids = torch.nested.to_padded_tensor(input_ids, pad_token_id, output_size=(batch, max_len)).to(device)
        valid = torch.arange(max_len, device=device)[None, :] < lengths.to(device)[:, None]
        if position_ids is None:
            pos = torch.arange(max_len, device=device).expand(batch, max_len)
        else:
            pos = torch.nested.to_padded_tensor(position_ids, 0, output_size=(batch, max_len)).to(device)
        keep = None
        if kept:
            keep = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
            keep[valid] = slots.to(device)
        inputs = {"input_ids": ids, "attention_mask": valid.long(), "position_ids": pos}
    if keep is not None:
        inputs["logits_to_keep"] = keep  # the model flattens the kept slots to [K, V], row-major
    ctx = (
        torch.autocast(device_type=device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    if packed:
        _packed_rows.groups = layout.groups if layout is not None else [(int(n), ()) for n in lengths.tolist()]
    try:
        with ctx:
            logits = model(**inputs, use_cache=False).logits
    finally:
        _packed_rows.groups = None
    if keep is None:  # [T, V] in input_ids.values() order
        logits = (logits[0] if layout is None else logits[0][layout.gather]) if packed else logits[valid]
    elif layout is not None:  # an index keeps [1, K, V]; a mask flattens to [K, V]
        logits = logits[0]
    logits = logits.float()

    total = int(offsets[-1])
    where = slots.to(device=device, dtype=torch.bool) if kept else None

    def pick(values: torch.Tensor) -> torch.Tensor:  # [T] -> the computed slots
        return values if where is None else values[where]

    def spread(values: torch.Tensor) -> torch.Tensor:  # the computed slots -> [T], 0 elsewhere
        return (
            values
            if where is None
            else torch.zeros(total, dtype=values.dtype, device=device).masked_scatter(where, values)
        )

    temp = torch.as_tensor(temperature, dtype=torch.float32, device=device)
    if temp.dim() == 0:
        logits = logits / temp.clamp(min=1e-8)
    else:
        logits = logits / pick(temp.clamp(min=1e-8).repeat_interleave(lengths.to(device)))[:, None]

    labels = pick(torch.roll(input_ids.values().to(device), shifts=-1, dims=0))
    is_last = torch.zeros(total, dtype=torch.bool, device=device)
    is_last[(offsets[1:] - 1).to(device)] = True
    is_last = pick(is_last)

    out = {"log_probs": spread(logprobs_from_logits(logits, labels, inplace_backward=False).masked_fill(is_last, 0.0))}
    if calculate_entropy:
        grad_ctx = contextlib.nullcontext() if entropy_requires_grad else torch.no_grad()
        with grad_ctx:
            src = logits if entropy_requires_grad else logits.detach()
            out["entropy"] = spread(entropy_from_logits(src).masked_fill(is_last, 0.0))
    return out


@functools.lru_cache(maxsize=None)
def _takes_logits_mask(model_type: type) -> bool:
    """Whether the model's forward accepts a boolean ``[B, L]`` ``logits_to_keep`` (transformers >= 5)."""
    import transformers.modeling_utils as hf

    return hasattr(hf, "slice_logits_to_keep") and "logits_to_keep" in inspect.signature(model_type.forward).parameters


PACKED_ROWS_ATTENTION = "packed_rows_sdpa"
_packed_rows = threading.local()  # per thread: the sampler may share the model and run meanwhile


def use_packed_rows(model: torch.nn.Module) -> bool:
    """Let :func:`packed_forward` run ``model`` on its rows packed into one unpadded sequence.

    Applies to ``sdpa`` models whose layers all attend to the full context (returns False
    otherwise, and they keep the padded path).
    The model's attention becomes :data:`PACKED_ROWS_ATTENTION`: inside ``packed_forward`` it
    runs causal SDPA on each row's own slice of the packed sequence (so no token sees another
    row, and the linear layers see no padding); everywhere else (the sampler, ``generate``)
    it is transformers' ``sdpa`` unchanged, mask included.
    """
    if getattr(model.config, "_attn_implementation", None) != "sdpa" or _has_sliding_window(model.config):
        return False  # plain causal SDPA per row would ignore a sliding window
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_ROWS_ATTENTION, _packed_rows_attention)
    AttentionMaskInterface.register(PACKED_ROWS_ATTENTION, _packed_rows_mask)
    model.set_attn_implementation(PACKED_ROWS_ATTENTION)
    return True


def _has_sliding_window(config: object) -> bool:
    if any("sliding" in str(kind) for kind in getattr(config, "layer_types", None) or ()):
        return True
    return getattr(config, "sliding_window", None) is not None and bool(getattr(config, "use_sliding_window", True))


def _packed_rows_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    **kwargs,
):
    """transformers' attention-function signature; ``query`` ``[1, H, T, D]`` when packed."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(_packed_rows, "groups", None)
    if groups is None:
        if query.shape[2] == 1 and _plain_decode(module, attention_mask, kwargs):
            return _decode_attention(module, query, key, value, attention_mask, scaling=kwargs.get("scaling")), None
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("is_causal", None)
    outs, start = [], 0
    for prefix, tails in groups:
        end = start + prefix
        k_pre, v_pre = key[:, :, start:end], value[:, :, start:end]
        outs.append(
            sdpa_attention_forward(module, query[:, :, start:end], k_pre, v_pre, None, is_causal=True, **kwargs)[0]
        )
        for tail in tails:  # a row's own tokens see the whole shared prefix, then themselves causally
            start, end = end, end + tail
            if tail == 0:
                continue
            k_row = torch.cat([k_pre, key[:, :, start:end]], dim=2)
            v_row = torch.cat([v_pre, value[:, :, start:end]], dim=2)
            mask = _tail_mask(prefix, tail, query.device)
            outs.append(
                sdpa_attention_forward(module, query[:, :, start:end], k_row, v_row, mask, is_causal=False, **kwargs)[0]
            )
        start = end
    return torch.cat(outs, dim=1), None  # [1, T, H, D]


def _plain_decode(module: torch.nn.Module, attention_mask: Optional[torch.Tensor], kwargs: dict) -> bool:
    """Whether a one-token call is plain softmax attention :func:`_decode_attention` computes
    (no dropout, soft-capping, sinks or sliding window; a boolean mask or none)."""
    if kwargs.get("dropout", 0.0) or kwargs.get("softcap") is not None or kwargs.get("sliding_window") is not None:
        return False
    if getattr(module, "sinks", None) is not None or kwargs.get("position_bias") is not None:
        return False
    return attention_mask is None or attention_mask.dtype == torch.bool


def _decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    scaling: Optional[float] = None,
) -> torch.Tensor:
    """Attention of one new token per row, as two batched matmuls: the query heads that share
    a key/value head are stacked against it (no copy of the cache per query head), and the mask
    is a plain fill. Inputs ``query [B, H, 1, D]``, ``key``/``value`` ``[B, H_kv, S, D]``, a bool
    mask broadcastable to ``[B, 1, 1, S]`` (True = attend); ``scaling`` as the model passes it
    (else the module's, else ``D ** -0.5``); returns ``[B, 1, H, D]``. The
    sampler's decode steps run it: at 1 query token SDPA's fixed cost per call is most of the work.
    """
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    if scaling is None:
        scaling = getattr(module, "scaling", None) or dim**-0.5
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # [B, H_kv, G, D]
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * scaling  # [B, H_kv, G, S]
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask[..., -1:, : key.shape[2]], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    return torch.matmul(probs, value).reshape(batch, 1, heads, dim)


def _tail_mask(prefix: int, tail: int, device: torch.device) -> torch.Tensor:
    """Bool ``[1, 1, tail, prefix + tail]``: True where a tail token may attend (the prefix, then causal)."""
    query_at = torch.arange(tail, device=device)[:, None] + prefix
    return (torch.arange(prefix + tail, device=device)[None, :] <= query_at)[None, None]


def _packed_rows_mask(*args, **kwargs):
    """No mask for a packed call (each row is causal on its own); ``sdpa``'s mask otherwise."""
    from transformers.masking_utils import sdpa_mask

    return None if getattr(_packed_rows, "groups", None) is not None else sdpa_mask(*args, **kwargs)


#: Rows share a prefix only when it is at least this many tokens: a shorter one saves less
#: than its extra attention calls cost.
MIN_SHARED_PREFIX = 16


@dataclass(frozen=True)
class SharedPrefixLayout:
    """Packed rows rearranged so that each group of rows with a common prefix holds it once.

    Attributes:
        groups: in layout order, ``(prefix_len, tail_lens)`` per group: the prefix's slots,
            then each member row's remaining slots. A row sharing nothing is ``(len, ())``.
        source: long ``[T']``: the original packed slot each layout slot is copied from.
        gather: long ``[T]``: the layout slot that holds each original slot (prefix slots
            repeat across the group's rows).
    """

    groups: list[tuple[int, tuple[int, ...]]]
    source: torch.Tensor
    gather: torch.Tensor


def shared_prefix_layout(ids: torch.Tensor, pos: torch.Tensor, offsets: list[int]) -> Optional[SharedPrefixLayout]:
    """Group consecutive packed rows by their common prefix; ``None`` when no row shares one.

    ``ids``/``pos`` are the packed ``[T]`` token and position ids, ``offsets`` the ``B + 1``
    row boundaries. A row joins the current group when its first :data:`MIN_SHARED_PREFIX`
    or more tokens (ids and positions both) equal the group's first row's; the group's
    prefix is the shortest such match among its rows, so every row holds it exactly.
    """
    rows = len(offsets) - 1
    groups: list[tuple[int, list[int]]] = []  # (prefix_len, member rows)
    for row in range(rows):
        if groups:
            prefix, members = groups[-1]
            first = members[0]
            a, b = offsets[first], offsets[row]
            span = min(prefix, offsets[row + 1] - b)
            same = (ids[a : a + span] == ids[b : b + span]) & (pos[a : a + span] == pos[b : b + span])
            common = int(same.long().cumprod(0).sum()) if span else 0
            if common >= MIN_SHARED_PREFIX:
                groups[-1] = (min(prefix, common), members + [row])
                continue
        groups.append((offsets[row + 1] - offsets[row], [row]))
    if len(groups) == rows:
        return None
    source, gather = [], torch.empty(offsets[-1], dtype=torch.long)
    layout_groups, at = [], 0
    for prefix, members in groups:
        tails = tuple(offsets[r + 1] - offsets[r] - prefix for r in members) if len(members) > 1 else ()
        source.append(torch.arange(offsets[members[0]], offsets[members[0]] + prefix))
        for r in members:
            gather[offsets[r] : offsets[r] + prefix] = torch.arange(at, at + prefix)
        at += prefix
        for r, tail in zip(members, tails):
            source.append(torch.arange(offsets[r] + prefix, offsets[r + 1]))
            gather[offsets[r] + prefix : offsets[r + 1]] = torch.arange(at, at + tail)
            at += tail
        layout_groups.append((prefix, tails))
    device = ids.device
    return SharedPrefixLayout(layout_groups, torch.cat(source).to(device), gather.to(device))


def response_slots(data: TensorDict) -> torch.Tensor:
    """Bool ``[T]`` over the packed tokens of ``data``: the slots whose log-prob verl reads back.

    These are the slots ``no_padding_2_padding`` (verl's own slicing, used here) cuts out for
    the response: ``log p(response token)`` for every response token of every row. ``data``
    carries the NJT ``input_ids`` and verl's ``prompts``, ``responses`` and ``attention_mask``.
    """
    from verl.workers.utils.padding import no_padding_2_padding

    total = int(data["input_ids"].offsets()[-1])
    picked = no_padding_2_padding(torch.arange(1, total + 1), data)  # 0 = padding
    slots = torch.zeros(total, dtype=torch.bool)
    slots[picked[picked > 0] - 1] = True
    return slots


def row_slices(lengths: torch.Tensor, *, micro_batch_size: Optional[int], max_token_len: Optional[int]) -> list[slice]:
    """Contiguous row ranges for forward micro-batches (order is kept, so outputs just concatenate).

    ``max_token_len`` (token budget) takes precedence over ``micro_batch_size``
    (rows); with neither, one slice covers the batch. A row longer than the
    budget gets a micro-batch of its own.
    """
    n = lengths.numel()
    if max_token_len:
        out, start, used = [], 0, 0
        for i, length in enumerate(lengths.tolist()):
            if i > start and used + length > max_token_len:
                out.append(slice(start, i))
                start, used = i, 0
            used += length
        out.append(slice(start, n))
        return out
    step = micro_batch_size or n
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def jagged_rows(nt: torch.Tensor, rows: slice) -> torch.Tensor:
    """Rows ``rows`` (a contiguous slice) of an NJT, as a new NJT sharing the values."""
    offsets = nt.offsets()
    lo, hi = int(offsets[rows.start]), int(offsets[rows.stop])
    return torch.nested.nested_tensor_from_jagged(nt.values()[lo:hi], offsets[rows.start : rows.stop + 1] - lo)


def get_input_tensors(data: Union[TensorDict, dict]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(input_ids, position_ids)`` from a batch, with a clear error when ``input_ids`` is not an NJT."""
    if "input_ids" not in data.keys():
        raise KeyError("the batch has no 'input_ids' (expected a nested-jagged tensor, one row per sample)")
    input_ids = data["input_ids"]
    if not getattr(input_ids, "is_nested", False):
        raise TypeError(
            "batch['input_ids'] must be nested-jagged (verl's left_right_2_no_padding output); got a dense tensor"
        )
    position_ids = data["position_ids"] if "position_ids" in data.keys() else None
    return input_ids, position_ids
