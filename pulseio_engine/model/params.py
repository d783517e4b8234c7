"""The model's weights, fused for decode: one QKV matrix and one gate-up matrix per layer.

`ModelWeights.from_hf_names` builds them from any source that yields tensors under Hugging Face
names (safetensors, GGUF after renaming); presets build them directly on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import ModelConfig


@dataclass
class LayerWeights:
    input_norm: torch.Tensor          # [H]
    qkv: torch.Tensor                 # [(Hq + 2 Hkv) D, H]
    o: torch.Tensor                   # [H, Hq D]
    post_norm: torch.Tensor           # [H]
    gate_up: torch.Tensor             # [2 I, H]: gate rows, then up rows
    down: torch.Tensor                # [H, I]
    qkv_bias: torch.Tensor | None = None  # [(Hq + 2 Hkv) D] (Qwen2)
    q_norm: torch.Tensor | None = None    # [D] (Qwen3)
    k_norm: torch.Tensor | None = None    # [D] (Qwen3)


@dataclass
class ModelWeights:
    embed: torch.Tensor               # [V, H]
    layers: list[LayerWeights]
    norm: torch.Tensor                # [H]
    lm_head: torch.Tensor             # [V, H]; the same tensor as `embed` when tied

    @classmethod
    def from_hf_names(cls, config: ModelConfig, get: Callable[[str], torch.Tensor], *,
                      dtype: torch.dtype, device: torch.device | str) -> ModelWeights:
        """`get(name)` returns the tensor stored under a Hugging Face Llama/Qwen2/Qwen3 parameter name."""

        def load(name: str) -> torch.Tensor:
            return get(name).to(device=device, dtype=dtype)

        def layer_get(i: int) -> Callable[[str], torch.Tensor]:
            return lambda n: load(f"model.layers.{i}.{n}")

        layers = [_layer(config, layer_get(i)) for i in range(config.num_layers)]
        embed = load("model.embed_tokens.weight")
        lm_head = embed if config.tie_word_embeddings else load("lm_head.weight")
        weights = cls(embed, layers, load("model.norm.weight"), lm_head)
        weights.check(config)
        return weights

    def check(self, config: ModelConfig) -> None:
        """Raise ValueError naming the first tensor whose shape disagrees with the config."""
        h, d = config.hidden_size, config.head_dim
        expected: dict[str, tuple[torch.Tensor | None, tuple[int, ...]]] = {
            "embed": (self.embed, (config.vocab_size, h)),
            "lm_head": (self.lm_head, (config.vocab_size, h)),
            "norm": (self.norm, (h,)),
        }
        for i, lw in enumerate(self.layers):
            expected |= {
                f"layers.{i}.qkv": (lw.qkv, (config.q_size + 2 * config.kv_size, h)),
                f"layers.{i}.o": (lw.o, (h, config.q_size)),
                f"layers.{i}.gate_up": (lw.gate_up, (2 * config.intermediate_size, h)),
                f"layers.{i}.down": (lw.down, (h, config.intermediate_size)),
            }
            if config.qk_norm:
                expected[f"layers.{i}.q_norm"] = (lw.q_norm, (d,))
            if config.qkv_bias:
                expected[f"layers.{i}.qkv_bias"] = (lw.qkv_bias, (config.q_size + 2 * config.kv_size,))
        for name, (tensor, shape) in expected.items():
            if tensor is None or tuple(tensor.shape) != shape:
                found = None if tensor is None else tuple(tensor.shape)
                raise ValueError(f"weight {name} has shape {found}, the config implies {shape}")

    def parameter_bytes(self) -> int:
        """Bytes of every distinct weight tensor (a tied lm_head counts once)."""
        seen: dict[int, int] = {}
        for t in [self.embed, self.norm, self.lm_head] + [t for lw in self.layers for t in vars(lw).values()]:
            if t is not None:
                seen[id(t)] = t.numel() * t.element_size()
        return sum(seen.values())


def _layer(config: ModelConfig, get: Callable[[str], torch.Tensor]) -> LayerWeights:
    qkv = torch.cat([get("self_attn.q_proj.weight"), get("self_attn.k_proj.weight"),
                     get("self_attn.v_proj.weight")])
    gate_up = torch.cat([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")])
    qkv_bias = torch.cat([get("self_attn.q_proj.bias"), get("self_attn.k_proj.bias"),
                          get("self_attn.v_proj.bias")]) if config.qkv_bias else None
    return LayerWeights(
        input_norm=get("input_layernorm.weight"),
        qkv=qkv,
        o=get("self_attn.o_proj.weight"),
        post_norm=get("post_attention_layernorm.weight"),
        gate_up=gate_up,
        down=get("mlp.down_proj.weight"),
        qkv_bias=qkv_bias,
        q_norm=get("self_attn.q_norm.weight") if config.qk_norm else None,
        k_norm=get("self_attn.k_norm.weight") if config.qk_norm else None,
    )
