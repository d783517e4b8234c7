"""Hugging Face checkpoint directories: `config.json` + single or sharded `*.safetensors`.

Reads local files only (no hub). Unsupported architectures and options are refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..config import Architecture, ModelConfig, RopeScaling
from ..errors import UnsupportedModelError
from .params import ModelWeights

_MODEL_TYPES = {"llama": Architecture.LLAMA, "qwen2": Architecture.QWEN2, "qwen3": Architecture.QWEN3}


def read_hf_config(path: Path) -> ModelConfig:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UnsupportedModelError(f"{path}: no config.json; expected a Hugging Face checkpoint directory")
    try:
        values = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UnsupportedModelError(f"{config_file} is not valid JSON ({exc}); pass a Hugging Face checkpoint "
                                    "directory whose config.json is intact") from exc
    if not isinstance(values, dict):
        raise UnsupportedModelError(f"{config_file} holds a JSON {type(values).__name__}, not an object; "
                                    "pass a Hugging Face checkpoint directory")
    try:
        return model_config_from_hf(values, source=str(path))
    except KeyError as exc:
        raise UnsupportedModelError(f"{config_file} has no {exc.args[0]!r}; pass a complete Hugging Face "
                                    "config.json") from exc


def model_config_from_hf(d: dict[str, Any], *, source: str = "config") -> ModelConfig:
    model_type = d.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise UnsupportedModelError(
            f"{source}: model_type {model_type!r} (architectures {d.get('architectures')}) is not "
            f"supported; supported model types: {sorted(_MODEL_TYPES)}"
        )
    _refuse_options(d, source)
    theta, scaling = _rope(d, source)
    eos = d.get("eos_token_id")
    heads = d["num_attention_heads"]
    return ModelConfig(
        architecture=_MODEL_TYPES[model_type],
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        num_layers=d["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=d.get("num_key_value_heads") or heads,
        head_dim=d.get("head_dim") or d["hidden_size"] // heads,
        intermediate_size=d["intermediate_size"],
        max_position_embeddings=d["max_position_embeddings"],
        rms_norm_eps=d.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
    )


def _refuse_options(d: dict[str, Any], source: str) -> None:
    found = {
        "hidden_act": (d.get("hidden_act", "silu"), "silu"),
        "attention_bias": (d.get("attention_bias", False), False),
        "mlp_bias": (d.get("mlp_bias", False), False),
        "use_sliding_window": (d.get("use_sliding_window", False), False),
    }
    if d.get("model_type") == "qwen2":
        del found["attention_bias"]   # Qwen2 always has q/k/v biases (none on o), whatever this key says
    for key, (value, wanted) in found.items():
        if value != wanted:
            raise UnsupportedModelError(f"{source}: {key}={value!r} is not supported (only {wanted!r})")


def _rope(d: dict[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    """transformers 5 writes `rope_parameters`; older files `rope_theta` + `rope_scaling`."""
    params = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise UnsupportedModelError(f"{source}: rope_type {rope_type!r} is not supported "
                                    "(supported: 'default', 'llama3')")
    return theta, RopeScaling(
        factor=params["factor"], low_freq_factor=params["low_freq_factor"],
        high_freq_factor=params["high_freq_factor"],
        original_max_position_embeddings=params["original_max_position_embeddings"],
    )


def load_hf_weights(path: Path, config: ModelConfig, *, dtype: torch.dtype,
                    device: torch.device | str) -> ModelWeights:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"{path}: no *.safetensors files (other weight formats are not supported)")
    handles = [safe_open(str(f), framework="pt") for f in files]
    where = {name: h for h in handles for name in h.keys()}

    def get(name: str) -> torch.Tensor:
        if name not in where:
            raise UnsupportedModelError(f"{path}: tensor {name!r} is missing from the checkpoint")
        return where[name].get_tensor(name)

    return ModelWeights.from_hf_names(config, get, dtype=dtype, device=device)
