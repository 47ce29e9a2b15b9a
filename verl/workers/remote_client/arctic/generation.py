"""Token-in/token-out generation over Arctic's text-prompt ``/generate`` (no network here).

Arctic RL's ``/generate`` takes *text* prompts and tokenizes them itself, but answers with the
sampler's own ``token_ids``. verl hands over token ids, so this module owns the proof that a
prompt survives ``ids -> text -> the server's tokenization`` unchanged, and the parsing of the
results into the contract's ``GenerateResult``. Completions are never re-tokenized.
"""

from __future__ import annotations

import math
from typing import Any

from verl.remote_backend.results import GenerateResult
from verl.remote_backend.settings.loader import select
from verl.workers.remote_client.arctic.errors import ArcticResponseError, PromptRoundTripError
from verl.workers.remote_client.arctic.responses import require

__all__ = ["load_tokenizer", "prompt_text", "parse_result"]


def load_tokenizer(main_config: Any) -> Any:
    """The tokenizer verl uses (``model.tokenizer_path`` or ``model.path``)."""
    from transformers import AutoTokenizer

    model = "actor_rollout_ref.model"
    path = select(main_config, f"{model}.tokenizer_path") or select(main_config, f"{model}.path")
    return AutoTokenizer.from_pretrained(
        path, trust_remote_code=bool(select(main_config, f"{model}.trust_remote_code", False))
    )


def prompt_text(tokenizer: Any, ids: list[int], *, add_special_tokens: bool) -> str:
    """``ids`` as text that the server's tokenization turns back into exactly ``ids``.

    Raises:
        PromptRoundTripError: naming the first differing position.
    """
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    again = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
    if again != ids:
        at = next((i for i, (a, b) in enumerate(zip(ids, again)) if a != b), min(len(ids), len(again)))
        raise PromptRoundTripError(
            f"Arctic's /generate takes text: prompt ids -> text -> ids is not exact for this tokenizer "
            f"(first difference at position {at}: {ids[at : at + 4]} became {again[at : at + 4]}; lengths "
            f"{len(ids)} vs {len(again)}). Check remote_backend.arctic.generate.add_special_tokens or the prompt."
        )
    return text


def parse_result(result: Any, *, want_logprobs: bool, wire: str = "http") -> GenerateResult:
    """One ``/generate`` result -> the contract's :class:`GenerateResult`.

    ``wire``: ``"http"`` (token ids in the log-prob dicts are strings, from Arctic's JSON wire) or
    ``"ray"`` (the sampler's own int ids: Arctic's Ray server hands the result over unserialized).
    """
    token_ids = require(result, "token_ids", op="generate", where="generate result", kind=list)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in token_ids):
        raise ArcticResponseError("Arctic generate: generate result.token_ids must be a list of ints")
    log_probs = _sampled_logprobs(result, token_ids, int if wire == "ray" else str) if want_logprobs else None
    finish = result.get("finish_reason")
    return GenerateResult(token_ids, log_probs, "aborted" if finish == "abort" else "completed")


def _sampled_logprobs(result: dict, token_ids: list[int], key_type: type = str) -> list[float]:
    """Per-token log-probs of the sampled tokens from a generate result.

    Arctic's sampler worker serializes vLLM's sample log-probs as one dict per generated token,
    ``{token_id: {"logprob": float, "rank": int}}`` (the sampled token, plus the top ``logprobs``
    ones); over HTTP its JSON wire turns the ids into strings (``key_type=str``), over Ray they stay
    ints (``key_type=int``). Anything else is refused: a bare float per token is not a shape the
    server produces, and a key of the other type is not what that transport delivers.
    """
    raw = result.get("logprobs")
    if not isinstance(raw, list) or len(raw) != len(token_ids):
        raise ArcticResponseError(
            "Arctic generate: log-probs were requested (rollout.calculate_log_probs) but the result's 'logprobs' "
            f"is {type(raw).__name__} of length {len(raw) if isinstance(raw, list) else 'n/a'}, expected "
            f"{len(token_ids)} entries"
        )
    return [_sampled_logprob(entry, tok, i, key_type) for i, (tok, entry) in enumerate(zip(token_ids, raw))]


def _sampled_logprob(entry: Any, tok: int, i: int, key_type: type = str) -> float:
    where = f"Arctic generate: generate result.logprobs[{i}]"
    if not isinstance(entry, dict):
        raise ArcticResponseError(
            f"{where} is {type(entry).__name__} {entry!r:.80}, expected a dict mapping token ids (strings) to "
            "{'logprob': float, 'rank': int}, as Arctic's sampler returns vLLM's log-probs"
        )
    odd = next((k for k in entry if type(k) is not key_type), None)
    if odd is not None:
        how = "as strings over Arctic's JSON wire" if key_type is str else "as ints from Arctic's Ray server"
        raise ArcticResponseError(f"{where} has a {type(odd).__name__} key {odd!r}; token ids arrive {how}")
    key = key_type(tok)
    if key not in entry:
        shown = ", ".join(sorted((str(k) for k in entry), key=lambda k: (len(k), k))[:8]) or "none"
        raise ArcticResponseError(f"{where} has no entry for the sampled token {tok} (token ids present: {shown})")
    item = entry[key]
    value = item.get("logprob") if isinstance(item, dict) else None
    if isinstance(value, bool) or not isinstance(value, float) or not math.isfinite(value):
        raise ArcticResponseError(
            f"{where}[{str(tok)!r}] for the sampled token {tok} is {item!r:.80}, "
            f"expected {{'logprob': <finite float>, ...}}"
        )
    if value > 0.0:
        raise ArcticResponseError(
            f"{where}: the sampled token {tok} has 'logprob' {value} > 0, not a log-probability (a sampler with vLLM "
            "logprobs_mode raw_logits / processed_logits returns logits there)"
        )
    rank = item.get("rank")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise ArcticResponseError(f"{where}: the sampled token {tok} has rank {rank!r}, expected an int >= 1")
    return value
