"""Top-k block selection from query · digest scores (Quest's estimate), in fixed-shape tensors.

Quest's upper bound on a block's attention logit is sum_i max(q_i M_i, q_i m_i) with M, m the block's
key max and min. Since M >= m, max(q M, q m) = relu(q) M + min(q, 0) m, so scores are two batched
matmuls, and the G query heads of a GQA group combine (by summing their scores) before the matmuls:
sum_g relu(q_g) and sum_g min(q_g, 0).

A request with n blocks keeps blocks [0, sink) and [n - local, n) (the block being written is the
last one) and fills the rest of its K = budget_blocks with the best-scoring blocks between, ties to
the lower block id; a request with n <= K keeps all n. The output is always [B, S, K] (S = KV heads
that select: Hkv for Quest, 1 for SoloHead), block ids ascending, padded with -1: shapes depend on
the config only, so a CUDA graph can capture it. No loop runs per block or per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..config import SparseConfig
from .digests import BlockDigests

PAD = -1


def group_query(q: torch.Tensor, num_kv_heads: int, head: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, Hq, D] -> (sum_g relu(q_g), sum_g min(q_g, 0)), each [B, S, D] fp32, summed over the
    query heads of each KV head's group; S = Hkv, or 1 when `head` names the one selecting KV head."""
    b, hq, d = q.shape
    grouped = q.float().view(b, num_kv_heads, hq // num_kv_heads, d)    # [B, Hkv, G, D]
    if head is not None:
        grouped = grouped[:, head:head + 1]                             # [B, 1, G, D]
    return grouped.clamp(min=0).sum(2), grouped.clamp(max=0).sum(2)


def score_blocks(q_pos: torch.Tensor, q_neg: torch.Tensor, dmax: torch.Tensor, dmin: torch.Tensor) -> torch.Tensor:
    """q_pos, q_neg: [B, S, D] (from `group_query`); dmax, dmin: [B, NB, S, D] digests
    -> scores [B, S, NB] fp32."""
    return (torch.einsum("bsd,bnsd->bsn", q_pos, dmax.float())
            + torch.einsum("bsd,bnsd->bsn", q_neg, dmin.float()))


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
    q_pos, q_neg = group_query(q, digests.num_kv_heads, head)
    dmax, dmin = digests.gather(layer, block_tables)
    return select_blocks(score_blocks(q_pos, q_neg, dmax, dmin), num_tokens, config)


class BlockSelector(Protocol):
    """What the offload path calls per offloaded layer and step: `DigestSelector` (Quest's scores over the
    digests) or `kv/synthetic_selection.LocalitySelector` (random weights, a measured locality).
    q: [B, Hq, D]; block_tables: [B, NB]; num_tokens: [B] int64 -> block ids [B, S, K] int64 as
    `select_blocks` returns them."""

    def __call__(self, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
                 num_tokens: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class DigestSelector:
    """`select_for_layer` as a `BlockSelector`."""

    digests: BlockDigests
    config: SparseConfig

    def __call__(self, layer: int, q: torch.Tensor, block_tables: torch.Tensor,
                 num_tokens: torch.Tensor) -> torch.Tensor:
        return select_for_layer(self.digests, layer, q, block_tables, num_tokens, self.config)
