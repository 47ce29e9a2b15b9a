"""Up-front checks of verl's train/val parquet files, run on the driver before Ray starts.

verl's ``RLHFDataset`` discovers a missing prompt column, empty prompts or (with
``data.filter_overlong_prompts=false``) prompts longer than ``data.max_prompt_length``
only inside its workers, tens of seconds after launch, as raw tracebacks or as a
0-token generation budget. These checks read the same files first and name the file,
the number of bad rows, the first bad row and the keys that fix it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterable, Optional

from verl.remote_backend.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["check_data_files"]


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def check_data_files(config: "DictConfig", tokenizer: Optional[Any] = None) -> None:
    """Check every local ``data.train_files`` / ``data.val_files`` parquet file.

    Args:
        config: verl's composed config (reads ``data.{train_files, val_files, prompt_key,
            max_prompt_length, filter_overlong_prompts, apply_chat_template_kwargs}``).
        tokenizer: the model's tokenizer, for the length check; ``None`` skips it.

    Raises:
        ConfigError: a file without the prompt column, with empty prompts, or - when
            ``filter_overlong_prompts`` is false - with prompts whose chat-templated length
            exceeds ``max_prompt_length``.
    """
    data = config.data
    key = str(data.get("prompt_key", "prompt"))
    limit = int(data.get("max_prompt_length", 1024))
    check_length = tokenizer is not None and not bool(data.get("filter_overlong_prompts", True))
    template_kwargs = dict(data.get("apply_chat_template_kwargs") or {})
    for setting in ("data.train_files", "data.val_files"):
        for path in _files(data.get(setting.split(".", 1)[1])):
            if "://" in path or not path.endswith(".parquet") or not os.path.isfile(path):
                continue  # remote or non-parquet files: verl's loader reports on them itself
            prompts = _read_prompts(path, key, setting)
            _check_prompts(path, key, prompts)
            if check_length:
                _check_lengths(path, prompts, tokenizer, limit, template_kwargs)


def _read_prompts(path: str, key: str, setting: str) -> list:
    import pyarrow.parquet as pq

    columns = pq.read_schema(path).names
    if key not in columns:
        raise ConfigError(
            f"{setting}: {path} has no {key!r} column (data.prompt_key={key!r}; its columns: {columns}). Fix: set "
            "data.prompt_key to the column holding the chat messages, or prepare the file with "
            "examples/gsm8k_remote/prepare_gsm8k.py"
        )
    return pq.read_table(path, columns=[key]).column(key).to_pylist()


def _is_empty(prompt: Any) -> bool:
    if prompt is None:
        return True
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, (list, tuple)):
        return not prompt or all(not str((m or {}).get("content", "")).strip() for m in prompt)
    return False


def _check_prompts(path: str, key: str, prompts: list) -> None:
    empty = [i for i, p in enumerate(prompts) if _is_empty(p)]
    if not prompts:
        raise ConfigError(f"{path} has no rows. Fix: point data.train_files/val_files at a prepared file")
    if empty:
        raise ConfigError(
            f"{path}: {len(empty)} of {len(prompts)} rows have an empty {key!r} (first: row {empty[0]}). "
            "Fix: drop those rows from the file (verl would fail on them inside its data workers)"
        )


def _check_lengths(path: str, prompts: Iterable, tokenizer: Any, limit: int, template_kwargs: dict) -> None:
    over, longest, first = 0, 0, None
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        ids = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True, **template_kwargs)
        n = len(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5 returns a BatchEncoding
        if n > limit:
            over += 1
            longest = max(longest, n)
            first = i if first is None else first
    if over:
        raise ConfigError(
            f"{path}: {over} prompt(s) are longer than data.max_prompt_length={limit} tokens after the chat template "
            f"(longest {longest}, first: row {first}), and data.filter_overlong_prompts=false keeps them: they would "
            f"get no room to generate. Fix: set data.filter_overlong_prompts=true, or data.max_prompt_length>={longest}"
        )
