"""Quest's block selection (mit-han-lab/Quest), small and in plain torch (this module imports no transformers).

Digests: per block of `block_size` tokens and per selecting KV head, the elementwise max M and min m of its
post-RoPE keys. A query q bounds its logit against any key of a block by sum_d max(q_d M_d, q_d m_d) =
relu(q) . M + min(q, 0) . m; the G query heads of a GQA group add their bounds, which is the bound of their
summed relu(q) and min(q, 0): two matmuls per layer. Selection: sink blocks [0, sink) and local blocks
[n - local, n) (the block being written is the last) are always kept, the best-scoring blocks between fill
the budget of K blocks (ties to the lower id), and the ids come out ascending, padded with -1 to width K.

SoloHead: one KV head per layer (`heads[layer]`, e.g. from a calibration file) scores for all heads, so one
selection (S = 1 selecting row) serves the whole layer; Quest: every KV head selects for itself (S = Hkv).
All shapes depend on the host-known block count only: no host sync, no loop per block or per head.
"""

from __future__ import annotations

import torch

PAD = -1


def block_digests(keys: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """keys: [B, S, T, D] -> (max, min): [B, S, ceil(T / block_size), D] each, keys' dtype. A last, partial
    block is digested over its tokens only."""
    b, s, t, d = keys.shape
    pad = -t % block_size
    low = torch.finfo(keys.dtype).min
    high = torch.finfo(keys.dtype).max
    if pad:
        keys_hi = torch.cat([keys, keys.new_full((b, s, pad, d), low)], dim=2)
        keys_lo = torch.cat([keys, keys.new_full((b, s, pad, d), high)], dim=2)
    else:
        keys_hi = keys_lo = keys
    return (keys_hi.unflatten(2, (-1, block_size)).amax(3), keys_lo.unflatten(2, (-1, block_size)).amin(3))


def group_queries(q: torch.Tensor, num_kv_heads: int, head: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, Hq, D] post-RoPE queries -> (relu(q), min(q, 0)) summed over each selecting KV head's GQA group:
    [B, S, D] fp32 each, S = Hkv, or 1 when `head` names the one selecting KV head (SoloHead)."""
    b, hq, d = q.shape
    grouped = q.float().view(b, num_kv_heads, hq // num_kv_heads, d)      # [B, Hkv, G, D]
    if head is not None:
        grouped = grouped[:, head:head + 1]                                 # [B, 1, G, D]
    return grouped.clamp(min=0).sum(2), grouped.clamp(max=0).sum(2)


def block_scores(q: torch.Tensor, num_kv_heads: int, head: int | None, dmax: torch.Tensor,
                 dmin: torch.Tensor) -> torch.Tensor:
    """q: [B, Hq, D]; dmax, dmin: [B, S, NB, D] digests of the selecting heads -> Quest bounds [B, S, NB] fp32.
    Each block's bound is a sum over D of its own row (products, then a reduction per row), so it does not
    depend on how many block columns are scored alongside it."""
    q_pos, q_neg = group_queries(q, num_kv_heads, head)                     # [B, S, D] each
    return (q_pos[:, :, None] * dmax.float()).sum(-1) + (q_neg[:, :, None] * dmin.float()).sum(-1)


def select_blocks(scores: torch.Tensor, budget: int, *, sink: int, local: int,
                  num_blocks: int | torch.Tensor | None = None) -> torch.Tensor:
    """scores: [B, S, NB] -> block ids [B, S, budget] int64, ascending, padded with -1 (see the module doc).
    num_blocks: blocks in the context (an int, or a [] int64 tensor on the scores' device: no host sync);
    columns past it are not blocks. Default: NB. Shapes depend on NB and budget only."""
    b, s, nb = scores.shape
    if num_blocks is None:
        num_blocks = nb
    if nb < budget:   # fewer columns than the budget: pad, the padding is past the context
        scores = torch.cat([scores, scores.new_zeros(b, s, budget - nb)], dim=2)
        nb = budget
    ids = torch.arange(nb, device=scores.device)                                   # [NB]
    real = ids < num_blocks
    forced = ((ids < sink) | (ids >= num_blocks - local)) & real
    ranked = torch.where(real, torch.where(forced, torch.inf, scores), -torch.inf)
    order = torch.sort(ranked, dim=2, descending=True, stable=True).indices[..., :budget]
    chosen = torch.sort(torch.where(order < num_blocks, order, nb), dim=2).values  # past the context: last ...
    return torch.where(chosen < nb, chosen, PAD)                                   # ... and padding


def selected_tokens(num_tokens: int, budget: int, block_size: int) -> int:
    """Tokens a selection of `budget` blocks covers in a context of `num_tokens` (host ints): the selected
    blocks are ascending with the partial block being written last, so they are a prefix of the gathered
    rows of this length."""
    fill = num_tokens - (num_tokens - 1) // block_size * block_size
    return min(num_tokens, (budget - 1) * block_size + fill)
