"""A Triton consumer kernel for the device-wait patterns: JIT-compiled and loaded on first use."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gather_rows(pool, slots, out, row_words: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slots + row)
    for start in range(0, row_words, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < row_words
        tl.store(out + row * row_words + offs, tl.load(pool + slot * row_words + offs, mask=mask), mask=mask)


def gather_rows(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """pool: [n, bytes] uint8 (bytes % 8 == 0); slots: [k] int64 -> [k, bytes] uint8 copies of pool[slots]."""
    words = pool.view(torch.int64)
    out = torch.empty((slots.numel(), words.shape[1]), dtype=torch.int64, device=pool.device)
    if slots.numel():
        _gather_rows[(slots.numel(),)](words, slots, out, row_words=words.shape[1], BLOCK=512)
    return out.view(torch.uint8)
