"""Token-in/token-out generation over Arctic's text-prompt ``/generate`` (no network here).

Arctic RL's ``/generate`` takes *text* prompts and tokenizes them itself, but answers with the
sampler's own ``token_ids``. verl hands over token ids, so this module owns the proof that a
prompt survives ``ids -> text -> the server's tokenization`` unchanged, and the parsing of the
results into the contract's ``GenerateResult``. Completions are never re-tokenized.
"""

from __future__ import annotations

from typing import Any

from verl.remote_backend.results import GenerateResult
from verl.remote_backend.settings import select
from verl.workers.remote_client.arctic.errors import ArcticResponseError, PromptRoundTripError
from verl.workers.remote_client.arctic.responses import require

__all__ = ["load_tokenizer", "prompt_text", "parse_result"]


def load_tokenizer(main_config: Any) -> Any:
    """The tokenizer verl uses (``model.tokenizer_path`` or ``model.path``)."""
    from transformers import AutoTokenizer

    model = "actor_rollout_ref.model"
    path = select(main_config, f"{model}.tokenizer_path") or select(main_config, f"{model}.path")
    return AutoTokenizer.from_pretrained(path, trust_remote_code=bool(select(main_config, f"{model}.trust_remote_code", False)))


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
            f"(first difference at position {at}: {ids[at:at + 4]} became {again[at:at + 4]}; lengths "
            f"{len(ids)} vs {len(again)}). Check remote_backend.arctic.generate.add_special_tokens or the prompt."
        )
    return text


def parse_result(result: Any, *, want_logprobs: bool) -> GenerateResult:
    """One ``/generate`` result -> the contract's :class:`GenerateResult`."""
    token_ids = require(result, "token_ids", op="generate", where="generate result", kind=list)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in token_ids):
        raise ArcticResponseError("Arctic generate: generate result.token_ids must be a list of ints")
    log_probs = _sampled_logprobs(result, token_ids) if want_logprobs else None
    finish = result.get("finish_reason")
    return GenerateResult(token_ids, log_probs, "aborted" if finish == "abort" else "completed")


def _sampled_logprobs(result: dict, token_ids: list[int]) -> list[float]:
    """Per-token log-probs of the sampled tokens from a generate result (floats, or vLLM-style dicts)."""
    raw = result.get("logprobs")
    if not isinstance(raw, list) or len(raw) != len(token_ids):
        raise ArcticResponseError(
            "Arctic generate: log-probs were requested (rollout.calculate_log_probs) but the result's 'logprobs' "
            f"is {type(raw).__name__} of length {len(raw) if isinstance(raw, list) else 'n/a'}, expected "
            f"{len(token_ids)} entries"
        )
    out = []
    for tok, entry in zip(token_ids, raw):
        if isinstance(entry, dict):
            entry = entry.get(tok, entry.get(str(tok)))
            entry = entry.get("logprob") if isinstance(entry, dict) else entry
        if not isinstance(entry, (int, float)):
            raise ArcticResponseError(f"Arctic generate: log-prob entry for token {tok} is {entry!r}, expected a float")
        out.append(float(entry))
    return out
