"""The ``local`` engine's sampler: batched autoregressive decoding with a KV cache.

It decodes many requests together, continuously (rows join and leave between decode steps),
each with its own sampling parameters and, when seeded, its own random stream, so concurrent
rollouts share forward passes without changing what each one samples. Prompts are prefilled in
length groups (padding <= 5 % of real tokens), identical prompts (a GRPO group's samples) once,
and join the running batch through per-row KV slots (:mod:`.slot_cache`). Pure code: no Ray,
no asyncio; the engine's actor feeds concurrent ``generate`` calls into one :class:`DecodeBatch`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

from verl.remote_backend.results import GenerateResult

from .slot_cache import SlotCache

__all__ = [
    "SamplingParams",
    "SampleRequest",
    "SampleResult",
    "DecodeBatch",
    "sample_batch",
    "process_logits",
    "prefill_groups",
]


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
        want_logprobs = logprobs is True or (
            isinstance(logprobs, int) and not isinstance(logprobs, bool) and logprobs >= 0
        )
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

    def to_result(self) -> GenerateResult:
        """The contract's ``generate`` result for this row."""
        return GenerateResult(token_ids=self.token_ids, log_probs=self.log_probs, stop_reason=self.stop_reason)


def process_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    row_generators: Optional[Sequence[Optional[torch.Generator]]] = None,
    want_logprobs: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row with per-row sampling parameters.

    Args:
        logits: ``[n, V]`` float32 next-token logits (repetition penalty applied).
        temperature: ``[n]``; rows with 0 decode greedily (argmax, no softmax, no draw).
        top_k: ``[n]`` int64; <= 0 = off.
        top_p: ``[n]`` in (0, 1]; 1 = off.
        generator: RNG for ``torch.multinomial`` of the sampled rows without their own.
        row_generators: ``n`` entries; a row with a generator draws from it alone (one draw
            per token), so its tokens do not depend on the other rows.
        want_logprobs: ``[n]`` bool, rows whose log-prob is needed (``None``: all rows). The
            full-vocabulary ``log_softmax`` runs on these rows only.

    Returns:
        ``(tokens [n] int64, log_probs [n] float32)``: the chosen tokens and, for the rows that
        want them (0 elsewhere), their log-prob under ``log_softmax(logits / T)`` (``T = 1``
        for greedy rows), before top-k/top-p truncation: the quantity verl's
        ``compute_log_prob`` computes at that temperature, so rollout and training log-probs
        are comparable.
    """
    n = logits.shape[0]
    greedy = temperature <= 0
    tokens = logits.argmax(dim=-1)
    sampled_rows = (~greedy).nonzero().squeeze(-1)
    if sampled_rows.numel():
        rows = sampled_rows
        scaled = logits[rows] / temperature[rows, None]
        k_rows, p_rows = top_k[rows], top_p[rows]
        needs_filter = (k_rows > 0) | (p_rows < 1.0)
        if bool(needs_filter.any()):
            scaled = _top_k_top_p(scaled, k_rows, p_rows)
        probs = torch.softmax(scaled, dim=-1)
        gens = [None] * n if row_generators is None else list(row_generators)
        own = [j for j, r in enumerate(rows.tolist()) if gens[r] is not None]
        shared = [j for j, r in enumerate(rows.tolist()) if gens[r] is None]
        drawn = torch.zeros(rows.numel(), dtype=torch.long, device=logits.device)
        if shared:
            drawn[shared] = torch.multinomial(probs[shared], 1, generator=generator).squeeze(-1)
        for j in own:
            drawn[j] = torch.multinomial(probs[j], 1, generator=gens[int(rows[j])])[0]
        tokens[rows] = drawn
    log_probs = torch.zeros(n, device=logits.device)
    lp_rows = torch.arange(n, device=logits.device) if want_logprobs is None else want_logprobs.nonzero().squeeze(-1)
    if lp_rows.numel():
        t = temperature[lp_rows]
        scale = torch.where(t <= 0, torch.ones_like(t), t)
        lp = torch.log_softmax(logits[lp_rows] / scale[:, None], dim=-1)
        log_probs[lp_rows] = lp.gather(-1, tokens[lp_rows, None]).squeeze(-1)
    return tokens, log_probs


def _top_k_top_p(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``scaled`` ``[m, V]`` with tokens outside each row's top-k / nucleus set to -inf (rank 0 always kept)."""
    vocab = scaled.shape[-1]
    sorted_vals, sorted_idx = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=scaled.device)[None, :]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    keep = ranks < k[:, None]
    probs = torch.softmax(sorted_vals.masked_fill(~keep, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    keep &= (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    keep_vocab = torch.zeros_like(keep).scatter(-1, sorted_idx, keep)
    return scaled.masked_fill(~keep_vocab, float("-inf"))


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers >= 5.2x names the KV-cache argument ``cache``; older releases ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def prefill_groups(lengths: Sequence[int], *, max_pad_frac: float = 0.05, max_tokens: int = 8192) -> list[list[int]]:
    """Split prompts into prefill forwards by length so that padding stays small.

    Indices are sorted by length and cut into consecutive runs; a run grows while its
    padded slots (``len(run) * longest - sum``) stay <= ``max_pad_frac`` of its real tokens
    and its padded size <= ``max_tokens`` (bounds activation memory). Returns index lists
    (into ``lengths``) covering every index once.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    run: list[int] = []
    total = 0
    for i in order:
        length = lengths[i]
        cand_total = total + length
        padded = (len(run) + 1) * length  # sorted: this prompt is the run's longest
        if run and (padded - cand_total > max_pad_frac * cand_total or padded > max_tokens):
            groups.append(run)
            run, cand_total = [], length
        run.append(i)
        total = cand_total
    if run:
        groups.append(run)
    return groups


class DecodeBatch:
    """A continuous decoding batch: rows join between steps and leave when done.

    Each row is one request, identified by an opaque ``key``. :meth:`admit` prefills new
    rows in length groups (:func:`prefill_groups`: padding <= 5 % of real tokens) and writes
    their keys/values into the batch's :class:`~.slot_cache.SlotCache` without touching the
    running rows; positions are explicit per row, so rotary embeddings stay exact.
    :meth:`step` samples one token for every live row, returns the rows that finished (EOS
    or ``max_tokens``) and drops them from the batch and cache.

    Needs a model whose layers all use full attention (plain ``DynamicLayer`` caches);
    others (sliding-window, linear attention) are refused with ``NotImplementedError``.
    Repetition-penalty bookkeeping (an ``[n, V]`` seen-matrix) exists only while a live row
    uses a penalty; log-probs are computed only for rows that asked for them.

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
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        probe = DynamicCache(config=model.config)
        if any(type(layer) is not DynamicLayer for layer in probe.layers):
            raise NotImplementedError(
                "the local sampler supports full-attention models only (this model has sliding-window or "
                "linear-attention layers)"
            )
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab = int(model.get_output_embeddings().weight.shape[0])
        self.num_layers = int(model.config.num_hidden_layers)
        self.eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=self.device)
        self.pad_token_id = int(pad_token_id)
        self.generator = generator
        self._cache_kw = _cache_kwarg(model)
        self.keys: list[Any] = []
        self.prefill_tokens = 0  # real tokens of the distinct prompts prefilled (padded-slot statistic)
        self.prefill_rows_shared = 0  # rows admitted with the KV of a prompt prefilled for another row
        self.prefill_slots = 0  # slots the prefill forwards computed (real + padding)
        self._reset_rows()

    def _reset_rows(self) -> None:
        dev = self.device
        self.keys = []
        self.prompts: list[tuple[int, ...]] = []
        self.cache = SlotCache(self.num_layers)
        self.next_pos = torch.zeros(0, dtype=torch.long, device=dev)
        self.logits = torch.zeros((0, self.vocab), device=dev)  # next-token logits of live rows
        self.temperature = torch.zeros(0, device=dev)
        self.top_k = torch.zeros(0, dtype=torch.long, device=dev)
        self.top_p = torch.zeros(0, device=dev)
        self.penalty = torch.zeros(0, device=dev)
        self.max_tokens = torch.zeros(0, dtype=torch.long, device=dev)
        self.want_logprobs = torch.zeros(0, dtype=torch.bool, device=dev)
        self.seen: Optional[torch.Tensor] = None  # [n, V] bool, only while some row has a penalty
        self.count = torch.zeros(0, dtype=torch.long, device=dev)
        self.out_tokens = torch.zeros((0, 0), dtype=torch.long, device=dev)
        self.out_logps = torch.zeros((0, 0), device=dev)
        self.row_generators: list[Optional[torch.Generator]] = []  # per-row streams of seeded requests

    def __len__(self) -> int:
        return len(self.keys)

    @torch.no_grad()
    def _prefill(self, prompts: Sequence[tuple[int, ...]], copies: Sequence[int]) -> torch.Tensor:
        """Prefill distinct ``prompts`` (one length group) once each and write ``copies[i]`` KV rows
        of prompt ``i`` (in order: prompt 0's rows first); returns their ``[sum(copies), V]``
        float logits. A prompt's rows are copies of one forward: exact, not recomputed."""
        from transformers import DynamicCache

        dev = self.device
        m = len(prompts)
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        width = int(lens.max())
        ids = torch.full((m, width), self.pad_token_id, dtype=torch.long, device=dev)
        mask = torch.arange(width, device=dev)[None, :] >= (width - lens)[:, None]
        ids[mask] = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=dev)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        logits = (
            self.model(
                input_ids=ids,
                attention_mask=mask.long(),
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kw: cache},
            )
            .logits[:, -1, :]
            .float()
        )
        rows = torch.repeat_interleave(torch.arange(m, device=dev), torch.tensor(copies, device=dev))
        if rows.numel() == m:
            self.cache.write_rows([(layer.keys, layer.values) for layer in cache.layers], lens)
        else:
            self.cache.write_rows([(layer.keys[rows], layer.values[rows]) for layer in cache.layers], lens[rows])
            logits = logits[rows]
        self.prefill_tokens += int(lens.sum())
        self.prefill_slots += m * width
        self.prefill_rows_shared += int(rows.numel()) - m
        return logits

    @torch.no_grad()
    def admit(self, items: Sequence[tuple[Any, SampleRequest]]) -> list[tuple[Any, SampleResult]]:
        """Prefill ``(key, request)`` pairs and add them to the batch (running rows are not touched).
        Requests with the same prompt share one prefill (their rows copy its keys/values and logits).

        Returns the requests that are already complete (``max_tokens == 0``).
        """
        done = [(k, SampleResult([], [] if r.params.logprobs else None)) for k, r in items if r.params.max_tokens <= 0]
        items = [(k, r) for k, r in items if r.params.max_tokens > 0]
        if not items:
            return done
        rows_of: dict[tuple[int, ...], list[tuple[Any, SampleRequest]]] = {}
        for key, request in items:
            rows_of.setdefault(request.prompt_ids, []).append((key, request))
        prompts = list(rows_of)
        for group in prefill_groups([len(p) for p in prompts]):
            self._add_rows([prompts[i] for i in group], [rows_of[prompts[i]] for i in group])
        return done

    def _add_rows(
        self, prompts: Sequence[tuple[int, ...]], rows: Sequence[Sequence[tuple[Any, SampleRequest]]]
    ) -> None:
        """Prefill distinct ``prompts`` and add ``rows[i]`` (the requests of prompt ``i``) to the batch."""
        dev = self.device
        items = [item for same_prompt in rows for item in same_prompt]
        reqs = [r for _, r in items]
        m = len(reqs)
        logits = self._prefill(prompts, [len(same_prompt) for same_prompt in rows])

        def col(values, dtype=torch.float32):
            return torch.tensor(values, dtype=dtype, device=dev)

        self.keys += [k for k, _ in items]
        self.prompts += [r.prompt_ids for r in reqs]
        self.row_generators += [
            None if r.params.seed is None else torch.Generator(device=dev).manual_seed(r.params.seed) for r in reqs
        ]
        self.next_pos = torch.cat([self.next_pos, col([len(r.prompt_ids) for r in reqs], torch.long)])
        self.logits = torch.cat([self.logits, logits])
        self.temperature = torch.cat([self.temperature, col([r.params.temperature for r in reqs])])
        self.top_k = torch.cat([self.top_k, col([r.params.top_k for r in reqs], torch.long)])
        self.top_p = torch.cat([self.top_p, col([r.params.top_p for r in reqs])])
        self.penalty = torch.cat([self.penalty, col([r.params.repetition_penalty for r in reqs])])
        self.max_tokens = torch.cat([self.max_tokens, col([r.params.max_tokens for r in reqs], torch.long)])
        self.want_logprobs = torch.cat([self.want_logprobs, col([r.params.logprobs for r in reqs], torch.bool)])
        self.count = torch.cat([self.count, torch.zeros(m, dtype=torch.long, device=dev)])
        steps = max(self.out_tokens.shape[1], int(self.max_tokens.max()))
        self.out_tokens = torch.cat([_pad_cols(self.out_tokens, steps, -1), torch.full((m, steps), -1, device=dev)])
        self.out_logps = torch.cat([_pad_cols(self.out_logps, steps, 0.0), torch.zeros((m, steps), device=dev)])
        if self.seen is not None:
            self.seen = torch.cat([self.seen, self._seen_rows(range(len(self.keys) - m, len(self.keys)))])
        elif bool((self.penalty != 1.0).any()):
            self.seen = self._seen_rows(range(len(self.keys)))

    def _seen_rows(self, rows: Sequence[int]) -> torch.Tensor:
        """``[len(rows), V]`` bool: tokens in each row's prompt or output so far."""
        seen = torch.zeros((len(rows), self.vocab), dtype=torch.bool, device=self.device)
        for j, i in enumerate(rows):
            seen[j, torch.tensor(self.prompts[i], dtype=torch.long, device=self.device)] = True
            out = self.out_tokens[i, : int(self.count[i])]
            seen[j, out] = True
        return seen

    @torch.no_grad()
    def step(self) -> list[tuple[Any, SampleResult]]:
        """Sample one token for every live row; return (and drop) the rows that finished."""
        if not self.keys:
            return []
        n = len(self.keys)
        rows = torch.arange(n, device=self.device)
        logits = self.logits
        if self.seen is not None:
            p = self.penalty[:, None]
            logits = torch.where(self.seen, torch.where(logits > 0, logits / p, logits * p), logits)
        tokens, logps = process_logits(
            logits,
            self.temperature,
            self.top_k,
            self.top_p,
            self.generator,
            row_generators=self.row_generators,
            want_logprobs=self.want_logprobs,
        )
        self.out_tokens[rows, self.count] = tokens
        self.out_logps[rows, self.count] = logps
        self.count += 1
        if self.seen is not None:
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
            perm = self.cache.keep((~finished).nonzero().squeeze(-1))
            order = perm.tolist()
            self.keys = [self.keys[i] for i in order]
            self.prompts = [self.prompts[i] for i in order]
            self.row_generators = [self.row_generators[i] for i in order]
            for name in (
                "next_pos",
                "temperature",
                "top_k",
                "top_p",
                "penalty",
                "max_tokens",
                "want_logprobs",
                "count",
                "out_tokens",
                "out_logps",
            ):
                setattr(self, name, getattr(self, name)[perm])
            if self.seen is not None:
                self.seen = self.seen[perm] if bool((self.penalty != 1.0).any()) else None
            tokens = tokens[perm]

        attn = self.cache.begin_step()
        self.logits = (
            self.model(
                input_ids=tokens[:, None],
                attention_mask=attn,
                position_ids=self.next_pos[:, None],
                use_cache=True,
                **{self._cache_kw: self.cache},
            )
            .logits[:, -1, :]
            .float()
        )
        self.cache.end_step()
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

    Cost: prefill forwards over length groups (padding <= 5 % of prompt tokens), then one
    forward of the live rows per generated token; finished rows leave the batch and cache.
    """
    batch = DecodeBatch(model, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, generator=generator)
    results: dict[int, SampleResult] = dict(batch.admit(list(enumerate(requests))))
    while len(batch):
        results.update(batch.step())
    return [results[i] for i in range(len(requests))]
