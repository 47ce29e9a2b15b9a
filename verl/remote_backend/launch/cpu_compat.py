"""Let verl's padding helpers run on a machine without ``flash_attn``.

On the new worker path verl pads and unpads batches on the driver and in the forwarders through
``verl.utils.attention_utils``, which on CUDA imports ``flash_attn.bert_padding``; CPU-only
driver and forwarder processes lack it. ``transformers`` ships pure-torch equivalents with the
same signatures, and this module points verl at them without editing verl or faking ``flash_attn``.
"""

from __future__ import annotations

import importlib.util
from typing import Callable

__all__ = ["install_flash_attn_fallback", "flash_attn_fallback_installed"]

_MARK = "_verl_remote_backend_fallback"


def _torch_attention_functions() -> tuple[Callable, Callable, Callable, Callable]:
    from einops import rearrange
    from transformers.modeling_flash_attention_utils import _index_first_axis, _pad_input, _unpad_input

    return _index_first_axis, _pad_input, rearrange, _unpad_input


setattr(_torch_attention_functions, _MARK, True)


def flash_attn_fallback_installed() -> bool:
    """True when verl's attention helpers currently resolve to the pure-torch fallback."""
    from verl.utils import attention_utils

    return getattr(attention_utils._get_attention_functions, _MARK, False)


def install_flash_attn_fallback() -> bool:
    """Route verl's pad/unpad helpers to pure torch if ``flash_attn`` is missing.

    Swaps verl's loader function (looked up at call time) for one returning the pure-torch
    helpers; no fake ``flash_attn`` module is created, so code probing for flash-attn is not
    misled. Idempotent; call it in every process that pads/unpads verl batches.

    Returns True when the fallback is (now or already) in place, False when the
    real ``flash_attn`` (or an NPU) serves them.
    """
    from verl.utils import attention_utils
    from verl.utils.device import is_torch_npu_available

    if flash_attn_fallback_installed():
        return True
    if is_torch_npu_available(check_device=False) or importlib.util.find_spec("flash_attn") is not None:
        return False
    attention_utils._get_attention_functions = _torch_attention_functions
    return True
