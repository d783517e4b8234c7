"""Steering: the real Quest scoring and top-K, with a given step-to-step locality imposed on the result.

With random weights the top-K jumps at random every step, so a benchmark would recall nearly the whole
budget each step, far more than a real model does. Steering keeps the work (the digests are scored and
the selection runs) and bends only which ids come out: a row keeps about `overlap` of its previous
middle blocks, the figure `pulseio-engine locality` measures on real models (`data/locality.json`).

Per selecting row with n > K blocks and m = K - sink - local middle slots:

    prev  = the row's selection at the previous call (its `mask`); stale = middle blocks in prev, fresh the rest
    u_b   = a 24-bit hash of (seed, layer, row, call, block b);  T = floor(float32(overlap * m) * 2^24)
    kept  = the stale blocks with u_b * #stale < T          (each kept with probability min(1, overlap * m / #stale))
    warm  = (hot mode, `rewarm` > 0) the fresh blocks still in the row's hot set; rewarmed = the warm blocks with
            u_b * #warm < R, R = floor(float32(rewarm) * float32(m - #kept) * 2^24)  (a block is stale or fresh,
            never both, so one draw serves both rules)
    ahead = (hot mode, `ahead` > 0) the warm blocks not rewarmed that a prediction recalled (`prefetched`); of them
            the blocks with v_b * #ahead < A, A = floor(float32(ahead) * float32(m - #kept - #rewarmed) * 2^24), with
            v_b = mix32(u_b ^ 0x2545F491) >> 8 a second draw
    then, the classes in the order kept, rewarmed, ahead, the fresh blocks not warm, the rest (the unkept stale
    blocks and the warm ones not rewarmed nor ahead): every block of the classes before the one where the running
    count reaches m, and the top of that class for the rest (without rewarm no block is warm)

with "top" by (score descending, block id ascending); with n <= K every block, as without steering. So on
average min(#stale, overlap * m) middle blocks stay and about rewarm of the rest come back from the hot set
(the others from outside it, so that exactly those are recalled), and the kernel runs one top-k search over
one set, as an unsteered row does: steering costs a hash and a few counts per block. Rewarm reproduces what
a hot set larger than the budget saves on a real model, which re-selects blocks it dropped a few steps
before: `LocalityProfile.rewarm_for` derives it from the measured recall of such hot sets, as the overlap is
measured. Ahead reproduces a layer recalled a layer early (`OffloadConfig.ahead`): of what it would still recall,
the share its prediction brought (`SteeringProfile.ahead`), drawn from the blocks that prediction did bring, so a
prefetch that brought nothing saves nothing. Randomness is a counter-based hash
(murmur3's 32-bit finalizer) of the seed, the layer, the row b * S + s, the row's call counter and the block,
so runs are reproducible and a CUDA graph replay draws afresh: the kernel and this reference compute the same
bits, and the comparison is in integers.

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


def steer_block_hash(key: int, calls: torch.Tensor, nb: int) -> torch.Tensor:
    """calls: [B, S] int64 the rows' call counters -> u [B, S, NB] int64 in [0, 2^24): each block's draw."""
    b, s = calls.shape
    rows = torch.arange(b * s, dtype=torch.int64, device=calls.device).view(b, s)
    row_hash = _mix32_t(_mix32_t(rows ^ key) ^ (calls & _M32))                       # [B, S]
    return _mix32_t(row_hash[..., None] ^ torch.arange(nb, device=calls.device)) >> 8


def keep_threshold(overlap: float, config: SparseConfig) -> int:
    """T = floor(float32(overlap * m) * 2^24), m = the middle slots: a block is kept when u * #stale < T."""
    m = config.budget_blocks - config.sink_blocks - config.local_blocks
    return int(float(torch.tensor(overlap * m, dtype=torch.float32)) * (1 << 24))


def _middle(num_tokens: torch.Tensor, nb: int, config: SparseConfig, device: torch.device) -> torch.Tensor:
    """[B, 1, NB] bool: the blocks neither sink nor local of each request's n blocks."""
    ids = torch.arange(nb, device=device)
    n = ((num_tokens.long() + config.block_size - 1) // config.block_size)[:, None, None]
    return (ids < n) & (ids >= config.sink_blocks) & (ids < n - config.local_blocks)


def steer_kept(prev: torch.Tensor, num_tokens: torch.Tensor, u: torch.Tensor, threshold: int,
               config: SparseConfig) -> torch.Tensor:
    """prev: [B, S, NB] bool; u: [B, S, NB] int64 draws -> kept [B, S, NB] bool (see the module doc)."""
    stale = prev & _middle(num_tokens, prev.shape[2], config, prev.device)
    return stale & (u * stale.sum(2, keepdim=True) < threshold)


def steer_rewarmed(prev: torch.Tensor, resident: torch.Tensor, num_tokens: torch.Tensor, u: torch.Tensor,
                   kept: torch.Tensor, rewarm: float, config: SparseConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """prev, kept: [B, S, NB] bool; resident: [B, S, NB] int, each block's hot entry or -1 (before this call);
    u: [B, S, NB] int64 draws -> (warm, rewarmed), [B, S, NB] bool each (see the module doc)."""
    warm = ~prev & (resident >= 0) & _middle(num_tokens, prev.shape[2], config, prev.device)
    m = config.budget_blocks - config.sink_blocks - config.local_blocks
    short = (m - kept.sum(2, keepdim=True)).float()
    limit = (torch.tensor(rewarm, dtype=torch.float32) * short * float(1 << 24)).long()
    return warm, warm & (u * warm.sum(2, keepdim=True) < limit)


AHEAD_SALT = 0x2545F491     # the second draw's: v_b = mix32(u_b ^ AHEAD_SALT) >> 8


def steer_ahead(prefetched: torch.Tensor, warm: torch.Tensor, rewarmed: torch.Tensor, u: torch.Tensor,
                kept: torch.Tensor, ahead: float, config: SparseConfig) -> torch.Tensor:
    """prefetched: [B, S, NB] bool, the blocks a prediction recalled ahead; warm, rewarmed: `steer_rewarmed`'s;
    u: [B, S, NB] the draws; kept: `steer_kept`'s -> [B, S, NB] bool, the ahead class (see the module doc)."""
    pool = warm & ~rewarmed & prefetched
    m = config.budget_blocks - config.sink_blocks - config.local_blocks
    short = (m - kept.sum(2, keepdim=True) - rewarmed.sum(2, keepdim=True)).float()
    limit = (torch.tensor(ahead, dtype=torch.float32) * short * float(1 << 24)).long()
    v = _mix32_t(u ^ AHEAD_SALT) >> 8
    return pool & (v * pool.sum(2, keepdim=True) < limit)


def steered_scores(scores: torch.Tensor, num_tokens: torch.Tensor, prev: torch.Tensor, kept: torch.Tensor,
                   config: SparseConfig, rewarmed: tuple[torch.Tensor, torch.Tensor] | None = None,
                   ahead: torch.Tensor | None = None) -> torch.Tensor:
    """scores: [B, S, NB] fp32; num_tokens: [B]; prev: [B, S, NB] bool, the previous selection; kept: [B, S, NB]
    bool (`steer_kept`); rewarmed: (warm, rewarmed) [B, S, NB] bool (`steer_rewarmed`; None: no rewarm); ahead:
    [B, S, NB] bool (`steer_ahead`; None: none) ->
    [B, S, NB] fp32 whose `select_blocks` is the steered selection: each middle block's rank in the (class, score
    desc, id asc) order as an exact integer score, class 2 for the blocks taken whole, 1 for the set searched,
    0 for the rest."""
    b, s, nb = scores.shape
    ids = torch.arange(nb, device=scores.device)
    middle = _middle(num_tokens, nb, config, scores.device)
    stale, fresh = middle & prev, middle & ~prev
    kept = kept & stale                                       # only stale middle blocks can be kept
    none = torch.zeros_like(fresh)
    warm, back = (fresh & rewarmed[0], fresh & rewarmed[1]) if rewarmed is not None else (none, none)
    early = warm & ~back & ahead if ahead is not None else none
    m = config.budget_blocks - config.sink_blocks - config.local_blocks
    classes = (kept, back, early, fresh & ~warm, (stale & ~kept) | (warm & ~back & ~early))
    whole, searched = torch.zeros_like(stale), torch.zeros_like(stale)
    before = torch.zeros_like(stale[..., :1], dtype=torch.int64)        # blocks in the classes before
    for members in classes:                                             # the class where the count reaches m
        count = members.sum(2, keepdim=True)
        here = (before < m) & (before + count >= m)
        whole |= (before + count < m) & members
        searched |= here & members
        before = before + count
    order = torch.sort(torch.where(middle, scores, -torch.inf), dim=2, descending=True, stable=True).indices
    pos = torch.empty_like(order).scatter_(2, order, ids.expand_as(order).contiguous())    # rank by score
    cls = torch.where(whole, 2, torch.where(searched, 1, 0))
    return torch.where(middle, (cls * nb + nb - 1 - pos).float(), 0.0)
