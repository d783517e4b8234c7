"""Compute building blocks shared by Llama, Qwen2 and Qwen3 (torch only), numerically as Hugging Face does:
RMSNorm in fp32 then cast, rotary embeddings with the rotate_half convention, SwiGLU.

A decoder layer is `pre_attention` -> KV write + attention -> `post_attention`. The two halves are
pure functions of tensors (no module state), so the decode path can hand them to `torch.compile`,
which fuses their ~40 small elementwise kernels per layer into a few; at batch 64 those kernels
would otherwise cost about a fifth of a memory-bound decode step. A layer hands its MLP's output on
unadded (`post_attention` -> (x, delta)): the next layer's `pre_attention` adds it in the kernel of its
input norm, the last one's in the final norm, so the residual add is no kernel of its own."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import ModelConfig, RopeScaling
from .linear import Workspace, linear


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [..., N]; weight: [N]. Normalize in fp32, cast back, then scale (HF order)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2I] (gate then up) -> [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def pre_attention(x: torch.Tensor, delta: torch.Tensor | None, positions: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, input_norm: torch.Tensor, qkv: torch.Tensor, qkv_bias: torch.Tensor | None,
                  q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float, num_heads: int,
                  num_kv_heads: int, head_dim: int, workspace: Workspace | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x: [T, H] the residual stream, delta: the previous layer's MLP output not yet added to it (None before the
    first layer) -> (x + delta, q [T, Hq, D], k [T, Hkv, D] (normed if Qwen3, rotated), v [T, Hkv, D]).
    qkv_bias: [(Hq + 2 Hkv) D] (Qwen2) or None; workspace: the model's for `linear` (None: F.linear)."""
    if delta is not None:
        x = residual_add(x, delta)
    t, heads = x.shape[0], num_heads + num_kv_heads
    qk, v = linear(rms_norm(x, input_norm, eps), qkv, qkv_bias, workspace).split(
        [heads * head_dim, num_kv_heads * head_dim], dim=-1)
    qk = qk.view(t, heads, head_dim)          # q and k heads as one tensor: one fused kernel, not one each
    if q_norm is not None:
        assert k_norm is not None                 # the two come together (Qwen3)
        norm = torch.cat([q_norm.expand(num_heads, head_dim), k_norm.expand(num_kv_heads, head_dim)])
        qk = rms_norm(qk, norm, eps)
    qk = rotate(qk, cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))
    q, k = qk.split([num_heads, num_kv_heads], dim=1)
    return x, q, k, v.view(t, num_kv_heads, head_dim)


def select_query(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 input_norm: torch.Tensor, q_rows: torch.Tensor, q_bias: torch.Tensor | None,
                 q_norm: torch.Tensor | None, eps: float, head_dim: int,
                 workspace: Workspace | None = None) -> torch.Tensor:
    """The query heads `pre_attention` makes of residual stream x ([T, H], summed), from their rows of the layer's
    qkv weight (q_rows [n * D, H], q_bias their bias or None) -> [T, n, D], normed if Qwen3 and rotated: a layer's
    selecting queries computed from another layer's stream (`OffloadConfig.ahead`)."""
    t = x.shape[0]
    q = linear(rms_norm(x, input_norm, eps), q_rows, q_bias, workspace).view(t, -1, head_dim)
    if q_norm is not None:
        q = rms_norm(q, q_norm, eps)
    return rotate(q, cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))


def post_attention(x: torch.Tensor, attn: torch.Tensor, o: torch.Tensor, post_norm: torch.Tensor,
                   gate_up: torch.Tensor, down: torch.Tensor, eps: float, workspace: Workspace | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [T, H] residual; attn: [T, Hq, D] -> (the residual after attention, the MLP's output): the layer's output
    is their `residual_add`, which the next layer's `pre_attention` (or `final_norm`) makes."""
    x = residual_add(x, linear(attn.flatten(1), o, workspace=workspace))
    return x, linear(swiglu(linear(rms_norm(x, post_norm, eps), gate_up, workspace=workspace)), down,
                     workspace=workspace)


def final_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The last layer's output (x + delta) normed for the logits."""
    return rms_norm(x if delta is None else residual_add(x, delta), weight, eps)


def residual_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y, written as the fp32 sum rounded once, which is what a half-precision add computes anyway. Spelled
    out, `torch.compile` cannot rewrite `x + linear(...)` as `addmm`, whose cuBLAS call first copies x into
    its output (one more kernel a projection); the sum fuses into the next kernel instead (the norm)."""
    return (x.float() + y.float()).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D], cos/sin: [T, 1, D] -> x rotated."""
    return x * cos + _rotate_half(x) * sin


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
    """cos/sin tables [max_len, D] for positions [0, max_len), computed in fp32, stored in the model dtype."""

    def __init__(self, config: ModelConfig, max_len: int, dtype: torch.dtype, device: torch.device) -> None:
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        freqs = torch.arange(max_len, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)          # [max_len, D]
        self.cos = emb.cos().to(device=device, dtype=dtype)
        self.sin = emb.sin().to(device=device, dtype=dtype)
        self.max_len = max_len


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
