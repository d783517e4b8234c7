"""Compute building blocks shared by Llama and Qwen3 (torch only), numerically as Hugging Face does:
RMSNorm in fp32 then cast, rotary embeddings with the rotate_half convention, SwiGLU."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import ModelConfig, RopeScaling


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [..., N]; weight: [N]. Normalize in fp32, cast back, then scale (HF order)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2I] (gate then up) -> [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """[head_dim / 2] fp32 inverse frequencies; Llama 3 scaling as in HF `_compute_llama3_parameters`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class Rotary:
    """cos/sin tables for positions [0, max_len), computed in fp32 and stored in the model dtype."""

    def __init__(self, config: ModelConfig, max_len: int, dtype: torch.dtype, device: torch.device) -> None:
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        freqs = torch.arange(max_len, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)          # [max_len, D]
        self.cos = emb.cos().to(device=device, dtype=dtype)
        self.sin = emb.sin().to(device=device, dtype=dtype)
        self.max_len = max_len

    def apply(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq, D], k: [T, Hkv, D], positions: [T] int64 -> rotated (q, k)."""
        cos = self.cos[positions].unsqueeze(1)   # [T, 1, D]
        sin = self.sin[positions].unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
