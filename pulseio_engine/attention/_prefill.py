"""Prefill attention of one sequence's chunk: its new queries against every earlier token and themselves."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos_start: int, scale: float) -> torch.Tensor:
    """q: [n, Hq, D] the chunk's queries (positions pos_start ..); k, v: [pos_start + n, Hkv, D] the
    sequence's keys and values up to the chunk's end -> [n, Hq, D], causal, GQA groups repeated.

    SDPA gets 4-D inputs (a batch of one): its fused kernels (flash, memory-efficient; on a CPU too)
    take only those, and 3-D inputs fall back to the math kernel, which materializes every score."""
    n, ctx = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).transpose(0, 1)[None]     # [1, Hq, ctx, D]
    v = v.repeat_interleave(group, dim=1).transpose(0, 1)[None]
    qs = q.transpose(0, 1)[None]                                    # [1, Hq, n, D]
    if pos_start == 0:
        o = F.scaled_dot_product_attention(qs, k, v, is_causal=True, scale=scale)
    else:
        rows = torch.arange(n, device=q.device)[:, None] + pos_start
        mask = torch.arange(ctx, device=q.device)[None, :] <= rows     # [n, ctx]
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale)
    return o[0].transpose(0, 1)
