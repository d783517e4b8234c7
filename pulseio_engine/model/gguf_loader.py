"""GGUF files (llama.cpp's format) through the `gguf` package: metadata -> ModelConfig, tensors
dequantized to the target dtype under Hugging Face names.

llama.cpp's converter permutes the rows of Llama's q and k projections (to match its own rotary
layout, pairs (i, i + D/2) -> (2i, 2i + 1)); we undo it exactly as transformers' GGUF loader does,
so the weights meet our rotate_half rotary. Qwen2 and Qwen3 files are not permuted. k-quants
(Q4_K, Q6_K, as in Q4_K_M files) and the legacy quants dequantize through `gguf.quants.dequantize`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..config import Architecture, ModelConfig
from ..errors import UnsupportedModelError
from .params import ModelWeights

_ARCHS = {"llama": Architecture.LLAMA, "qwen2": Architecture.QWEN2, "qwen3": Architecture.QWEN3}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _reader(path: Path):  # noqa: ANN202
    try:
        import gguf
    except ImportError as exc:
        raise ImportError("loading a .gguf file needs the `gguf` package (pip install 'pulseio[engine]')") from exc
    return gguf.GGUFReader(str(path))


def open_gguf(path: Path):  # noqa: ANN201 (gguf.GGUFReader, imported lazily)
    """Parse `path` once (metadata and tensor index; ~2 s for SmolLM2); refuses a file that is not GGUF."""
    try:
        return _reader(path)
    except (ValueError, OSError, KeyError, IndexError) as exc:
        raise UnsupportedModelError(f"{path} is not a readable GGUF file ({exc}); pass a llama.cpp .gguf "
                                    "file, a checkpoint directory or a preset name") from exc


def _field(reader, key: str, default=None):  # noqa: ANN001, ANN202
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def gguf_model_config(reader, *, source: str) -> ModelConfig:  # noqa: ANN001
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHS:
        raise UnsupportedModelError(f"{source}: GGUF architecture {arch!r} is not supported; "
                                    f"supported: {sorted(_ARCHS)}")
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise UnsupportedModelError(f"{source}: rope_freqs (Llama 3.1 rope scaling stored as a tensor) is not "
                                    "supported in GGUF files; load the Hugging Face checkpoint instead")
    heads = _field(reader, f"{arch}.attention.head_count")
    hidden = _field(reader, f"{arch}.embedding_length")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        architecture=_ARCHS[arch],
        vocab_size=_field(reader, f"{arch}.vocab_size") or len(tokens.data),
        hidden_size=hidden,
        num_layers=_field(reader, f"{arch}.block_count"),
        num_heads=heads,
        num_kv_heads=_field(reader, f"{arch}.attention.head_count_kv", heads),
        head_dim=_field(reader, f"{arch}.attention.key_length", hidden // heads),
        intermediate_size=_field(reader, f"{arch}.feed_forward_length"),
        max_position_embeddings=_field(reader, f"{arch}.context_length"),
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def _hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")          # blk.N.attn_q.weight | token_embd.weight
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_LAYER_NAMES.get(parts[2], parts[2])}.{parts[3]}"
    return f"{_GLOBAL_NAMES.get(parts[0], parts[0])}.{parts[1]}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation. w: [n_head * D, H]."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def load_gguf(path: Path, *, dtype: torch.dtype, device: torch.device | str, reader=None,  # noqa: ANN001
              progress: bool = False) -> tuple[ModelConfig, ModelWeights]:
    """`reader`: the file as `open_gguf` parsed it (parsed here if None); `progress`: a bar per tensor."""
    from gguf.quants import dequantize
    from tqdm import tqdm

    reader = reader if reader is not None else open_gguf(path)
    config = gguf_model_config(reader, source=str(path))
    tensors = {_hf_name(t.name): t for t in reader.tensors}
    bar = tqdm(total=len(tensors), desc=f"loading {path.name}", unit="tensor", disable=not progress, leave=False)

    def get(name: str) -> torch.Tensor:
        if name not in tensors:
            raise UnsupportedModelError(f"{path}: tensor {name!r} is missing from the GGUF file")
        t = tensors[name]
        w = dequantize(t.data, t.tensor_type).reshape([int(n) for n in reversed(t.shape)])
        if config.architecture is Architecture.LLAMA and name.endswith("q_proj.weight"):
            w = _unpermute(w, config.num_heads)
        elif config.architecture is Architecture.LLAMA and name.endswith("k_proj.weight"):
            w = _unpermute(w, config.num_kv_heads)
        bar.update()
        return torch.from_numpy(np.array(w, dtype=np.float32))   # a writable copy, off the mmap

    with bar:
        return config, ModelWeights.from_hf_names(config, get, dtype=dtype, device=device)
