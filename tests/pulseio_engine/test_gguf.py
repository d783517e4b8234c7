"""GGUF loading through the `gguf` package: tiny files written the way llama.cpp writes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hf_models import prefill_logits, write_tiny_checkpoint

from pulseio_engine import Engine, UnsupportedModelError
from pulseio_engine.config import EngineConfig
from pulseio_engine.model.gguf_loader import load_gguf

gguf = pytest.importorskip("gguf")

_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf: str) -> str:
    if hf.startswith("model.layers."):
        _, _, i, *rest = hf.split(".")
        module = ".".join(rest[:-1])
        return f"blk.{i}.{_NAMES[module]}.{rest[-1]}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[hf]


def write_gguf(path: Path, hf_model, arch: str) -> None:  # noqa: ANN001
    c = hf_model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    state = {k: v for k, v in hf_model.state_dict().items() if not (c.tie_word_embeddings and k == "lm_head.weight")}
    for name, tensor in state.items():
        array = tensor.numpy().astype(np.float32)
        if arch == "llama" and name.endswith("q_proj.weight"):
            array = _llama_cpp_permute(array, c.num_attention_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            array = _llama_cpp_permute(array, c.num_key_value_heads)
        w.add_tensor(_gguf_name(name), array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_gguf_logits_match_transformers(tmp_path: Path, arch: str) -> None:
    hf = write_tiny_checkpoint(tmp_path / "hf", arch, rope_scaling=False)
    write_gguf(tmp_path / "tiny.gguf", hf, arch)
    config, weights = load_gguf(tmp_path / "tiny.gguf", dtype=torch.float32, device="cpu")
    assert config.tie_word_embeddings == hf.config.tie_word_embeddings
    c = hf.config
    assert config.head_dim == (getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    assert torch.equal(weights.layers[0].qkv[: config.q_size], hf.model.layers[0].self_attn.q_proj.weight), \
        "the llama.cpp q/k permutation must be undone"
    engine = Engine(EngineConfig(config), weights)
    prompt = list(range(3, 30))
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    ours = prefill_logits(engine, prompt, chunk=len(prompt))
    assert (ours - ref).abs().max() / ref.abs().max() <= 1e-4


def test_gguf_unsupported_architecture(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match=r"GGUF architecture 'gpt2' is not supported; supported: "
                                                    r"\['llama', 'qwen2', 'qwen3'\]"):
        load_gguf(tmp_path / "gpt2.gguf", dtype=torch.float32, device="cpu")
