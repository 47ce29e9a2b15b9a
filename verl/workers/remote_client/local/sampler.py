"""Batched autoregressive sampling with a KV cache.

:func:`sample_batch` decodes many requests together: prompts are left-padded
into one batch, prefilled once, then decoded one token per step for all live
rows; each row has its own temperature / top-k / top-p / repetition penalty /
max_tokens, and a row leaves the batch (its KV cache rows are dropped) as soon
as it emits an EOS id or reaches its ``max_tokens``. Pure functions: no Ray, no
asyncio; the engine's actor gathers concurrent ``generate`` calls into batches.

Returned log-probs are those of the *temperature-scaled* distribution
(``log_softmax(logits / T)``, ``T = 1`` for greedy), before top-k/top-p
truncation - the same quantity verl's ``compute_log_prob`` computes at that
temperature, so rollout and training log-probs are comparable.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

__all__ = ["SamplingParams", "SampleRequest", "SampleResult", "sample_batch", "process_logits"]


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling parameters of one request.

    Attributes:
        max_tokens: most tokens to generate (>= 0; capped at the context left).
        temperature: > 0 samples from ``softmax(logits / temperature)``; 0 = greedy.
        top_p: nucleus mass in (0, 1]; 1 = off.
        top_k: keep the k most likely tokens; <= 0 = off.
        repetition_penalty: > 0; 1 = off (CTRL-style: divides positive logits of
            tokens already in the prompt or output, multiplies negative ones).
        logprobs: return the log-prob of each generated token.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0
    logprobs: bool = False

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, default_max_tokens: int) -> "SamplingParams":
        """Parse verl's ``sampling_params`` dict; unknown keys are ignored (backends differ in extras).

        ``max_new_tokens`` is accepted as an alias of ``max_tokens``; ``logprobs``
        may be a bool or a vLLM-style int (>= 0 means "return them").

        Raises:
            ValueError: naming the parameter, for a negative ``max_tokens``,
                ``temperature < 0``, ``top_p`` outside (0, 1], a non-integer
                ``top_k`` or ``repetition_penalty <= 0``.
        """
        raw = dict(raw or {})
        max_tokens = raw.get("max_tokens", raw.get("max_new_tokens"))
        max_tokens = default_max_tokens if max_tokens is None else max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"sampling_params.max_tokens={max_tokens!r} is invalid: it must be an integer >= 0")
        temperature = _number(raw, "temperature", 1.0)
        if temperature < 0:
            raise ValueError(f"sampling_params.temperature={temperature!r} is invalid: it must be >= 0 (0 = greedy)")
        top_p = _number(raw, "top_p", 1.0)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"sampling_params.top_p={top_p!r} is invalid: it must be in (0, 1]")
        top_k = raw.get("top_k", -1)
        top_k = -1 if top_k is None else top_k
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise ValueError(f"sampling_params.top_k={top_k!r} is invalid: it must be an integer (<= 0 = off)")
        penalty = _number(raw, "repetition_penalty", 1.0)
        if not penalty > 0:
            raise ValueError(f"sampling_params.repetition_penalty={penalty!r} is invalid: it must be > 0")
        logprobs = raw.get("logprobs", False)
        want_logprobs = logprobs is True or (isinstance(logprobs, int) and not isinstance(logprobs, bool) and logprobs >= 0)
        return cls(max_tokens, float(temperature), float(top_p), int(top_k), float(penalty), bool(want_logprobs))


def _number(raw: Mapping[str, Any], key: str, default: float) -> float:
    val = raw.get(key, default)
    val = default if val is None else val
    if isinstance(val, bool) or not isinstance(val, (int, float)):
        raise ValueError(f"sampling_params.{key}={val!r} is invalid: it must be a number")
    return float(val)


@dataclass(frozen=True)
class SampleRequest:
    """One prompt to continue. ``params.max_tokens`` is already capped at the context left."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams


@dataclass
class SampleResult:
    """``token_ids`` (ends with the EOS id when generation stopped there) and, when asked, one log-prob per token."""

    token_ids: list[int]
    log_probs: Optional[list[float]]
    stop_reason: str = "completed"

    def to_dict(self) -> dict[str, Any]:
        return {"token_ids": self.token_ids, "log_probs": self.log_probs, "stop_reason": self.stop_reason}


def process_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row with per-row sampling parameters.

    Args:
        logits: ``[n, V]`` float32 next-token logits (repetition penalty applied).
        temperature: ``[n]``; rows with 0 decode greedily.
        top_k: ``[n]`` int64; <= 0 = off.
        top_p: ``[n]`` in (0, 1]; 1 = off.
        generator: RNG for ``torch.multinomial``.

    Returns:
        ``(tokens [n] int64, log_probs [n] float32)``: the chosen tokens and their
        log-prob under ``log_softmax(logits / T)`` (``T = 1`` for greedy rows).
    """
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / scale[:, None]
    log_probs = torch.log_softmax(scaled, dim=-1)

    filtered = scaled
    needs_filter = (top_k > 0) | (top_p < 1.0)
    if bool(needs_filter.any()):
        vocab = logits.shape[-1]
        sorted_vals, sorted_idx = scaled.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device)[None, :]
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
        keep = ranks < k[:, None]
        probs = torch.softmax(sorted_vals.masked_fill(~keep, float("-inf")), dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        keep &= (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)  # always keeps rank 0
        keep_vocab = torch.zeros_like(keep).scatter(-1, sorted_idx, keep)
        filtered = scaled.masked_fill(~keep_vocab, float("-inf"))

    sampled = torch.multinomial(torch.softmax(filtered, dim=-1), 1, generator=generator).squeeze(-1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers >= 5.2x names the KV-cache argument ``cache``; older releases ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def sample_batch(
    model: torch.nn.Module,
    requests: Sequence[SampleRequest],
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    generator: Optional[torch.Generator] = None,
) -> list[SampleResult]:
    """Decode ``requests`` together with a KV cache; results in request order.

    Cost: one prefill over ``[n, max prompt]`` then one forward of the live rows
    per generated token; finished rows are removed from the batch and cache.
    """
    from transformers import DynamicCache

    results = [SampleResult([], [] if r.params.logprobs else None) for r in requests]
    live = [i for i, r in enumerate(requests) if r.params.max_tokens > 0]
    if not live:
        return results
    device = next(model.parameters()).device
    reqs = [requests[i] for i in live]
    n = len(reqs)
    prompt_lens = torch.tensor([len(r.prompt_ids) for r in reqs], device=device)
    width = int(prompt_lens.max())

    # Left-pad so every row's next token sits in the last column.
    ids = torch.full((n, width), pad_token_id, dtype=torch.long, device=device)
    mask = torch.arange(width, device=device)[None, :] >= (width - prompt_lens)[:, None]
    ids[mask] = torch.tensor([t for r in reqs for t in r.prompt_ids], dtype=torch.long, device=device)
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)

    temperature = torch.tensor([r.params.temperature for r in reqs], device=device)
    top_k = torch.tensor([r.params.top_k for r in reqs], dtype=torch.long, device=device)
    top_p = torch.tensor([r.params.top_p for r in reqs], device=device)
    penalty = torch.tensor([r.params.repetition_penalty for r in reqs], device=device)
    max_tokens = torch.tensor([r.params.max_tokens for r in reqs], device=device)
    eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=device)
    rows = torch.arange(n, device=device)  # live row -> index into reqs

    vocab = model.get_output_embeddings().weight.shape[0]
    use_penalty = bool((penalty != 1.0).any())
    seen = torch.zeros((n, vocab), dtype=torch.bool, device=device)
    if use_penalty:
        seen[mask.nonzero()[:, 0], ids[mask]] = True

    steps = int(max_tokens.max())
    out_tokens = torch.full((n, steps), -1, dtype=torch.long, device=device)
    out_logps = torch.zeros((n, steps), dtype=torch.float32, device=device)
    lengths = torch.zeros(n, dtype=torch.long, device=device)

    cache = DynamicCache()
    cache_kw = {_cache_kwarg(model): cache}
    attn = mask.long()
    logits = model(
        input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True, logits_to_keep=1, **cache_kw
    ).logits[:, -1, :].float()
    next_pos = positions[:, -1] + 1

    for step in range(steps):
        if use_penalty:
            p = penalty[rows][:, None]
            s = seen[rows]
            logits = torch.where(s, torch.where(logits > 0, logits / p, logits * p), logits)
        tokens, logps = process_logits(logits, temperature[rows], top_k[rows], top_p[rows], generator)
        out_tokens[rows, step] = tokens
        out_logps[rows, step] = logps
        lengths[rows] = step + 1
        if use_penalty:
            seen[rows, tokens] = True
        done = torch.isin(tokens, eos) | (step + 1 >= max_tokens[rows])
        if bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            rows, tokens, attn, next_pos = rows[keep], tokens[keep], attn[keep], next_pos[keep]
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
        logits = model(
            input_ids=tokens[:, None], attention_mask=attn, position_ids=next_pos[:, None], use_cache=True, **cache_kw
        ).logits[:, -1, :].float()
        next_pos = next_pos + 1

    tokens_cpu, logps_cpu, lengths_cpu = out_tokens.cpu(), out_logps.cpu(), lengths.cpu().tolist()
    for j, i in enumerate(live):
        length = lengths_cpu[j]
        results[i].token_ids = tokens_cpu[j, :length].tolist()
        if results[i].log_probs is not None:
            results[i].log_probs = logps_cpu[j, :length].tolist()
    return results
