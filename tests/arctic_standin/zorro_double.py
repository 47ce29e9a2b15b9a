"""CPU double of ZoRRo Train's patched model forward (tests only).

Arctic's ``zorro_train`` model patch (``arctic_platform.model.patches.zorro_train``) replaces the causal LM's
forward with ``Qwen3ModelOncePatcher``'s, which runs flash-attention kernels and prompt de-duplication: it cannot
run on a CPU. This double is registered in its place (:func:`install`, in each DeepSpeed worker process) and is
as strict as the real patch where the adapter can get it wrong:

* the model check is Arctic's own ``get_supported_model_type`` (Qwen3 families only; ``qwen2`` is refused as on
  a GPU);
* the temperature is the one the patch was built with (``ZorroTrainPatch.temperature``); a per-call
  ``temperature`` keyword is ignored, as the real patched forward ignores it;
* the input is the padded ``[B, S]`` batch; the output is ``logprobs`` (and ``entropy`` when
  ``calculate_entropy``) of the last ``response_len`` columns, token-aligned (value ``k`` = log p(response token
  ``k``)), flattened row-major to ``[1, N]`` over the response mask.
"""

from __future__ import annotations

from types import MethodType, SimpleNamespace
from typing import Any, Optional

import torch


def zorro_forward_double(model: torch.nn.Module, ctx: Any) -> None:
    """The ``zorro_train`` patch: check the model type, then swap in the response-only forward."""
    from arctic_platform.rl.zorro_train.qwen_model_patcher import get_supported_model_type

    get_supported_model_type(model)
    settings = ctx.spec.patches.zorro_train
    response_len = int(settings.response_len)
    built_temperature = float(settings.temperature if settings.temperature is not None else 1.0)
    plain_forward = model.forward

    def forward(
        self: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.Tensor] = None,
        calculate_entropy: bool = False,
        **_: Any,
    ) -> Any:
        if attention_mask is None or input_ids.dim() != 2:
            raise ValueError("ZoRRo forward needs the padded [B, S] input_ids and attention_mask")
        width = input_ids.shape[1]
        start = width - response_len
        if start < 1:
            raise ValueError(f"ZoRRo response_len={response_len} leaves no prompt column in width {width}")
        logits = plain_forward(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).logits
        logits = logits[:, start - 1 : width - 1].float() / built_temperature
        log_probs = torch.log_softmax(logits, dim=-1)
        mask = attention_mask[:, start:].bool()
        picked = log_probs.gather(-1, input_ids[:, start:].unsqueeze(-1)).squeeze(-1)
        out = SimpleNamespace(logprobs=picked[mask].unsqueeze(0))
        if calculate_entropy:
            out.entropy = (-(log_probs.exp() * log_probs).sum(-1))[mask].unsqueeze(0)
        return out

    model.forward = MethodType(forward, model)
    model._arctic_zorro_once_patcher = None


def install() -> None:
    """Register the double as Arctic's ``zorro_train`` patch (idempotent; call in the worker process)."""
    from arctic_platform.model import patch
    from arctic_platform.model.patches import zorro_train  # noqa: F401  (registers the real patch first)

    patch._PATCHES["zorro_train"] = zorro_forward_double
