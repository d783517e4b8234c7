"""One sparse layer's block selection in two kernels: Quest bounds straight from the paged digests, then
per selecting row the top-K, the recall plan and the attention table in one program.

`score_blocks` computes each block's Quest bound through the block table (no gathered copy of the
digests, fp32 accumulation over bf16/fp16/fp32 loads), over a grid of (block tiles, rows, requests).
`select_blocks_fused` then does in one program per row (request b, selecting row s): the group rule,
sink/local forcing and padding, and the top-K by a threshold search on order-preserving keys (never a
sort); optionally steering (`kv/steering.py`); then the attention table, for all blocks on the GPU
(PAGED: `block_tables` given) or for an offload row's hot set (HOT: `hot` given), where it also plans the
recall exactly as `plan_recall` + `apply_recall` do, reserves the recall's place with an atomic add on
`count` and writes the new token into its hot slot; with `Arrivals` the table holds only the blocks already
resident and the arrivals' table those the recall brings (each ascending, with their own context lengths).

The contract is the torch reference below, built from `head_bounds`/`block_scores`, `select_blocks`,
`plan_recall`/`apply_recall` and `steering`: ids equal bit for bit. CPU tensors take the reference,
CUDA tensors the Triton kernels (`use_triton=True` forces them, for the interpreter tests). Shapes
depend on the config and the batch only and nothing syncs with the host, so both calls can be captured
in a CUDA graph. Shapes: B requests, Hq/Hkv query/KV heads, G = Hq / Hkv, D head_dim, S selecting rows
(Hkv for Quest, 1 for SoloHead), NB block-table columns, K = budget_blocks, H >= K hot entries a row,
N physical blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import GroupScore, SparseConfig
from .recall import compact
from .residency import apply_recall, plan_recall, touch
from .selection import PAD, block_scores, head_bounds, max_norm, select_blocks
from .steering import (
    keep_threshold,
    steer_ahead,
    steer_block_hash,
    steer_kept,
    steer_key,
    steer_rewarmed,
    steered_scores,
)


@dataclass(frozen=True)
class NewToken:
    """The token being decoded, written into its block's hot slot by the select kernel (HOT mode)."""

    k: torch.Tensor      # [B, Hkv, D]
    v: torch.Tensor      # [B, Hkv, D]
    pool: torch.Tensor   # [n_slots, 2, block_size, hg, D] the hot pool, hg = Hkv / S


@dataclass(frozen=True)
class Arrivals:
    """HOT mode's second attention table: the selected blocks the recall brings, as `table` and `context_lens`
    hold the others (already resident), so that attention to those can run while the recall is in flight."""

    table: torch.Tensor          # [B, S, K] int32 out: device slots of the recalled blocks, ascending by block
    context_lens: torch.Tensor   # [B, S] int32 out: tokens in them (0: none)


@dataclass(frozen=True)
class HotRecall:
    """HOT mode: one layer's offload state (owned and kept by the caller) and the recall it produces.
    Initially resident and owner are all -1 (age any); each call keeps owner the exact inverse of resident.
    The hot set has H >= K entries a row; a block to recall takes an empty entry, else the entry whose block
    was selected least recently (`residency.plan_recall` with ages)."""

    resident: torch.Tensor     # [B, S, NB] int64 in/out: block -> hot index in [0, H), or -1
    owner: torch.Tensor        # [B, S, H] int64 in/out: hot index -> block, or -1
    hot: torch.Tensor          # [B, S, H] int64: hot index -> device slot of the pool
    age: torch.Tensor          # [B, S, H] int32 in/out: calls since each entry's block was last selected
    host_map: torch.Tensor     # [B, S, NB] int64: block -> host unit
    recall_ids: torch.Tensor   # [>= B * S * K] int64 out: host units to recall, entries [0, count)
    recall_dst: torch.Tensor   # [>= B * S * K] int64 out: their device slots
    count: torch.Tensor        # [1] int64: zeroed by `score_blocks(count=...)`, the pairs written after
                               # (appended at count: pairs past the buffers' end are dropped, still counted)
    write_slot: torch.Tensor   # [B, S] int64 out: device slot of the block being written
    new_token: NewToken | None = None
    arrivals: Arrivals | None = None   # given: the table splits into the resident blocks and these


@dataclass(frozen=True)
class Steering:
    """Impose a step-to-step locality (`kv/steering.py`); the selection's `mask` holds the previous step."""

    overlap: float             # in [0, 1]: the fraction of middle slots kept from the previous selection
    calls: torch.Tensor        # [B, S] int64 in/out: each row's call counter, bumped by every call
    seed: int = 0
    layer: int = 0
    rewarm: float = 0.0        # in [0, 1], HOT only: the fraction of the other middle slots refilled from
                               # blocks still in the hot set (a larger hot set's hits, see kv/steering.py)
    ahead: float = 0.0         # in [0, 1], HOT only: of the middle slots left after rewarm, the fraction refilled
                               # from the hot set's blocks a prediction recalled ahead (`prefetched`)
    prefetched: torch.Tensor | None = None   # [B, S, NBW] uint8: 1 at the blocks that prediction selected


def score_blocks(q: torch.Tensor, dmax: torch.Tensor, dmin: torch.Tensor, block_tables: torch.Tensor, *,
                 num_kv_heads: int, head: int | None, rule: GroupScore, count: torch.Tensor | None = None,
                 out: torch.Tensor | None = None, use_triton: bool | None = None) -> torch.Tensor:
    """Quest bounds of every block column -> [B, S, C, NB] fp32 (into `out` if given).
    q: [B, Hq, D] post-RoPE queries (bf16, fp16, fp32); dmax, dmin: [N, W, D] one layer's digests by
    physical block (W = Hkv, or 1 when only the selecting head is digested); block_tables: [B, NB] int32/64
    (columns past a request's blocks: any valid id; read, never used); head: None (S = Hkv) or the one
    selecting KV head (S = 1; digest column 0 if W == 1 else `head`). rule SUM: C = 1, the bound of the
    group's summed relu(q) and min(q, 0); MAX_NORM: C = G, each query head's own bound.
    count: [1] int64, set to 0 (the select kernel's atomic counter; stream order makes it safe)."""
    s, c = _score_shape(q, dmax, dmin, block_tables, num_kv_heads, head, rule)
    b, nb = block_tables.shape
    if out is None:
        out = torch.empty((b, s, c, nb), dtype=torch.float32, device=q.device)
    elif out.shape != (b, s, c, nb) or out.dtype != torch.float32:
        raise ValueError(f"score_blocks out must be [B, S, C, NB] = {[b, s, c, nb]} float32, "
                         f"got {list(out.shape)} {out.dtype}")
    if _triton(q, use_triton):
        from . import select_kernels
        select_kernels.launch_score(q, dmax, dmin, block_tables, out, count, num_kv_heads=num_kv_heads,
                                    head=head, max_norm=rule is GroupScore.MAX_NORM)
        return out
    if count is not None:
        count.zero_()
    cols = list(range(num_kv_heads)) if head is None else [0 if dmax.shape[1] == 1 else head]
    gmax, gmin = dmax[block_tables.long()][:, :, cols], dmin[block_tables.long()][:, :, cols]   # [B, NB, S, D]
    if rule is GroupScore.SUM:
        ones = torch.ones(b, dtype=torch.long, device=q.device)          # num_tokens: unused by SUM
        out.copy_(block_scores(q, num_kv_heads, head, gmax, gmin, ones, 1, rule)[:, :, None])
    else:
        out.copy_(head_bounds(q, num_kv_heads, head, gmax, gmin))
    return out


def combine(bounds: torch.Tensor, num_tokens: torch.Tensor, config: SparseConfig) -> torch.Tensor:
    """bounds: [B, S, C, NB] from `score_blocks` -> one score per block [B, S, NB] by config.group_score."""
    if config.group_score is GroupScore.SUM:
        return bounds[:, :, 0]
    return max_norm(bounds, num_tokens.long(), config.block_size)


def select_blocks_fused(bounds: torch.Tensor, num_tokens: torch.Tensor, config: SparseConfig, *,
                        mask: torch.Tensor, table: torch.Tensor, context_lens: torch.Tensor,
                        block_tables: torch.Tensor | None = None, hot: HotRecall | None = None,
                        steer: Steering | None = None, out: torch.Tensor | None = None,
                        use_triton: bool | None = None) -> torch.Tensor:
    """`select_blocks(combine(bounds, num_tokens, config), num_tokens, config)` -> selected [B, S, K] int64
    (into `out` if given): ids ascending, -1 padded, ties to the lower id, all n blocks when n <= K.
    bounds: [B, S, C, NB] fp32; num_tokens: [B] int, the token being decoded included, <= NB * block_size.
    Also writes mask: [B, S, NBW] uint8, NBW >= NB, 1 exactly at the selected blocks (with `steer`, read
    first as the previous step's selection); context_lens: [B, S] int32 tokens in the selected blocks;
    table: [B, S, K] int32 for attention: PAGED (block_tables [B, NB] given) the selected blocks' physical
    ids, HOT (`hot` given) their device slots; entries past the selected ones repeat entry 0's source
    (block_tables[b, 0], hot[b, s, 0]). HOT with `hot.arrivals`: table and context_lens cover the selected
    blocks resident before the call, the arrivals' those it recalls (either may be empty: length 0)."""
    b, s, _, nb = bounds.shape
    k = config.budget_blocks
    _check_select(bounds, num_tokens, config, mask, table, context_lens, block_tables, hot, steer)
    if out is None:
        out = torch.empty((b, s, k), dtype=torch.int64, device=bounds.device)
    if _triton(bounds, use_triton):
        from . import select_kernels
        select_kernels.launch_select(bounds, num_tokens, config, out, mask, table, context_lens, block_tables,
                                     hot, steer)
        return out
    scores = combine(bounds, num_tokens, config)
    if steer is not None:
        u = steer_block_hash(steer_key(steer.seed, steer.layer), steer.calls, nb)
        prev = mask[..., :nb] != 0
        kept = steer_kept(prev, num_tokens, u, keep_threshold(steer.overlap, config), config)
        rewarmed = ahead = None
        if steer.rewarm > 0 or steer.ahead > 0:
            assert hot is not None                                     # (checked: both need a hot set)
            rewarmed = steer_rewarmed(prev, hot.resident, num_tokens, u, kept, steer.rewarm, config)
        if steer.ahead > 0:
            assert rewarmed is not None and steer.prefetched is not None
            ahead = steer_ahead(steer.prefetched[..., :nb] != 0, *rewarmed, u, kept, steer.ahead, config)
        scores = steered_scores(scores, num_tokens, prev, kept, config, rewarmed, ahead)
        steer.calls.add_(1)
    selected = out.copy_(select_blocks(scores, num_tokens.long(), config))
    marks = torch.zeros((b, s, mask.shape[2] + 1), dtype=mask.dtype, device=mask.device)
    mask.copy_(marks.scatter_(2, torch.where(selected >= 0, selected, mask.shape[2]), 1)[..., :-1])
    n_sel = (selected >= 0).sum(2)                                                   # [B, S]
    offset = (num_tokens.long() - 1) % config.block_size                             # [B]
    if hot is None or hot.arrivals is None:                                          # (split: per part, below)
        context_lens.copy_((n_sel - 1) * config.block_size + offset[:, None] + 1)
    if hot is None:
        rows = block_tables.long().gather(1, selected.clamp(min=0).view(b, s * k))  # type: ignore[union-attr]
        table.copy_(rows.view(b, s, k))
    else:
        _hot_reference(selected, offset, hot, table, context_lens, k, config.block_size)
    return selected


def _hot_reference(selected: torch.Tensor, offset: torch.Tensor, hot: HotRecall, table: torch.Tensor,
                   context_lens: torch.Tensor, k: int, block_size: int) -> None:
    """HOT mode on torch: `plan_recall` + `apply_recall`, the owner map as resident's inverse, the
    recall pairs appended at `count`, the new token into its hot slot."""
    b, s, nb = hot.resident.shape
    r, h = b * s, hot.hot.shape[2]
    rows = selected.reshape(r, k)
    resident = hot.resident.reshape(r, nb)
    plan = plan_recall(rows, resident, h, age=hot.age.reshape(r, h))
    arriving = (rows >= 0) & (resident.gather(1, rows.clamp(min=0)) < 0)             # before the plan is applied
    after = apply_recall(resident, plan)
    hot.resident.copy_(after.view(b, s, nb))
    hot.age.copy_(touch(hot.age.reshape(r, h), plan).view(b, s, h))
    owner = torch.full((r, h + 1), PAD, dtype=torch.int64, device=rows.device)
    blocks = torch.arange(nb, device=rows.device).expand(r, nb)
    hot.owner.copy_(owner.scatter_(1, torch.where(after >= 0, after, h), blocks)[:, :h].view(b, s, h))
    slots = hot.hot.reshape(r, h)
    dev = slots.gather(1, plan.selected_slots.clamp(min=0))                          # each entry's device slot
    if hot.arrivals is None:
        table.copy_(dev.view(b, s, k))
    else:
        _split_reference(rows, arriving, dev, slots[:, :1], offset.repeat_interleave(s), table, context_lens,
                         hot.arrivals, block_size)
    n_sel = (rows >= 0).sum(1)
    hot.write_slot.copy_(slots.gather(1, plan.selected_slots.gather(1, (n_sel - 1)[:, None])).view(b, s))
    units = hot.host_map.reshape(r, nb).gather(1, plan.blocks.clamp(min=0))
    ids, dst, n = compact(units, slots.gather(1, plan.slots.clamp(min=0)), plan.blocks >= 0)
    at = torch.arange(r * k, device=rows.device)
    for buffer, values in ((hot.recall_ids, ids), (hot.recall_dst, dst)):   # appended at count, as the kernel's
        cap = min(hot.recall_ids.numel(), hot.recall_dst.numel())            # atomic add does; none past the end
        where = torch.where((at < n) & (hot.count + at < cap), hot.count + at, buffer.numel())
        buffer.copy_(torch.cat([buffer, buffer[:1]]).scatter_(0, where, values)[:-1])
    hot.count.add_(n)
    if hot.new_token is not None:
        t = hot.new_token
        hg, d = t.pool.shape[3], t.pool.shape[4]
        at_slot, at_offset = hot.write_slot.reshape(r), offset.repeat_interleave(s)
        t.pool[at_slot, 0, at_offset] = t.k.reshape(r, hg, d).to(t.pool.dtype)
        t.pool[at_slot, 1, at_offset] = t.v.reshape(r, hg, d).to(t.pool.dtype)


def _split_reference(rows: torch.Tensor, arriving: torch.Tensor, dev: torch.Tensor, pad_slot: torch.Tensor,
                     offset: torch.Tensor, table: torch.Tensor, context_lens: torch.Tensor, arrivals: Arrivals,
                     block_size: int) -> None:
    """HOT with arrivals on torch: rows [R, K] selected (ascending, -1 padded), arriving [R, K] which of them the
    recall brings, dev [R, K] each one's device slot, pad_slot [R, 1] what entries past a table's blocks hold (hot
    index 0's slot, as the whole table's do), offset [R] of the token being written."""
    r, k = rows.shape
    b, s = context_lens.shape
    valid = rows >= 0
    n_sel = valid.sum(1)
    last = (torch.arange(k, device=rows.device) == (n_sel - 1)[:, None]) & valid      # the block being written
    missing = block_size - offset - 1                                                # its tokens still to come
    pad = pad_slot.expand(r, k)
    for part, out_table, out_lens in ((valid & ~arriving, table, context_lens),
                                      (arriving, arrivals.table, arrivals.context_lens)):
        order = (~part).long().argsort(dim=1, stable=True)                           # the part's entries first
        n = part.sum(1)
        first = torch.arange(k, device=rows.device) < n[:, None]
        out_table.copy_(torch.where(first, dev.gather(1, order), pad).view(b, s, k))
        out_lens.copy_((n * block_size - (last & part).any(1).long() * missing).view(b, s))


def _triton(t: torch.Tensor, use_triton: bool | None) -> bool:
    return t.is_cuda if use_triton is None else use_triton


def _score_shape(q: torch.Tensor, dmax: torch.Tensor, dmin: torch.Tensor, block_tables: torch.Tensor,
                 num_kv_heads: int, head: int | None, rule: GroupScore) -> tuple[int, int]:
    """(S, C) of the bounds, after checking the arguments against each other."""
    b, hq, d = q.shape
    if hq % num_kv_heads:
        raise ValueError(f"q has {hq} heads, not a multiple of num_kv_heads ({num_kv_heads})")
    if dmax.shape != dmin.shape or dmax.dim() != 3 or dmax.shape[2] != d:
        raise ValueError(f"dmax and dmin must both be [N, W, D={d}], got {list(dmax.shape)} and {list(dmin.shape)}")
    if dmax.shape[1] not in (1, num_kv_heads) or (head is None and dmax.shape[1] != num_kv_heads):
        raise ValueError(f"digests of width {dmax.shape[1]} need head given (W = 1) or W = Hkv ({num_kv_heads})")
    if head is not None and not 0 <= head < num_kv_heads:
        raise ValueError(f"head {head} is not a KV head in [0, {num_kv_heads})")
    if block_tables.dim() != 2 or block_tables.shape[0] != b:
        raise ValueError(f"block_tables must be [B={b}, NB], got {list(block_tables.shape)}")
    return (num_kv_heads if head is None else 1), (1 if rule is GroupScore.SUM else hq // num_kv_heads)


def _check_select(bounds: torch.Tensor, num_tokens: torch.Tensor, config: SparseConfig, mask: torch.Tensor,
                  table: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor | None,
                  hot: HotRecall | None, steer: Steering | None) -> None:
    b, s, c, nb = bounds.shape
    k = config.budget_blocks
    if (block_tables is None) == (hot is None):
        raise ValueError("select_blocks_fused takes block_tables (PAGED: every block on the GPU) or hot "
                         "(HOT: an offload row's hot set), exactly one")
    if config.group_score is GroupScore.SUM and c != 1:
        raise ValueError(f"group_score SUM takes bounds [B, S, 1, NB], got C = {c} (score with rule=SUM)")
    if num_tokens.shape != (b,):
        raise ValueError(f"num_tokens must be [B={b}], got {list(num_tokens.shape)}")
    if mask.shape[:2] != (b, s) or mask.shape[2] < nb or mask.dtype != torch.uint8:
        raise ValueError(f"mask must be [B, S, NBW >= {nb}] uint8 with B, S = {b}, {s}, got "
                         f"{list(mask.shape)} {mask.dtype}")
    if table.shape != (b, s, k) or table.dtype != torch.int32:
        raise ValueError(f"table must be [B, S, K] = {[b, s, k]} int32, got {list(table.shape)} {table.dtype}")
    if context_lens.shape != (b, s) or context_lens.dtype != torch.int32:
        raise ValueError(f"context_lens must be [B, S] = {[b, s]} int32, got {list(context_lens.shape)} "
                         f"{context_lens.dtype}")
    h = hot.hot.shape[-1] if hot is not None else k
    if hot is not None and (hot.resident.shape != (b, s, nb) or hot.hot.shape != (b, s, h) or h < k
                            or hot.owner.shape != (b, s, h) or hot.age.shape != (b, s, h)
                            or hot.age.dtype != torch.int32 or hot.host_map.shape != (b, s, nb)
                            or hot.recall_ids.numel() < b * s * k or hot.recall_dst.numel() < b * s * k):
        raise ValueError(f"HotRecall wants resident, host_map [B, S, NB] = {[b, s, nb]}, hot, owner and age (int32) "
                         f"[B, S, H] with H >= K = {k} (got hot {list(hot.hot.shape)}, owner "
                         f"{list(hot.owner.shape)}, age {list(hot.age.shape)} {hot.age.dtype}) and recall buffers "
                         f"of B * S * K = {b * s * k} entries")
    arrivals = None if hot is None else hot.arrivals
    if arrivals is not None and (arrivals.table.shape != (b, s, k) or arrivals.table.dtype != torch.int32
                                 or arrivals.context_lens.shape != (b, s)
                                 or arrivals.context_lens.dtype != torch.int32):
        raise ValueError(f"Arrivals wants table [B, S, K] = {[b, s, k]} int32 and context_lens [B, S] int32, got "
                         f"{list(arrivals.table.shape)} {arrivals.table.dtype} and "
                         f"{list(arrivals.context_lens.shape)} {arrivals.context_lens.dtype}")
    if steer is not None and (steer.calls.shape != (b, s) or not 0.0 <= steer.overlap <= 1.0
                              or not 0.0 <= steer.rewarm <= 1.0 or not 0.0 <= steer.ahead <= 1.0):
        raise ValueError(f"Steering wants calls [B, S] = {[b, s]}, an overlap, a rewarm and an ahead in [0, 1], got "
                         f"{list(steer.calls.shape)}, {steer.overlap}, {steer.rewarm} and {steer.ahead}")
    if steer is not None and steer.rewarm > 0 and hot is None:
        raise ValueError(f"Steering.rewarm ({steer.rewarm}) brings blocks back from a hot set: HOT mode only "
                         "(PAGED rows have every block on the GPU)")
    if steer is not None and steer.ahead > 0 and (hot is None or steer.prefetched is None
                                                  or steer.prefetched.shape != mask.shape
                                                  or steer.prefetched.dtype != torch.uint8):
        raise ValueError(f"Steering.ahead ({steer.ahead}) refills from the blocks a prediction recalled into a hot "
                         f"set: HOT mode, with prefetched [B, S, NBW] = {list(mask.shape)} uint8 (got "
                         f"{None if steer.prefetched is None else list(steer.prefetched.shape)})")
