"""Named model shapes with random weights, for benchmarks and quick CPU runs.

Weights are N(0, 0.02^2) matrices and unit norms, created directly on the target device in the
target dtype (no host copy, no fp32 staging): a 14B model appears on an H200 in seconds. Decode
speed does not depend on weight values.
"""

from __future__ import annotations

import torch

from ..config import Architecture, ModelConfig, RopeScaling
from ..errors import UnsupportedModelError
from .params import LayerWeights, ModelWeights

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        architecture=Architecture.QWEN3, vocab_size=256, hidden_size=64, num_layers=4, num_heads=4,
        num_kv_heads=2, head_dim=32, intermediate_size=128, max_position_embeddings=4096,
        rope_theta=1e6, tie_word_embeddings=True,
    ),
    "qwen3-8b": ModelConfig(
        architecture=Architecture.QWEN3, vocab_size=151936, hidden_size=4096, num_layers=36, num_heads=32,
        num_kv_heads=8, head_dim=128, intermediate_size=12288, max_position_embeddings=40960,
        rope_theta=1e6, eos_token_ids=(151645,),
    ),
    "qwen3-14b": ModelConfig(
        architecture=Architecture.QWEN3, vocab_size=151936, hidden_size=5120, num_layers=40, num_heads=40,
        num_kv_heads=8, head_dim=128, intermediate_size=17408, max_position_embeddings=40960,
        rope_theta=1e6, eos_token_ids=(151645,),
    ),
    "llama-3.1-8b": ModelConfig(
        architecture=Architecture.LLAMA, vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32,
        num_kv_heads=8, head_dim=128, intermediate_size=14336, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=8192),
        bos_token_id=128000, eos_token_ids=(128001, 128008, 128009),
    ),
}


def preset_config(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise UnsupportedModelError(f"unknown preset {name!r}; presets are {sorted(PRESETS)}")
    return PRESETS[name]


def random_weights(config: ModelConfig, *, dtype: torch.dtype, device: torch.device | str,
                   seed: int = 0, std: float = 0.02, progress: bool = False) -> ModelWeights:
    """N(0, std^2) matrices and unit norms; `progress`: a bar per layer (a 14B model takes minutes on CPU)."""
    from tqdm import tqdm

    gen = torch.Generator(device=device).manual_seed(seed)

    def matrix(rows: int, cols: int) -> torch.Tensor:
        return torch.randn((rows, cols), generator=gen, dtype=dtype, device=device).mul_(std)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype, device=device)

    h, d = config.hidden_size, config.head_dim
    layers = [
        LayerWeights(
            input_norm=ones(h), qkv=matrix(config.q_size + 2 * config.kv_size, h), o=matrix(h, config.q_size),
            post_norm=ones(h), gate_up=matrix(2 * config.intermediate_size, h),
            down=matrix(h, config.intermediate_size),
            qkv_bias=matrix(1, config.q_size + 2 * config.kv_size)[0] if config.qkv_bias else None,
            q_norm=ones(d) if config.qk_norm else None, k_norm=ones(d) if config.qk_norm else None,
        )
        for _ in tqdm(range(config.num_layers), desc="random weights", unit="layer", disable=not progress,
                      leave=False)
    ]
    embed = matrix(config.vocab_size, h)
    lm_head = embed if config.tie_word_embeddings else matrix(config.vocab_size, h)
    return ModelWeights(embed, layers, ones(h), lm_head)
