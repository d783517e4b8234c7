"""Plain-Python definitions of block digests, Quest scores, block selection and the recall plan:
loops over blocks and heads, written for clarity, that the vectorized code must equal."""

from __future__ import annotations

import math

import torch

from pulseio_engine.config import SparseConfig


def ref_digest(keys: list[torch.Tensor], heads: tuple[int, ...] | None, layer: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """keys: a block's filled tokens, each [Hkv, D] -> (max, min) [width, D] over those tokens."""
    stacked = torch.stack(keys)                                   # [n, Hkv, D]
    if heads is not None:
        stacked = stacked[:, heads[layer]:heads[layer] + 1]
    return stacked.max(0).values, stacked.min(0).values


def ref_scores(q: torch.Tensor, dmax: torch.Tensor, dmin: torch.Tensor, num_kv_heads: int,
               kv_heads: list[int]) -> torch.Tensor:
    """q: [B, Hq, D]; dmax, dmin: [B, NB, Hkv, D] -> [B, len(kv_heads), NB]: for each selecting KV head,
    the sum over its query heads of sum_i max(q_i M_i, q_i m_i)."""
    b, hq, d = q.shape
    group = hq // num_kv_heads
    out = torch.zeros((b, len(kv_heads), dmax.shape[1]))
    for i in range(b):
        for s, h in enumerate(kv_heads):
            col = h if dmax.shape[2] == num_kv_heads else s
            for n in range(dmax.shape[1]):
                total = 0.0
                for g in range(h * group, (h + 1) * group):
                    for j in range(d):
                        qj = float(q[i, g, j])
                        total += max(qj * float(dmax[i, n, col, j]), qj * float(dmin[i, n, col, j]))
                out[i, s, n] = total
    return out


def ref_select(scores: list[float], num_tokens: int, config: SparseConfig) -> list[int]:
    """One request's (and head's) selected block ids, ascending, padded with -1 to budget_blocks."""
    k = config.budget_blocks
    n = math.ceil(num_tokens / config.block_size)
    if n <= k:
        chosen = list(range(n))
    else:
        forced = set(range(config.sink_blocks)) | set(range(n - config.local_blocks, n))
        middle = sorted(range(config.sink_blocks, n - config.local_blocks), key=lambda i: (-scores[i], i))
        chosen = sorted(forced | set(middle[: k - len(forced)]))
    return chosen + [-1] * (k - len(chosen))


def ref_recall(selected: list[int], resident: list[int], num_slots: int
               ) -> tuple[list[int], list[int], list[int], list[int]]:
    """One row's recall plan: (blocks, slots, evicted, selected_slots), as `plan_recall` defines them."""
    owner = {slot: block for block, slot in enumerate(resident) if slot >= 0}
    chosen = [b for b in selected if b >= 0]
    kept = {resident[b] for b in chosen if resident[b] >= 0}
    empty = [s for s in range(num_slots) if s not in owner]
    evictable = [s for s in range(num_slots) if s in owner and s not in kept]
    free = iter(empty + evictable)
    blocks, slots, evicted, selected_slots = [], [], [], []
    for b in selected:
        if b < 0:
            selected_slots.append(-1)
        elif resident[b] >= 0:
            selected_slots.append(resident[b])
        else:
            slot = next(free)
            blocks.append(b)
            slots.append(slot)
            evicted.append(owner.get(slot, -1))
            selected_slots.append(slot)
    pad = [-1] * (len(selected) - len(blocks))
    return blocks + pad, slots + pad, evicted + pad, selected_slots
