"""Resolve a model spec: a preset name, a real model fetched by name, a Hugging Face directory, or a
.gguf file. `open_model` reads only the configuration (cheap: a preflight can run on it), and
`load_checkpoint` builds the weights from it without parsing the file again."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from ..config import ModelConfig
from ..errors import UnsupportedModelError
from .gguf_loader import gguf_model_config, load_gguf, open_gguf
from .params import ModelWeights
from .presets import PRESETS, random_weights
from .tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, has_tokenizer_files
from .weights import load_hf_weights, read_hf_config


def _fetcher(name: str) -> Callable[[bool], Path]:
    def fetch(progress: bool) -> Path:
        from ..fetch import fetch_model

        return fetch_model(name, progress=progress)

    return fetch


# Real models known by name: fetched into the local cache on first use (the argument: show progress).
REAL_MODELS: dict[str, Callable[[bool], Path]] = {name: _fetcher(name) for name in ("smollm2", "qwen2.5-coder-0.5b")}


def model_names() -> list[str]:
    """Every name `--model` takes besides a path: presets (random weights), then real models."""
    return [*PRESETS, *REAL_MODELS]


@dataclass
class ModelSource:
    """A model spec resolved to its configuration; `random` is True for presets (random weights)."""

    spec: str
    config: ModelConfig
    random: bool
    path: Path | None = None
    gguf_reader: object | None = None   # the parsed GGUF file, reused to load the weights
    progress: bool = False              # say on stderr what takes seconds (parsing, tokenizer conversion)

    @cached_property
    def tokenizer(self) -> Tokenizer | None:
        """Bytes for presets, the file's own for checkpoints; None: a directory without tokenizer files."""
        if self.random:
            return ByteTokenizer()
        assert self.path is not None
        if self.gguf_reader is not None:
            _say(self.progress, f"tokenizer of {self.path.name} (converted on first use, ~4 s, then cached)")
            return HFTokenizer.from_gguf(self.path, self.config.eos_token_ids)
        return HFTokenizer.from_dir(self.path, self.config.eos_token_ids) if has_tokenizer_files(self.path) else None


@dataclass
class Checkpoint:
    config: ModelConfig
    weights: ModelWeights
    tokenizer: Tokenizer | None     # None: a directory without tokenizer files (use token ids)
    source: str


def open_model(spec: str, *, progress: bool = False) -> ModelSource:
    """Read the configuration of `spec` (fetching a real model by name); raises UnsupportedModelError."""
    if spec in PRESETS:
        return ModelSource(spec, PRESETS[spec], random=True)
    path = REAL_MODELS[spec](progress) if spec in REAL_MODELS else Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        _say(progress, f"reading {path.name} ({path.stat().st_size / 1e6:.0f} MB)")
        reader = open_gguf(path)
        return ModelSource(spec, gguf_model_config(reader, source=str(path)), False, path, reader, progress)
    if path.is_dir():
        return ModelSource(spec, read_hf_config(path), False, path, progress=progress)
    raise UnsupportedModelError(
        f"model {spec!r} is neither a preset or model name ({', '.join(model_names())}), a checkpoint "
        "directory with config.json, nor a .gguf file; pass one of those"
    )


def _say(progress: bool, text: str) -> None:
    if progress:
        print(f"pulseio-engine: {text}", file=sys.stderr)


def load_checkpoint(spec: str | ModelSource, *, dtype: torch.dtype, device: torch.device | str, seed: int = 0,
                    with_tokenizer: bool = True, progress: bool = False) -> Checkpoint:
    """Build the weights (and tokenizer) of `spec`: a preset name (random weights, byte tokenizer), a
    real model's name, a checkpoint directory, a .gguf file, or what `open_model` returned."""
    src = spec if isinstance(spec, ModelSource) else open_model(spec)
    config, path = src.config, src.path
    if src.random:
        weights = random_weights(config, dtype=dtype, device=device, seed=seed, progress=progress)
    elif src.gguf_reader is not None:
        assert path is not None
        _, weights = load_gguf(path, dtype=dtype, device=device, reader=src.gguf_reader, progress=progress)
    else:
        assert path is not None
        weights = load_hf_weights(path, config, dtype=dtype, device=device)
    tokenizer = src.tokenizer if with_tokenizer else None
    return Checkpoint(config, weights, tokenizer, f"preset:{src.spec}" if src.random else str(path))
