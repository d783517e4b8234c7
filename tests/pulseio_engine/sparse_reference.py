"""Plain-Python definitions of block digests, Quest scores, block selection and the recall plan:
loops over blocks and heads, written for clarity, that the vectorized code must equal."""

from __future__ import annotations

import math

import torch

from pulseio_engine.config import GroupScore, SparseConfig


def ref_digest(keys: list[torch.Tensor], heads: tuple[int, ...] | None, layer: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """keys: a block's filled tokens, each [Hkv, D] -> (max, min) [width, D] over those tokens."""
    stacked = torch.stack(keys)                                   # [n, Hkv, D]
    if heads is not None:
        stacked = stacked[:, heads[layer]:heads[layer] + 1]
    return stacked.max(0).values, stacked.min(0).values


def ref_scores(q: torch.Tensor, dmax: torch.Tensor, dmin: torch.Tensor, num_kv_heads: int,
               kv_heads: list[int], rule: GroupScore = GroupScore.SUM,
               real_blocks: list[int] | None = None) -> torch.Tensor:
    """q: [B, Hq, D]; dmax, dmin: [B, NB, Hkv, D] -> [B, len(kv_heads), NB]: for each selecting KV head,
    each of its query heads' sum_i max(q_i M_i, q_i m_i), combined over the group by `rule`: added (SUM),
    or less that head's best over the request's first `real_blocks[b]` blocks (default: all NB), then the
    group's max (MAX_NORM)."""
    b, hq, d = q.shape
    group = hq // num_kv_heads
    nb = dmax.shape[1]
    out = torch.zeros((b, len(kv_heads), nb))
    for i in range(b):
        real = nb if real_blocks is None else real_blocks[i]
        for s, h in enumerate(kv_heads):
            col = h if dmax.shape[2] == num_kv_heads else s
            bounds = []
            for g in range(h * group, (h + 1) * group):
                row = []
                for n in range(nb):
                    total = 0.0
                    for j in range(d):
                        qj = float(q[i, g, j])
                        total += max(qj * float(dmax[i, n, col, j]), qj * float(dmin[i, n, col, j]))
                    row.append(total)
                bounds.append(row)
            for n in range(nb):
                if rule is GroupScore.SUM:
                    out[i, s, n] = sum(row[n] for row in bounds)
                else:
                    out[i, s, n] = max(row[n] - max(row[:real]) for row in bounds)
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


def ref_recall(selected: list[int], resident: list[int], num_slots: int, age: list[int] | None = None
               ) -> tuple[list[int], list[int], list[int], list[int]]:
    """One row's recall plan: (blocks, slots, evicted, selected_slots), as `plan_recall` defines them; with
    `age`, the evicted slots are the oldest (ties: the lower slot), taken in slot order."""
    owner = {slot: block for block, slot in enumerate(resident) if slot >= 0}
    chosen = [b for b in selected if b >= 0]
    kept = {resident[b] for b in chosen if resident[b] >= 0}
    empty = [s for s in range(num_slots) if s not in owner]
    evictable = [s for s in range(num_slots) if s in owner and s not in kept]
    if age is not None:
        lack = max(0, sum(1 for b in chosen if resident[b] < 0) - len(empty))
        evictable = sorted(sorted(evictable, key=lambda s: (-age[s], s))[:lack])
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


def ref_offload_decode(model, keys: list[torch.Tensor], values: list[torch.Tensor], token: int, position: int,
                       config: SparseConfig, dense_layers: int, heads: tuple[int, ...] | None
                       ) -> tuple[torch.Tensor, dict[int, list[list[int]]]]:
    """One decode step of one request, by definition: dense attention on layers < dense_layers; on the
    others, digests of every block of this request's keys, Quest scores, `ref_select` per selecting
    row, and attention over the tokens of the chosen blocks only. keys[l], values[l]: [n, Hkv, D] of
    the tokens before `position` (the new token's are appended) -> (logits [V] fp32, {layer: rows})."""
    import torch.nn.functional as F

    from pulseio_engine.model.layers import final_norm, post_attention, pre_attention

    cfg, w = model.config, model.weights
    hkv, group, bs = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, config.block_size
    x, delta = F.embedding(torch.tensor([token]), w.embed), None
    selections: dict[int, list[list[int]]] = {}
    for layer, lw in enumerate(w.layers):
        x, q, k, v = pre_attention(x, delta, torch.tensor([position]), model.rotary.cos, model.rotary.sin,
                                   lw.input_norm, lw.qkv, lw.qkv_bias, lw.q_norm, lw.k_norm, cfg.rms_norm_eps,
                                   cfg.num_heads, hkv, cfg.head_dim)
        keys[layer] = torch.cat([keys[layer], k])
        values[layer] = torch.cat([values[layer], v])
        n = position + 1
        allowed = torch.ones((hkv, n), dtype=torch.bool)
        if layer >= dense_layers:
            rows = list(range(hkv)) if heads is None else [heads[layer]]
            blocks = [list(keys[layer][i:i + bs]) for i in range(0, n, bs)]
            dmax = torch.stack([ref_digest(b, None, 0)[0] for b in blocks])[None]     # [1, NB, Hkv, D]
            dmin = torch.stack([ref_digest(b, None, 0)[1] for b in blocks])[None]
            scores = ref_scores(q, dmax, dmin, hkv, rows, config.group_score)
            selections[layer] = [ref_select(scores[0, s].tolist(), n, config) for s in range(len(rows))]
            token_block = torch.arange(n) // bs
            for h in range(hkv):
                chosen = torch.tensor([c for c in selections[layer][h if heads is None else 0] if c >= 0])
                allowed[h] = torch.isin(token_block, chosen)
        attn = torch.empty((1, cfg.num_heads, cfg.head_dim))
        for g in range(cfg.num_heads):
            h = g // group
            logit = (keys[layer][:, h].float() @ q[0, g].float()) * cfg.head_dim ** -0.5
            probs = torch.softmax(logit.masked_fill(~allowed[h], -torch.inf), dim=0)
            attn[0, g] = probs @ values[layer][:, h].float()
        x, delta = post_attention(x, attn.to(x.dtype), lw.o, lw.post_norm, lw.gate_up, lw.down, cfg.rms_norm_eps)
    logits = F.linear(final_norm(x, delta, w.norm, cfg.rms_norm_eps), w.lm_head).float()[0]
    return logits, selections


def ref_steer(scores: list[float], num_tokens: int, prev: set[int], kept: set[int], config: SparseConfig
              ) -> list[int]:
    """One row's steered selection, by definition (`kv/steering.py`): the forced blocks; then, of the middle
    blocks (stale: in `prev`; `kept` among them), the top m kept ones if there are m, else every kept one and
    the best fresh ones, else every kept and fresh one and the best unkept stale ones ("best": score
    descending, id ascending); all n blocks when n <= K; padded with -1."""
    k = config.budget_blocks
    n = math.ceil(num_tokens / config.block_size)
    if n <= k:
        return list(range(n)) + [-1] * (k - n)
    forced = set(range(config.sink_blocks)) | set(range(n - config.local_blocks, n))
    m = k - len(forced)
    middle = sorted(range(config.sink_blocks, n - config.local_blocks), key=lambda i: (-scores[i], i))
    kept = [i for i in middle if i in kept and i in prev]
    fresh = [i for i in middle if i not in prev]
    unkept = [i for i in middle if i in prev and i not in kept]
    if len(kept) >= m:
        chosen = kept[:m]
    elif len(kept) + len(fresh) >= m:
        chosen = kept + fresh[:m - len(kept)]
    else:
        chosen = kept + fresh + unkept[:m - len(kept) - len(fresh)]
    return sorted(forced | set(chosen))
