"""The ``local`` engine's sampler: batched autoregressive decoding with a KV cache.

It decodes many requests together, continuously (rows join and leave between decode steps),
each with its own sampling parameters and, when seeded, its own random stream, so concurrent
rollouts share forward passes without changing what each one samples. Pure code: no Ray, no
asyncio; the engine's actor feeds concurrent ``generate`` calls into one :class:`DecodeBatch`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

__all__ = ["SamplingParams", "SampleRequest", "SampleResult", "DecodeBatch", "sample_batch", "process_logits"]


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
        seed: this request's own random stream (``None``: the sampler's shared one). With a
            seed, the tokens drawn depend only on the seed and the model's probabilities, not
            on which other requests share the batch or in which order they arrived.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0
    logprobs: bool = False
    seed: Optional[int] = None

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
        seed = raw.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"sampling_params.seed={seed!r} is invalid: it must be an integer >= 0 or None")
        return cls(max_tokens, float(temperature), float(top_p), int(top_k), float(penalty), bool(want_logprobs), seed)


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
    row_generators: Optional[Sequence[Optional[torch.Generator]]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row with per-row sampling parameters.

    Args:
        logits: ``[n, V]`` float32 next-token logits (repetition penalty applied).
        temperature: ``[n]``; rows with 0 decode greedily.
        top_k: ``[n]`` int64; <= 0 = off.
        top_p: ``[n]`` in (0, 1]; 1 = off.
        generator: RNG for ``torch.multinomial`` of the rows without their own.
        row_generators: ``n`` entries; a row with a generator draws from it alone (one draw
            per token), so its tokens do not depend on the other rows.

    Returns:
        ``(tokens [n] int64, log_probs [n] float32)``: the chosen tokens and their
        log-prob under ``log_softmax(logits / T)`` (``T = 1`` for greedy rows), before
        top-k/top-p truncation: the quantity verl's ``compute_log_prob`` computes at that
        temperature, so rollout and training log-probs are comparable.
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

    probs = torch.softmax(filtered, dim=-1)
    if row_generators is None or all(g is None for g in row_generators):
        sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    else:
        sampled = torch.zeros(probs.shape[0], dtype=torch.long, device=probs.device)
        shared = [i for i, g in enumerate(row_generators) if g is None]
        if shared:
            sampled[shared] = torch.multinomial(probs[shared], 1, generator=generator).squeeze(-1)
        for i, g in enumerate(row_generators):
            if g is not None:
                sampled[i] = torch.multinomial(probs[i], 1, generator=g)[0]
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers >= 5.2x names the KV-cache argument ``cache``; older releases ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class DecodeBatch:
    """A continuous decoding batch: rows join between steps and leave when done.

    Each row is one request, identified by an opaque ``key``. :meth:`admit`
    prefills new rows (left-padded among themselves) and merges their KV cache
    into the running one, left-padding the shorter cache (masked out; positions
    are explicit per row, so rotary embeddings stay exact). :meth:`step` samples
    one token for every live row, returns the rows that finished (EOS or
    ``max_tokens``) and drops them from the batch and cache.

    Joining a running batch needs plain ``DynamicLayer`` caches (full attention);
    for other cache layouts :attr:`can_join` is False and new rows must wait
    until the batch is empty.

    Not thread-safe: one owner drives it, holding the sampler model's lock.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        generator: Optional[torch.Generator] = None,
    ) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab = int(model.get_output_embeddings().weight.shape[0])
        self.eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=self.device)
        self.pad_token_id = int(pad_token_id)
        self.generator = generator
        self._cache_kw = _cache_kwarg(model)
        self.keys: list[Any] = []
        self.cache: Any = None
        self._reset_rows()

    def _reset_rows(self) -> None:
        dev = self.device
        self.keys = []
        self.cache = None
        self.attn = torch.zeros((0, 0), dtype=torch.long, device=dev)  # [n, cache length]
        self.next_pos = torch.zeros(0, dtype=torch.long, device=dev)
        self.logits = torch.zeros((0, self.vocab), device=dev)  # next-token logits of live rows
        self.temperature = torch.zeros(0, device=dev)
        self.top_k = torch.zeros(0, dtype=torch.long, device=dev)
        self.top_p = torch.zeros(0, device=dev)
        self.penalty = torch.zeros(0, device=dev)
        self.max_tokens = torch.zeros(0, dtype=torch.long, device=dev)
        self.want_logprobs = torch.zeros(0, dtype=torch.bool, device=dev)
        self.seen = torch.zeros((0, self.vocab), dtype=torch.bool, device=dev)
        self.count = torch.zeros(0, dtype=torch.long, device=dev)
        self.out_tokens = torch.zeros((0, 0), dtype=torch.long, device=dev)
        self.out_logps = torch.zeros((0, 0), device=dev)
        self.row_generators: list[Optional[torch.Generator]] = []  # per-row streams of seeded requests

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def can_join(self) -> bool:
        """True when new rows may join now (empty batch, or a plain full-attention KV cache)."""
        from transformers.cache_utils import DynamicLayer

        return self.cache is None or all(type(layer) is DynamicLayer for layer in self.cache.layers)

    @torch.no_grad()
    def admit(self, items: Sequence[tuple[Any, SampleRequest]]) -> list[tuple[Any, SampleResult]]:
        """Prefill ``(key, request)`` pairs and add them to the batch.

        Returns the requests that are already complete (``max_tokens == 0``).
        Raises ``RuntimeError`` if :attr:`can_join` is False.
        """
        from transformers import DynamicCache

        done = [(k, SampleResult([], [] if r.params.logprobs else None)) for k, r in items if r.params.max_tokens <= 0]
        items = [(k, r) for k, r in items if r.params.max_tokens > 0]
        if not items:
            return done
        if not self.can_join:
            raise RuntimeError("this model's KV cache layout does not let rows join a running batch")
        dev, reqs = self.device, [r for _, r in items]
        m = len(reqs)
        lens = torch.tensor([len(r.prompt_ids) for r in reqs], device=dev)
        width = int(lens.max())
        ids = torch.full((m, width), self.pad_token_id, dtype=torch.long, device=dev)
        mask = torch.arange(width, device=dev)[None, :] >= (width - lens)[:, None]
        ids[mask] = torch.tensor([t for r in reqs for t in r.prompt_ids], dtype=torch.long, device=dev)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self.model(
            input_ids=ids, attention_mask=mask.long(), position_ids=positions, use_cache=True, logits_to_keep=1,
            **{self._cache_kw: cache},
        ).logits[:, -1, :].float()
        seen = torch.zeros((m, self.vocab), dtype=torch.bool, device=dev)
        seen[mask.nonzero()[:, 0], ids[mask]] = True

        def col(values, dtype=torch.float32):
            return torch.tensor(values, dtype=dtype, device=dev)

        self._merge_cache(cache, mask.long())
        self.keys += [k for k, _ in items]
        self.row_generators += [
            None if r.params.seed is None else torch.Generator(device=dev).manual_seed(r.params.seed) for r in reqs
        ]
        self.next_pos = torch.cat([self.next_pos, positions[:, -1] + 1])
        self.logits = torch.cat([self.logits, logits])
        self.temperature = torch.cat([self.temperature, col([r.params.temperature for r in reqs])])
        self.top_k = torch.cat([self.top_k, col([r.params.top_k for r in reqs], torch.long)])
        self.top_p = torch.cat([self.top_p, col([r.params.top_p for r in reqs])])
        self.penalty = torch.cat([self.penalty, col([r.params.repetition_penalty for r in reqs])])
        self.max_tokens = torch.cat([self.max_tokens, col([r.params.max_tokens for r in reqs], torch.long)])
        self.want_logprobs = torch.cat([self.want_logprobs, col([r.params.logprobs for r in reqs], torch.bool)])
        self.seen = torch.cat([self.seen, seen])
        self.count = torch.cat([self.count, torch.zeros(m, dtype=torch.long, device=dev)])
        steps = max(self.out_tokens.shape[1], int(self.max_tokens.max()))
        self.out_tokens = torch.cat([_pad_cols(self.out_tokens, steps, -1), torch.full((m, steps), -1, device=dev)])
        self.out_logps = torch.cat([_pad_cols(self.out_logps, steps, 0.0), torch.zeros((m, steps), device=dev)])
        return done

    def _merge_cache(self, new_cache: Any, new_attn: torch.Tensor) -> None:
        from transformers import DynamicCache

        if self.cache is None:
            self.cache, self.attn = new_cache, new_attn
            return
        width = max(self.attn.shape[1], new_attn.shape[1])

        def left_pad(t: torch.Tensor, dim: int) -> torch.Tensor:
            missing = width - t.shape[dim]
            if missing == 0:
                return t
            shape = list(t.shape)
            shape[dim] = missing
            return torch.cat([t.new_zeros(shape), t], dim=dim)

        layers = [
            (torch.cat([left_pad(a.keys, 2), left_pad(b.keys, 2)]), torch.cat([left_pad(a.values, 2), left_pad(b.values, 2)]))
            for a, b in zip(self.cache.layers, new_cache.layers)
        ]
        self.cache = DynamicCache(ddp_cache_data=layers)
        self.attn = torch.cat([left_pad(self.attn, 1), left_pad(new_attn, 1)])

    @torch.no_grad()
    def step(self) -> list[tuple[Any, SampleResult]]:
        """Sample one token for every live row; return (and drop) the rows that finished."""
        if not self.keys:
            return []
        n = len(self.keys)
        rows = torch.arange(n, device=self.device)
        logits = self.logits
        if bool((self.penalty != 1.0).any()):
            p = self.penalty[:, None]
            logits = torch.where(self.seen, torch.where(logits > 0, logits / p, logits * p), logits)
        tokens, logps = process_logits(
            logits, self.temperature, self.top_k, self.top_p, self.generator, row_generators=self.row_generators
        )
        self.out_tokens[rows, self.count] = tokens
        self.out_logps[rows, self.count] = logps
        self.count += 1
        self.seen[rows, tokens] = True
        finished = torch.isin(tokens, self.eos) | (self.count >= self.max_tokens)

        results: list[tuple[Any, SampleResult]] = []
        if bool(finished.any()):
            idx = finished.nonzero().squeeze(-1).tolist()
            counts = self.count[finished].tolist()
            toks = self.out_tokens[finished].cpu()
            lps = self.out_logps[finished].cpu()
            want = self.want_logprobs[finished].tolist()
            for j, (i, c) in enumerate(zip(idx, counts)):
                logp = lps[j, :c].tolist() if want[j] else None
                results.append((self.keys[i], SampleResult(toks[j, :c].tolist(), logp)))
            if bool(finished.all()):
                self._reset_rows()
                return results
            keep = (~finished).nonzero().squeeze(-1)
            self.cache.batch_select_indices(keep)
            self.keys = [self.keys[i] for i in keep.tolist()]
            self.row_generators = [self.row_generators[i] for i in keep.tolist()]
            for name in ("attn", "next_pos", "temperature", "top_k", "top_p", "penalty", "max_tokens",
                         "want_logprobs", "seen", "count", "out_tokens", "out_logps"):
                setattr(self, name, getattr(self, name)[keep])
            tokens = tokens[keep]

        self.attn = torch.cat([self.attn, torch.ones_like(self.attn[:, :1])], dim=1)
        self.logits = self.model(
            input_ids=tokens[:, None], attention_mask=self.attn, position_ids=self.next_pos[:, None], use_cache=True,
            **{self._cache_kw: self.cache},
        ).logits[:, -1, :].float()
        self.next_pos = self.next_pos + 1
        return results


def _pad_cols(t: torch.Tensor, width: int, value: float) -> torch.Tensor:
    if t.shape[1] >= width:
        return t
    return torch.cat([t, torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype, device=t.device)], dim=1)


def sample_batch(
    model: torch.nn.Module,
    requests: Sequence[SampleRequest],
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    generator: Optional[torch.Generator] = None,
) -> list[SampleResult]:
    """Decode ``requests`` together (one :class:`DecodeBatch`); results in request order.

    Cost: one prefill over ``[n, max prompt]`` then one forward of the live rows
    per generated token; finished rows are removed from the batch and cache.
    """
    batch = DecodeBatch(model, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, generator=generator)
    results: dict[int, SampleResult] = dict(batch.admit(list(enumerate(requests))))
    while len(batch):
        results.update(batch.step())
    return [results[i] for i in range(len(requests))]
