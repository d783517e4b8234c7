"""Steering: the real Quest scoring and top-K, with a given step-to-step locality imposed on the result.

With random weights the top-K jumps at random every step, so a benchmark would recall nearly the whole
budget each step, far more than a real model does. Steering keeps the work (the digests are scored and
the selection runs) and bends only which ids come out: a row keeps about `overlap` of its previous
middle blocks, the figure `pulseio-engine locality` measures on real models (`data/locality.json`).

Per selecting row with n > K blocks and m = K - sink - local middle slots:

    prev  = the row's selection at the previous call (its `mask`), stale = middle blocks in prev
    keep  = min(#stale, floor(float32(overlap * m) + u)),  u in [0, 1) hashed from (seed, layer, row, call)
    class = forced 3 > kept 2 > fresh middle 1 > unkept stale 0, kept = the top-`keep` stale blocks

and the selection is the top-K by (class, score descending, block id ascending); with n <= K every block,
as without steering. So on average overlap * m middle blocks stay (the mean of floor(x + u) is x), when
enough stale blocks exist; and when too few fresh blocks remain, unkept stale ones fill the slots (the
overlap then comes out higher). Randomness is a counter-based hash (murmur3's 32-bit finalizer) of the
seed, the layer, the row b * S + s and the row's call counter, so runs are reproducible and a CUDA graph
replay draws afresh: the kernel and this reference compute the same bits.

This file is the definition the select kernel (`kv/select_kernels.py`) must equal, built on
`select_blocks`: the steered order becomes a score whose plain top-K is the steered selection.
"""

from __future__ import annotations

import torch

from ..config import SparseConfig

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_MIX = (0x85EBCA6B, 0xC2B2AE35)


def mix32(x: int) -> int:
    """murmur3's 32-bit finalizer on a Python int in [0, 2^32)."""
    x ^= x >> 16
    x = (x * _MIX[0]) & _M32
    x ^= x >> 13
    x = (x * _MIX[1]) & _M32
    return x ^ (x >> 16)


def steer_key(seed: int, layer: int) -> int:
    """The hash's per-(seed, layer) key in [0, 2^32), computed on the host once per call."""
    return mix32(mix32((seed & _M32) ^ _GOLDEN) ^ (layer & _M32))


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for x in [0, 2^32) int64, in halves so no int64 product overflows."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix32_t(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, _MIX[0])
    x = x ^ (x >> 13)
    x = _mul32(x, _MIX[1])
    return x ^ (x >> 16)


def steer_uniform(key: int, calls: torch.Tensor) -> torch.Tensor:
    """calls: [B, S] int64 the rows' call counters -> u [B, S] fp32 in [0, 1), a multiple of 2^-24."""
    b, s = calls.shape
    rows = torch.arange(b * s, dtype=torch.int64, device=calls.device).view(b, s)
    h = _mix32_t(_mix32_t(rows ^ key) ^ (calls & _M32))
    return (h >> 8).float() / float(1 << 24)


def keep_target(overlap: float, config: SparseConfig) -> float:
    """float32(overlap * m), m = the middle slots: the fp32 value both the kernel and the reference add u to."""
    m = config.budget_blocks - config.sink_blocks - config.local_blocks
    return float(torch.tensor(overlap * m, dtype=torch.float32))


def steered_scores(scores: torch.Tensor, num_tokens: torch.Tensor, prev: torch.Tensor, keep: torch.Tensor,
                   config: SparseConfig) -> torch.Tensor:
    """scores: [B, S, NB] fp32; num_tokens: [B]; prev: [B, S, NB] bool, the previous selection; keep: [B, S]
    int64 stale blocks to keep -> [B, S, NB] fp32 whose `select_blocks` is the steered selection: each
    middle block's rank in the (class, score desc, id asc) order as an exact integer score."""
    b, s, nb = scores.shape
    ids = torch.arange(nb, device=scores.device)
    n = ((num_tokens.long() + config.block_size - 1) // config.block_size)[:, None, None]   # [B, 1, 1]
    real = ids < n
    middle = real & (ids >= config.sink_blocks) & (ids < n - config.local_blocks)          # [B, 1|S, NB]
    stale = middle & prev
    order = torch.sort(torch.where(middle, scores, -torch.inf), dim=2, descending=True, stable=True).indices
    pos = torch.empty_like(order).scatter_(2, order, ids.expand_as(order).contiguous())    # rank by score
    stale_rank = torch.empty_like(order).scatter_(2, order, stale.gather(2, order).long().cumsum(2) - 1)
    kept = stale & (stale_rank < keep[..., None])
    cls = torch.where(kept, 2, torch.where(stale, 0, 1))
    return torch.where(middle, (cls * nb + nb - 1 - pos).float(), 0.0)


def steer_keep(prev: torch.Tensor, num_tokens: torch.Tensor, u: torch.Tensor, target: float,
               config: SparseConfig) -> torch.Tensor:
    """prev: [B, S, NB] bool; u: [B, S] fp32 -> keep [B, S] int64 = min(#stale, floor(target + u))."""
    nb = prev.shape[2]
    ids = torch.arange(nb, device=prev.device)
    n = ((num_tokens.long() + config.block_size - 1) // config.block_size)[:, None, None]
    middle = (ids >= config.sink_blocks) & (ids < n - config.local_blocks)
    stale = (prev & middle).sum(2)
    return torch.minimum(stale, torch.floor(u + torch.tensor(target, dtype=torch.float32)).long())
