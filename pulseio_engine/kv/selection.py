"""Top-k block selection from query · digest scores (Quest's estimate), in fixed-shape tensors.

Quest's upper bound on a block's attention logit is sum_i max(q_i M_i, q_i m_i) with M, m the block's
key max and min. Since M >= m, max(q M, q m) = relu(q) M + min(q, 0) m, so the bounds of every query
head are two batched matmuls. The G query heads of a GQA group read the same blocks but each through its
own softmax, so their bounds combine into one score per KV head (`GroupScore`): `SUM` (the default) adds
them, which lets the head with the largest logits decide for the group; `MAX_NORM` takes each head's bounds
less its best block's bound (a log-scale upper estimate of the block's weight against that head's top
block), then the group's max.

A request with n blocks keeps blocks [0, sink) and [n - local, n) (the block being written is the
last one) and fills the rest of its K = budget_blocks with the best-scoring blocks between, ties to
the lower block id; a request with n <= K keeps all n. The output is always [B, S, K] (S = KV heads
that select: Hkv for Quest, 1 for SoloHead), block ids ascending, padded with -1: shapes depend on
the config only, so a CUDA graph can capture it. No loop runs per block or per request.
"""

from __future__ import annotations

import torch

from ..config import GroupScore, SparseConfig
from .digests import BlockDigests

PAD = -1


def _grouped(q: torch.Tensor, num_kv_heads: int, head: int | None) -> torch.Tensor:
    """q: [B, Hq, D] -> [B, S, G, D] fp32: each selecting KV head's G query heads (S = Hkv, or 1 for `head`)."""
    b, hq, d = q.shape
    grouped = q.float().view(b, num_kv_heads, hq // num_kv_heads, d)    # [B, Hkv, G, D]
    return grouped if head is None else grouped[:, head:head + 1]


def _bounds(q_pos: torch.Tensor, q_neg: torch.Tensor, dmax: torch.Tensor, dmin: torch.Tensor) -> torch.Tensor:
    """q_pos, q_neg: [B, S, G, D]; dmax, dmin: [B, NB, S, D] -> [B, S, G, NB] fp32."""
    return (torch.einsum("bsgd,bnsd->bsgn", q_pos, dmax.float())
            + torch.einsum("bsgd,bnsd->bsgn", q_neg, dmin.float()))


def head_bounds(q: torch.Tensor, num_kv_heads: int, head: int | None, dmax: torch.Tensor,
                dmin: torch.Tensor) -> torch.Tensor:
    """q: [B, Hq, D]; dmax, dmin: [B, NB, S, D] digests -> each query head's Quest bound [B, S, G, NB] fp32,
    G query heads per KV head; S = Hkv, or 1 when `head` names the one selecting KV head."""
    grouped = _grouped(q, num_kv_heads, head)
    return _bounds(grouped.clamp(min=0), grouped.clamp(max=0), dmax, dmin)


def block_scores(q: torch.Tensor, num_kv_heads: int, head: int | None, dmax: torch.Tensor, dmin: torch.Tensor,
                 num_tokens: torch.Tensor, block_size: int, rule: GroupScore) -> torch.Tensor:
    """One score per selecting KV head and block [B, S, NB] fp32 (arguments as `head_bounds`; num_tokens: [B]).
    SUM: the group's bounds added, which is the bound of its summed relu(q) and min(q, 0): two matmuls, not
    2G. MAX_NORM: each head's bounds less its best over the request's blocks (padding columns of its block
    table take no part), then the group's max."""
    if rule is GroupScore.SUM:
        grouped = _grouped(q, num_kv_heads, head)
        return _bounds(grouped.clamp(min=0).sum(2, keepdim=True), grouped.clamp(max=0).sum(2, keepdim=True),
                       dmax, dmin)[:, :, 0]
    return max_norm(head_bounds(q, num_kv_heads, head, dmax, dmin), num_tokens, block_size)


def max_norm(bounds: torch.Tensor, num_tokens: torch.Tensor, block_size: int) -> torch.Tensor:
    """MAX_NORM's combination: bounds [B, S, G, NB] fp32 -> [B, S, NB], each head's bounds less its best
    over the request's n = ceil(num_tokens / block_size) blocks, then the group's max."""
    n = (num_tokens + block_size - 1) // block_size                                    # [B] blocks
    real = torch.arange(bounds.shape[-1], device=bounds.device) < n[:, None]          # [B, NB]
    best = torch.where(real[:, None, None, :], bounds, -torch.inf).amax(-1, keepdim=True)   # [B, S, G, 1]
    return (bounds - best).amax(2)


def select_blocks(scores: torch.Tensor, num_tokens: torch.Tensor, config: SparseConfig) -> torch.Tensor:
    """scores: [B, S, NB]; num_tokens: [B] int64 tokens in context, the one being decoded included
    -> block ids [B, S, K] int64, ascending, padded with -1 (K = config.budget_blocks)."""
    b, s, nb = scores.shape
    k = config.budget_blocks
    if nb < k:    # fewer block columns than the budget: every real block is kept, pad to width K
        scores = torch.cat([scores, scores.new_zeros(b, s, k - nb)], dim=2)
        nb = k
    ids = torch.arange(nb, device=scores.device)                                   # [NB]
    n = ((num_tokens + config.block_size - 1) // config.block_size)[:, None, None]  # [B, 1, 1] blocks
    real = ids < n                                                                  # [B, 1, NB]
    forced = (ids < config.sink_blocks) | (ids >= n - config.local_blocks)
    ranked = torch.where(forced & real, torch.inf, scores)
    ranked = torch.where(real, ranked, -torch.inf)
    order = torch.sort(ranked, dim=2, descending=True, stable=True).indices[..., :k]   # [B, S, K]
    chosen = torch.where(order < n, order, nb)          # blocks past the context sort last ...
    chosen = torch.sort(chosen, dim=2).values
    return torch.where(chosen < nb, chosen, PAD)        # ... and become padding


def select_for_layer(digests: BlockDigests, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
                     num_tokens: torch.Tensor, config: SparseConfig) -> torch.Tensor:
    """The blocks a decode batch reads at `layer`. q: [B, Hq, D] post-RoPE queries of the tokens being
    decoded; block_tables: [B, NB] physical block ids; num_tokens: [B] -> logical block ids [B, S, K]."""
    head = None if digests.heads is None else digests.heads[layer]
    dmax, dmin = digests.gather(layer, block_tables)
    scores = block_scores(q, digests.num_kv_heads, head, dmax, dmin, num_tokens, config.block_size, config.group_score)
    return select_blocks(scores, num_tokens, config)
