"""Resolve a model spec: a preset name, a Hugging Face directory, or a .gguf file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import ModelConfig
from ..errors import UnsupportedModelError
from .gguf_loader import load_gguf
from .params import ModelWeights
from .presets import PRESETS, random_weights
from .tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, has_tokenizer_files
from .weights import load_hf_weights, read_hf_config


@dataclass
class Checkpoint:
    config: ModelConfig
    weights: ModelWeights
    tokenizer: Tokenizer | None     # None: a directory without tokenizer files (use token ids)
    source: str


def load_checkpoint(spec: str, *, dtype: torch.dtype, device: torch.device | str, seed: int = 0,
                    with_tokenizer: bool = True) -> Checkpoint:
    """`spec`: a preset name (random weights, byte tokenizer), a checkpoint directory, or a .gguf file."""
    if spec in PRESETS:
        config = PRESETS[spec]
        return Checkpoint(config, random_weights(config, dtype=dtype, device=device, seed=seed),
                          ByteTokenizer(), f"preset:{spec}")
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        config, weights = load_gguf(path, dtype=dtype, device=device)
        tok = HFTokenizer.from_gguf(path, config.eos_token_ids) if with_tokenizer else None
        return Checkpoint(config, weights, tok, str(path))
    if path.is_dir():
        config = read_hf_config(path)
        weights = load_hf_weights(path, config, dtype=dtype, device=device)
        tok = HFTokenizer.from_dir(path, config.eos_token_ids) \
            if with_tokenizer and has_tokenizer_files(path) else None
        return Checkpoint(config, weights, tok, str(path))
    raise UnsupportedModelError(
        f"model {spec!r} is neither a preset ({', '.join(sorted(PRESETS))}), a checkpoint directory "
        "with config.json, nor a .gguf file"
    )
