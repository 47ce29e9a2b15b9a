"""Pure helpers of the remote rollout server: token budgets, sampling params, outputs.

Kept apart from the Ray actor so the rules are unit-tested directly:

* :func:`cap_max_tokens` - how many tokens one request may generate;
* :func:`backend_sampling_params` - verl's sampling dict -> the backend's;
* :func:`check_generate_result` - the backend's answer -> ``TokenOutput`` fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from verl.remote_backend.errors import BackendOutputError
from verl.remote_backend.forwarder.output_checks import check_finite_floats, check_token_ids
from verl.remote_backend.results import as_generate_result

__all__ = ["cap_max_tokens", "backend_sampling_params", "check_generate_result"]


def cap_max_tokens(
    requested: Optional[int],
    prompt_len: int,
    *,
    response_length: int,
    prompt_length: int,
    max_model_len: Optional[int] = None,
) -> int:
    """Tokens a request may generate, as verl's own rollout servers compute it.

    * A request's own ``max_tokens`` is honoured but never exceeds
      ``rollout.response_length``: the trainer's response tensors have that width.
    * Without one, the budget is ``response_length``, shrunk if the prompt ran
      over ``prompt_length`` so prompt + response still fit the trainer's shape.
    * Either way the result fits the context: ``max_model_len - prompt_len``
      (when the context length is known), and is never negative.
    """
    if requested is None:
        budget = min(response_length, prompt_length + response_length - prompt_len)
    else:
        budget = min(int(requested), response_length)
    if max_model_len is not None:
        budget = min(budget, int(max_model_len) - prompt_len)
    return max(0, int(budget))


def backend_sampling_params(sampling_params: Mapping[str, Any], max_tokens: int) -> dict[str, Any]:
    """The ``sampling_params`` dict passed to ``RemoteBackend.generate``.

    Keeps the keys the contract defines (``temperature``, ``top_p``, ``top_k``,
    ``logprobs``, ``repetition_penalty``, ``seed``) with verl's defaults when absent, maps
    ``top_k`` <= 0 to ``-1`` (off) and sets the capped ``max_tokens``. ``seed`` (the
    sample's own random stream, see :mod:`.seeding`) is passed only when set.
    """
    top_k = sampling_params.get("top_k", -1)
    top_k = -1 if top_k is None or int(top_k) <= 0 else int(top_k)
    params: dict[str, Any] = {
        "max_tokens": int(max_tokens),
        "temperature": float(sampling_params.get("temperature", 1.0)),
        "top_p": float(sampling_params.get("top_p", 1.0)),
        "top_k": top_k,
        "logprobs": bool(sampling_params.get("logprobs", False)),
    }
    if sampling_params.get("repetition_penalty") is not None:
        params["repetition_penalty"] = float(sampling_params["repetition_penalty"])
    if sampling_params.get("seed") is not None:
        params["seed"] = int(sampling_params["seed"])
    return params


def check_generate_result(
    result: Any, *, max_tokens: int, want_logprobs: bool, vocab_size: Optional[int] = None
) -> dict[str, Any]:
    """Check a backend's ``generate`` answer against its request; return ``TokenOutput`` kwargs.

    Raises:
        BackendOutputError (a ``ValueError``): not a :class:`GenerateResult` (nor a legacy
            dict), ids outside ``[0, vocab_size)`` (when given), more than ``max_tokens``
            tokens, log-probs asked for but missing, or NaN/Inf log-probs.
    """
    result = as_generate_result(result, "backend generate()")
    token_ids = result.token_ids
    if len(token_ids) > max_tokens:
        raise BackendOutputError(f"backend generate() returned {len(token_ids)} tokens but max_tokens was {max_tokens}")
    check_token_ids(token_ids, vocab_size=vocab_size, where="backend generate()")
    if result.log_probs is not None:
        check_finite_floats(result.log_probs, "backend generate() log_probs")
    elif want_logprobs and token_ids:
        raise BackendOutputError("backend generate() was asked for log-probs (logprobs=True) but returned none")
    return {
        "token_ids": token_ids,
        "log_probs": result.log_probs if want_logprobs else None,
        "stop_reason": result.stop_reason,
    }
