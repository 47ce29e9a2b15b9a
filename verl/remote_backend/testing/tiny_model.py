"""Build a tiny Qwen2-style causal LM and a byte-level BPE tokenizer on disk.

Where model weights cannot be downloaded, a random 2-layer model is all an integration run
needs. The result is a normal Hugging Face model directory (``config.json``, ``model.safetensors``,
tokenizer files with a chat template), loadable with ``from_pretrained``.
Command line: ``python -m verl.remote_backend.testing.tiny_model OUT_DIR [--hidden 64 --layers 2]``.
"""

from __future__ import annotations

import argparse
import os
from typing import Optional

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen-style chat template: <|im_start|>role\ncontent<|im_end|>\n ...
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _training_corpus() -> list[str]:
    """A fixed, deterministic corpus of arithmetic word-problem text."""
    words = (
        "the a an of to and in is was for on that with as at by from he she they it his her their "
        "how many much more less than each every total left after before per day week year hour minute "
        "dollars cents apples books students pages miles cookies eggs boxes friends money buys sells "
        "has have had gives gets makes spends earns costs pays twice half times what if then so answer "
        "let's think step by step first second finally therefore #### + - * / = ( ) . , ? ! : $ %"
    ).split()
    lines = []
    for i in range(400):
        a, b = (i * 7919) % 997, (i * 104729) % 389
        chunk = " ".join(words[(i * k) % len(words)] for k in range(1, 13))
        lines.append(f"{chunk} {a} + {b} = {a + b}. #### {a + b}")
        lines.append(f"Question: {chunk}? Answer: {a} * {i % 13} = {a * (i % 13)} #### {a * (i % 13)}")
    return lines


def build_tiny_tokenizer(out_dir: str, vocab_size: int = 512):
    """Train and save a byte-level BPE tokenizer with Qwen-style special tokens.

    Returns the ``PreTrainedTokenizerFast``; ``eos_token`` is ``<|im_end|>``,
    ``pad_token`` is ``<|endoftext|>``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
    )
    fast.chat_template = CHAT_TEMPLATE
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def build_tiny_model(
    out_dir: str,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: Optional[int] = None,
    max_position_embeddings: int = 4096,
    vocab_size: int = 512,
    seed: int = 0,
    architecture: str = "qwen2",
) -> str:
    """Write a randomly initialised causal LM + tokenizer to ``out_dir``.

    ``architecture``: ``"qwen2"`` (what the local engine and Arctic's tests use), ``"qwen3"`` (for Arctic's
    ZoRRo Train, which supports Qwen3 families only) or ``"llama"`` (for servers that load Llama but not
    Qwen2, e.g. skyrl's JAX Tinker backend). Deterministic
    for a given ``seed`` and sizes. Returns ``out_dir``.
    """
    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    classes = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }
    if architecture not in classes:
        raise ValueError(f"architecture={architecture!r}: expected one of {sorted(classes)}")
    config_cls, model_cls = classes[architecture]

    tokenizer = build_tiny_tokenizer(out_dir, vocab_size=vocab_size)
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
        # Qwen3's default head_dim is 128 whatever the width; the others derive it from hidden / heads
        **({"head_dim": hidden_size // num_heads} if architecture == "qwen3" else {}),
    )
    torch.manual_seed(seed)
    model = model_cls(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--architecture", choices=["qwen2", "qwen3", "llama"], default="qwen2")
    args = parser.parse_args(argv)
    build_tiny_model(
        args.out_dir,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        vocab_size=args.vocab,
        seed=args.seed,
        architecture=args.architecture,
    )
    print(args.out_dir)


if __name__ == "__main__":
    main()
