"""Triton kernels of `fused_selection`: Quest bounds from the paged digests, and the per-row select.

Why they look the way they do:

- Score: a sparse decode layer streams one layer's digests (per-head Quest at 8 x 32K on Qwen3-14B:
  64 MiB) and must do it near HBM bandwidth, so one program is one tile of TILE block columns of one
  (row, request): TILE ids from the block table, then a [TILE, D] tile of max and of min through them
  (rows of D contiguous elements: 16-byte loads), the row's G queries loaded once, fp32 FMAs and a sum
  over D. The grid (tiles, rows, requests) fills the GPU; nothing is gathered or converted beforehand.
- Select: one program per row with every block column in registers: BLOCK = the next power of two of
  max(NB, K), or, where NB is just past one, that power of two and a tail of at most half as many
  (`_row_split`: 2,050 columns run as 2,048 + 256, not 4,096; a row is a chain of CTA-wide steps whose
  cost grows with the columns a thread holds). Every per-column value then comes in two tensors, and each
  thread sums its columns of both before a reduction, so a step of the search is still one CTA reduction.
  The top-K is a selection, not a sort: scores become order-preserving int32 keys (-0.0 is
  0.0 first, as the sort sees them), a radix-4 search of at most 16 steps, started at the first digit where
  the members' smallest and largest keys differ, finds the need-th largest key (each
  step counts three candidate thresholds at once: packed in one int32 per element and summed over a thread's
  elements, then widened to one int64 for the CTA reduction; a row is one CTA on one SM, so the search is a
  chain of latencies and every instruction per element counts). It stops at the first threshold with exactly
  the need at or above it, whose blocks are the answer; after all 16 steps the blocks above the need-th key
  are taken and the ties at it go to the lowest ids through a cumsum. A cumsum of the chosen mask then writes
  the ids ascending. Steering (`steering.py`) hashes each block to decide which
  stale blocks stay, then runs the same one search, on the set its counts pick.
- HOT plan: the program writes its mask to global memory and, after `tl.debug_barrier()` (a CTA barrier
  makes the program's own global writes visible to its threads), gathers through it: whether each hot
  index's owner is still selected, then the rank -> free hot index match through a small scratch row. With
  more hot entries than the recall needs freed (a hot set larger than the budget), the victims are the
  oldest by age, found by the same threshold search the selection uses (skipped when every evictable entry
  goes); every entry's age is rewritten (0 where a chosen block sits, one
  more elsewhere).
  The recall pairs are appended at an offset reserved by one `tl.atomic_add` per program on `count`,
  which the score kernel's first program zeroed earlier in stream order. With arrivals (SPLIT), a chosen
  block's place in its own table is its rank among the resident or among the recalled blocks, which the
  packed scan already counts: no further scan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from ..config import GroupScore, SparseConfig
from .steering import AHEAD_SALT, keep_threshold, steer_key

if TYPE_CHECKING:
    from .fused_selection import HotRecall, Steering

_SCORE_TILE_ELEMS = 8192     # TILE * D elements of max (and as many of min) per score program
_MAX_BLOCK = 32768           # counts are packed in 16- and 21-bit fields (and 10-bit ones a thread)


@triton.jit
def _score_kernel(q_ptr, dmax_ptr, dmin_ptr, bt_ptr, out_ptr, count_ptr, nb, head0, col0, col_step,
                  stride_qb, stride_qh, stride_dn, stride_dw, stride_btb, stride_btn,
                  stride_ob, stride_os, stride_oc,
                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, TILE: tl.constexpr, MAX_NORM: tl.constexpr,
                  HAS_COUNT: tl.constexpr):
    tile = tl.program_id(0)
    s = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    if HAS_COUNT:
        tl.store(count_ptr, tl.zeros([], tl.int64), mask=(tile == 0) & (s == 0) & (b == 0))
    blocks = tile * TILE + tl.arange(0, TILE)
    valid = blocks < nb
    ids = tl.load(bt_ptr + b * stride_btb + blocks * stride_btn, mask=valid, other=0).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    at = (ids * stride_dn + (col0 + s * col_step) * stride_dw)[:, None] + offs_d[None, :]     # [TILE, D]
    dmax = tl.load(dmax_ptr + at, mask=valid[:, None], other=0.0).to(tl.float32)
    dmin = tl.load(dmin_ptr + at, mask=valid[:, None], other=0.0).to(tl.float32)
    q_row = q_ptr + b * stride_qb + ((head0 + s) * GROUP) * stride_qh + offs_d
    out_row = out_ptr + b * stride_ob + s * stride_os + blocks
    if MAX_NORM:
        for g in tl.static_range(GROUP):
            qg = tl.load(q_row + g * stride_qh).to(tl.float32)
            bound = tl.sum(dmax * tl.maximum(qg, 0.0)[None, :] + dmin * tl.minimum(qg, 0.0)[None, :], axis=1)
            tl.store(out_row + g * stride_oc, bound, mask=valid)
    else:
        pos = tl.zeros([HEAD_DIM], tl.float32)
        neg = tl.zeros([HEAD_DIM], tl.float32)
        for g in tl.static_range(GROUP):
            qg = tl.load(q_row + g * stride_qh).to(tl.float32)
            pos += tl.maximum(qg, 0.0)
            neg += tl.minimum(qg, 0.0)
        tl.store(out_row, tl.sum(dmax * pos[None, :] + dmin * neg[None, :], axis=1), mask=valid)


@triton.jit
def _order_key(x):
    """fp32 -> int32 whose signed order is the floats' order, -0.0 and 0.0 one key."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _mix32(x):
    """murmur3's 32-bit finalizer (uint32 arithmetic wraps), as `steering.mix32`."""
    x ^= x >> 16
    x *= 0x85EBCA6B
    x ^= x >> 13
    x *= 0xC2B2AE35
    x ^= x >> 16
    return x


@triton.jit
def _max_min(a_max, a_min, b_max, b_min):
    return tl.maximum(a_max, b_max), tl.minimum(a_min, b_min)


@triton.jit
def _fold(x, PER_THREAD: tl.constexpr):
    """[N] -> [N / PER_THREAD]: each thread's PER_THREAD elements summed (any grouping sums the same), so that a
    row's two parts fold onto the same [threads] shape and share one CTA reduction."""
    return tl.sum(tl.reshape(x, [x.shape[0] // PER_THREAD, PER_THREAD], can_reorder=True), axis=1)


@triton.jit
def _sum2(x, x_t, PER_THREAD: tl.constexpr, PER_THREAD_T: tl.constexpr, HAS_TAIL: tl.constexpr):
    """The sum over a row's columns and its tail's (HAS_TAIL) in one CTA reduction."""
    if HAS_TAIL:
        total = tl.sum(_fold(x, PER_THREAD) + _fold(x_t, PER_THREAD_T), axis=0)
    else:
        total = tl.sum(x, axis=0)
    return total


@triton.jit
def _max2(x, x_t, PER_THREAD: tl.constexpr, PER_THREAD_T: tl.constexpr, HAS_TAIL: tl.constexpr):
    """The largest of a row's columns and its tail's (HAS_TAIL) in one CTA reduction."""
    if HAS_TAIL:
        best = tl.max(tl.maximum(
            tl.max(tl.reshape(x, [x.shape[0] // PER_THREAD, PER_THREAD], can_reorder=True), axis=1),
            tl.max(tl.reshape(x_t, [x_t.shape[0] // PER_THREAD_T, PER_THREAD_T], can_reorder=True), axis=1)), axis=0)
    else:
        best = tl.max(x, axis=0)
    return best


@triton.jit
def _fold_range(key, member, PER_THREAD: tl.constexpr):
    """[N] -> ([N / PER_THREAD], [N / PER_THREAD]): each thread's largest and smallest member key (INT32_MIN and
    INT32_MAX where it holds no member)."""
    shape: tl.constexpr = [key.shape[0] // PER_THREAD, PER_THREAD]
    return tl.reduce((tl.reshape(tl.where(member, key, -2147483648), shape, can_reorder=True),
                      tl.reshape(tl.where(member, key, 2147483647), shape, can_reorder=True)), 1, _max_min)


@triton.jit
def _ge3(counted, t, digit):
    """Three counts packed in 10 bits each: the elements at or above t + digit, t + 2 digit, t + 3 digit (t in
    unsigned key space)."""
    base = t - 2147483648                    # back to the signed keys
    return ((counted >= (base + digit).to(tl.int32)).to(tl.int32)
            + ((counted >= (base + 2 * digit).to(tl.int32)).to(tl.int32) << 10)
            + ((counted >= (base + 3 * digit).to(tl.int32)).to(tl.int32) << 20))


@triton.jit
def _top(key, member, key_t, member_t, need, PER_THREAD: tl.constexpr, PER_THREAD_T: tl.constexpr,
         HAS_TAIL: tl.constexpr):
    """key: [BLOCK] int32 order keys; member: [BLOCK] bool; key_t, member_t: the row's tail past BLOCK ([TAIL],
    read with HAS_TAIL only); need: int32 -> ([BLOCK] bool, [TAIL] bool), the `need` members of largest key, ties
    to the lower index. PER_THREAD, PER_THREAD_T: BLOCK / threads and TAIL / threads, the elements a thread holds
    of each (together at most 1023: a thread's counts are summed in 10-bit fields before they are widened).

    The search starts below the members' smallest key at the first digit where it and the largest differ: the
    digits above are every member's, so the steps that would pick them are skipped (scores of one sign share
    their sign and top exponent bits; ages below 64 take 3 steps, not 16). It stops at the first threshold
    above exactly `need` members: the members at or above it are the answer, with no tie at the boundary to
    break. Without such a threshold (the need-th key tied with the next) the search runs to its last step and
    the ties at the need-th key go to the lowest ids."""
    need64 = need.to(tl.int64)
    counted = tl.where(member, key, -2147483648)    # every threshold tried is above INT32_MIN: never counted
    counted_t = tl.where(member_t, key_t, -2147483648)
    if HAS_TAIL:  # each thread's range over both parts, then one CTA reduction
        hi_p, lo_p = _fold_range(key, member, PER_THREAD)
        hi_q, lo_q = _fold_range(key_t, member_t, PER_THREAD_T)
        hi, lo = tl.reduce((tl.maximum(hi_p, hi_q), tl.minimum(lo_p, lo_q)), 0, _max_min)
    else:
        hi, lo = tl.reduce((counted, tl.where(member, key, 2147483647)), 0, _max_min)
    lo_u = lo.to(tl.int64) + 2147483648          # the smallest member key in unsigned key space [0, 2^32)
    diff = (hi.to(tl.int64) + 2147483648) ^ lo_u    # no members: hi < lo, a difference in the top bit
    # bits: the highest differing bit's position + 1, from diff's fp32 exponent (rounding up can add one: a
    # step earlier, never later); the search starts at the step whose digit holds that bit
    bits = tl.where(diff > 0, (diff.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 126, 0)
    step = tl.maximum(16 - (bits + 1) // 2, 0)    # (2^32 - 1 may round up to 33 bits)
    low = (32 - 2 * step).to(tl.int64)               # bits below the start: cleared
    t = (lo_u >> low) << low                     # threshold so far, in unsigned key space
    exact = tl.zeros([], tl.int1)                # no threshold has been counted yet
    while (step < 16) & (exact == 0):           # 2 bits a step, high first: t -> the need-th largest key
        digit = tl.full([], 1, tl.int64) << (30 - 2 * step).to(tl.int64)
        # 3 counts summed over each thread's elements (of both parts) first, then widened
        part = _fold(_ge3(counted, t, digit), PER_THREAD)
        if HAS_TAIL:
            part += _fold(_ge3(counted_t, t, digit), PER_THREAD_T)
        wide = ((part & 0x3FF).to(tl.int64) + (((part >> 10) & 0x3FF).to(tl.int64) << 21)
                + (((part >> 20) & 0x3FF).to(tl.int64) << 42))
        cnt = tl.sum(wide, axis=0)                                          # 3 counts, 21 bits each
        c3, c2, c1 = cnt >> 42, (cnt >> 21) & 0x1FFFFF, cnt & 0x1FFFFF
        at = tl.where(c3 >= need64, c3, tl.where(c2 >= need64, c2, tl.where(c1 >= need64, c1, 0)))
        t = tl.where(c3 >= need64, t + 3 * digit,
                     tl.where(c2 >= need64, t + 2 * digit, tl.where(c1 >= need64, t + digit, t)))
        exact = at == need64                     # the members at or above t are exactly the need
        step += 1
    thr = (t - 2147483648).to(tl.int32)
    if exact:
        top = member & (key >= thr)
        top_t = member_t & (key_t >= thr)
    else:
        above = member & (key > thr)
        tied = member & (key == thr)
        above_t = member_t & (key_t > thr)
        tied_t = member_t & (key_t == thr)
        # the members above (high 16 bits, both parts) and the tied ones before the tail (low 16 bits) in one
        # reduction; unsigned, so 32,768 of them do not turn negative
        counts = _sum2(tied.to(tl.uint32) + (above.to(tl.uint32) << 16), above_t.to(tl.uint32) << 16,
                       PER_THREAD, PER_THREAD_T, HAS_TAIL)
        rest = need - (counts >> 16).to(tl.int32)
        top = above | (tied & (tl.cumsum(tied.to(tl.int32), axis=0) <= rest))
        top_t = above_t
        if HAS_TAIL:
            top_t = above_t | (tied_t & (tl.cumsum(tied_t.to(tl.int32), axis=0) + (counts & 0xFFFF).to(tl.int32)
                                         <= rest))
    return top, top_t


@triton.jit(do_not_specialize=["capacity", "keep_threshold", "steer_key", "rewarm", "ahead"])
def _select_kernel(
    bounds_ptr, ntok_ptr, sel_ptr, mask_ptr, table_ptr, ctx_ptr, bt_ptr,
    res_ptr, owner_ptr, hot_ptr, age_ptr, hmap_ptr, ids_ptr, dst_ptr, count_ptr, scratch_ptr, wslot_ptr,
    k_ptr, v_ptr, pool_ptr, calls_ptr, atab_ptr, actx_ptr, pref_ptr,
    nb, nbw, capacity, keep_threshold, steer_key, rewarm, ahead,
    stride_bb, stride_bs, stride_bc, stride_nt, stride_selb, stride_sels, stride_mb, stride_ms,
    stride_tb, stride_ts, stride_cb, stride_cs, stride_btb, stride_btn,
    stride_rb, stride_rs, stride_ob, stride_os, stride_hb, stride_hs, stride_ab, stride_as,
    stride_mapb, stride_maps,
    stride_wb, stride_ws, stride_kb, stride_kh, stride_vb, stride_vh,
    stride_pn, stride_pkv, stride_pt, stride_ph, stride_callb, stride_calls,
    stride_atb, stride_ats, stride_acb, stride_acs, stride_pfb, stride_pfs,
    K: tl.constexpr, KB: tl.constexpr, SINK: tl.constexpr, LOCAL: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK: tl.constexpr, TAIL: tl.constexpr, HAS_TAIL: tl.constexpr, GROUP: tl.constexpr, MAX_NORM: tl.constexpr,
    HOT: tl.constexpr, STEER: tl.constexpr, REWARM: tl.constexpr, AHEAD: tl.constexpr, WRITE_KV: tl.constexpr,
    SPLIT: tl.constexpr,
    HG: tl.constexpr, HG_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, MASK_TILES: tl.constexpr,
    PER_THREAD: tl.constexpr, PER_THREAD_T: tl.constexpr, H: tl.constexpr, HB: tl.constexpr,
    PER_THREAD_H: tl.constexpr, SALT: tl.constexpr,
):  # fmt: skip
    # The row is columns [0, BLOCK) and, with HAS_TAIL, its tail [BLOCK, BLOCK + TAIL): every per-column value
    # comes in two tensors, x and x_t (without HAS_TAIL x_t is all masked off and never stored or reduced).
    s = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    n_tok = tl.load(ntok_ptr + b * stride_nt).to(tl.int32)
    n = tl.minimum((n_tok + BLOCK_SIZE - 1) // BLOCK_SIZE, nb)      # (n <= NB is the contract; never read past)
    ids = tl.arange(0, BLOCK)
    ids_t = BLOCK + tl.arange(0, TAIL)
    real = ids < n
    real_t = ids_t < n                   # (without HAS_TAIL, NB <= BLOCK: all false)
    in_table = ids < nb
    in_table_t = ids_t < nb
    b_row = bounds_ptr + b * stride_bb + s * stride_bs
    if MAX_NORM:  # each head's bounds less its best over the request's blocks, then the group's max
        score = tl.full([BLOCK], float("-inf"), tl.float32)
        score_t = tl.full([TAIL], float("-inf"), tl.float32)
        for g in tl.static_range(GROUP):
            x = tl.load(b_row + g * stride_bc + ids, mask=in_table, other=0.0)
            x_t = tl.load(b_row + g * stride_bc + ids_t, mask=in_table_t, other=0.0)
            best = _max2(tl.where(real, x, float("-inf")), tl.where(real_t, x_t, float("-inf")), PER_THREAD,
                         PER_THREAD_T, HAS_TAIL)
            score = tl.maximum(score, x - best)
            score_t = tl.maximum(score_t, x_t - best)
    else:
        score = tl.load(b_row + ids, mask=in_table, other=0.0)
        score_t = tl.load(b_row + ids_t, mask=in_table_t, other=0.0)
    key = _order_key(score)
    key_t = _order_key(score_t)
    # loads that do not depend on the selection, issued now so that their latency passes during the search
    t_row = table_ptr + b * stride_tb + s * stride_ts
    if HOT:
        r_row = res_ptr + b * stride_rb + s * stride_rs
        o_row = owner_ptr + b * stride_ob + s * stride_os
        hot_row = hot_ptr + b * stride_hb + s * stride_hs
        a_row = age_ptr + b * stride_ab + s * stride_as
        res = tl.load(r_row + ids, mask=in_table, other=-1).to(tl.int32)
        res_t = tl.load(r_row + ids_t, mask=in_table_t, other=-1).to(tl.int32)
        j = tl.arange(0, HB)
        own = tl.load(o_row + j, mask=j < H, other=-1).to(tl.int32)
        age = tl.load(a_row + j, mask=j < H, other=0)
        h_map = hmap_ptr + b * stride_mapb + s * stride_maps
        units = tl.load(h_map + ids, mask=real, other=0)
        units_t = tl.load(h_map + ids_t, mask=real_t, other=0)
    else:
        bt_row = bt_ptr + b * stride_btb
        phys = tl.load(bt_row + ids * stride_btn, mask=real, other=0).to(tl.int32)
        phys_t = tl.load(bt_row + ids_t * stride_btn, mask=real_t, other=0).to(tl.int32)
    forced = real & ((ids < SINK) | (ids >= n - LOCAL))
    forced_t = real_t & ((ids_t < SINK) | (ids_t >= n - LOCAL))
    middle = real & ~forced
    middle_t = real_t & ~forced_t
    m_row = mask_ptr + b * stride_mb + s * stride_ms
    m = K - SINK - LOCAL
    if STEER:  # stale blocks kept by their hash; then one search on the set the counts pick (steering.py)
        prev = tl.load(m_row + ids, mask=in_table & (ids < nbw), other=0) != 0
        prev_t = tl.load(m_row + ids_t, mask=in_table_t & (ids_t < nbw), other=0) != 0
        stale = middle & prev
        stale_t = middle_t & prev_t
        fresh = middle & ~prev
        fresh_t = middle_t & ~prev_t
        calls_at = calls_ptr + b * stride_callb + s * stride_calls
        calls = tl.load(calls_at)
        tl.store(calls_at, calls + 1)
        row = (b * tl.num_programs(0) + s).to(tl.uint32)
        h_row = _mix32(_mix32(steer_key.to(tl.uint32) ^ row) ^ calls.to(tl.uint32))
        u = (_mix32(h_row ^ ids.to(tl.uint32)) >> 8).to(tl.int64)
        u_t = (_mix32(h_row ^ ids_t.to(tl.uint32)) >> 8).to(tl.int64)
        counts = _sum2(stale.to(tl.uint32) + (fresh.to(tl.uint32) << 16),          # both in one reduction;
                       stale_t.to(tl.uint32) + (fresh_t.to(tl.uint32) << 16), PER_THREAD, PER_THREAD_T, HAS_TAIL)
        n_fresh = (counts >> 16).to(tl.int32)                # unsigned, so 32,768 fresh blocks do not turn negative
        kept = stale & (u * (counts & 0xFFFF).to(tl.int64) < keep_threshold)
        kept_t = stale_t & (u_t * (counts & 0xFFFF).to(tl.int64) < keep_threshold)
        n_kept = _sum2(kept.to(tl.int32), kept_t.to(tl.int32), PER_THREAD, PER_THREAD_T, HAS_TAIL)
        warm = ids < 0
        warm_t = ids_t < 0
        back = ids < 0
        back_t = ids_t < 0
        n_warm = tl.zeros([], tl.int32)
        n_back = tl.zeros([], tl.int32)
        if REWARM:  # fresh blocks still hot come back, each with the probability the count left asks
            warm = fresh & (res >= 0)
            warm_t = fresh_t & (res_t >= 0)
            n_warm = _sum2(warm.to(tl.int32), warm_t.to(tl.int32), PER_THREAD, PER_THREAD_T, HAS_TAIL)
            limit = (rewarm * (m - n_kept).to(tl.float32) * 16777216.0).to(tl.int64)
            back = warm & (u * n_warm.to(tl.int64) < limit)
            back_t = warm_t & (u_t * n_warm.to(tl.int64) < limit)
            n_back = _sum2(back.to(tl.int32), back_t.to(tl.int32), PER_THREAD, PER_THREAD_T, HAS_TAIL)
        early = ids < 0
        early_t = ids_t < 0
        n_early = tl.zeros([], tl.int32)
        if AHEAD:  # warm blocks a prediction recalled come back too, by a second draw (steering.steer_ahead)
            p_row = pref_ptr + b * stride_pfb + s * stride_pfs
            pref = tl.load(p_row + ids, mask=in_table & (ids < nbw), other=0)
            pref_t = tl.load(p_row + ids_t, mask=in_table_t & (ids_t < nbw), other=0)
            pool_a = warm & ~back & (pref != 0)
            pool_a_t = warm_t & ~back_t & (pref_t != 0)
            n_pool = _sum2(pool_a.to(tl.int32), pool_a_t.to(tl.int32), PER_THREAD, PER_THREAD_T, HAS_TAIL)
            limit_a = (ahead * (m - n_kept - n_back).to(tl.float32) * 16777216.0).to(tl.int64)
            v = (_mix32(u.to(tl.uint32) ^ tl.full([BLOCK], SALT, tl.uint32)) >> 8).to(tl.int64)
            v_t = (_mix32(u_t.to(tl.uint32) ^ tl.full([TAIL], SALT, tl.uint32)) >> 8).to(tl.int64)
            early = pool_a & (v * n_pool.to(tl.int64) < limit_a)
            early_t = pool_a_t & (v_t * n_pool.to(tl.int64) < limit_a)
            n_early = _sum2(early.to(tl.int32), early_t.to(tl.int32), PER_THREAD, PER_THREAD_T, HAS_TAIL)
        cold = fresh & ~warm
        cold_t = fresh_t & ~warm_t
        c1 = n_kept
        c2 = c1 + n_back
        c2e = c2 + n_early
        c3 = c2e + n_fresh - n_warm
        # the classes kept, back, early, cold, the rest: whole before the class where the count reaches m
        whole = tl.where(c1 >= m, ids < 0, tl.where(c2 >= m, kept, tl.where(c2e >= m, kept | back,
                         tl.where(c3 >= m, kept | back | early, kept | back | early | cold))))
        whole_t = tl.where(c1 >= m, ids_t < 0, tl.where(c2 >= m, kept_t, tl.where(c2e >= m, kept_t | back_t,
                           tl.where(c3 >= m, kept_t | back_t | early_t, kept_t | back_t | early_t | cold_t))))
        member = tl.where(c1 >= m, kept, tl.where(c2 >= m, back, tl.where(c2e >= m, early, tl.where(
            c3 >= m, cold, (stale & ~kept) | (warm & ~back & ~early)))))
        member_t = tl.where(c1 >= m, kept_t, tl.where(c2 >= m, back_t, tl.where(c2e >= m, early_t, tl.where(
            c3 >= m, cold_t, (stale_t & ~kept_t) | (warm_t & ~back_t & ~early_t)))))
        need = tl.where(c1 >= m, m, tl.where(c2 >= m, m - c1, tl.where(c2e >= m, m - c2,
                        tl.where(c3 >= m, m - c2e, m - c3))))
    else:
        whole = ids < 0
        whole_t = ids_t < 0
        member = middle
        member_t = middle_t
        need = tl.zeros([], tl.int32) + m
    picked, picked_t = _top(key, member, key_t, member_t, need, PER_THREAD, PER_THREAD_T, HAS_TAIL)
    chosen = tl.where(n > K, forced | picked | whole, real)
    chosen_t = tl.where(n > K, forced_t | picked_t | whole_t, real_t)

    if HOT:  # the chosen blocks and those of them to recall, counted in one scan and one sum: 16 bits each,
        # unsigned, so 32,768 of them do not turn negative
        need_it = chosen & (res < 0)                            # selected, not resident: recalled
        need_it_t = chosen_t & (res_t < 0)
        both = chosen.to(tl.uint32) + (need_it.to(tl.uint32) << 16)
        both_t = chosen_t.to(tl.uint32) + (need_it_t.to(tl.uint32) << 16)
    else:
        both = chosen.to(tl.uint32)
        both_t = chosen_t.to(tl.uint32)
    ranks = tl.cumsum(both, axis=0)
    if HAS_TAIL:  # the tail ranks after the row's columns: both parts' sums in one reduction (32 bits each)
        sums = tl.sum(_fold(both, PER_THREAD).to(tl.int64)
                      + (_fold(both_t, PER_THREAD_T).to(tl.int64) << 32), axis=0)
        ranks_t = tl.cumsum(both_t, axis=0) + (sums & 0xFFFFFFFF).to(tl.uint32)
        totals = ((sums & 0xFFFFFFFF) + (sums >> 32)).to(tl.uint32)
    else:
        ranks_t = both_t
        totals = tl.sum(both, axis=0)
    pos = (ranks & 0xFFFF).to(tl.int32) - 1                     # where each chosen id lands, ascending
    pos_t = (ranks_t & 0xFFFF).to(tl.int32) - 1
    n_sel = (totals & 0xFFFF).to(tl.int32)
    if HOT:
        rank = (ranks >> 16).to(tl.int32) - 1                   # each recalled block's place among them
        rank_t = (ranks_t >> 16).to(tl.int32) - 1
        n_need = (totals >> 16).to(tl.int32)
    kids = tl.arange(0, KB)                                   # the K output columns: padding is written there
    pad = (kids >= n_sel) & (kids < K)
    s_row = sel_ptr + b * stride_selb + s * stride_sels
    tl.store(s_row + pos, ids.to(tl.int64), mask=chosen)
    if HAS_TAIL:
        tl.store(s_row + pos_t, ids_t.to(tl.int64), mask=chosen_t)
    tl.store(s_row + kids, tl.full([KB], -1, tl.int64), mask=pad)
    tl.debug_barrier()                                          # every thread has read its previous mask
    tl.store(m_row + ids, chosen.to(tl.uint8), mask=ids < nbw)
    if HAS_TAIL:
        tl.store(m_row + ids_t, chosen_t.to(tl.uint8), mask=ids_t < nbw)
    for tile in tl.static_range(1, MASK_TILES):                # a mask wider than the row: zeros past it
        col = tile * BLOCK + ids
        tl.store(m_row + col, tl.zeros([BLOCK], tl.uint8), mask=(col < nbw) & (col >= BLOCK + TAIL * HAS_TAIL))
    offset = (n_tok - 1) % BLOCK_SIZE
    if not SPLIT:
        tl.store(ctx_ptr + b * stride_cb + s * stride_cs, (n_sel - 1) * BLOCK_SIZE + offset + 1)
    if HOT:
        tl.debug_barrier()                                      # the mask is visible to every thread
        held = tl.load(m_row + own, mask=own >= 0, other=0) != 0
        empty = (j < H) & (own < 0)
        victim = (own >= 0) & ~held                             # evictable
        n_free = tl.sum(empty.to(tl.uint32) + (victim.to(tl.uint32) << 16), axis=0)   # unsigned, as above
        n_empty = (n_free & 0xFFFF).to(tl.int32)
        n_victims = n_need - n_empty
        if (n_victims > 0) & (n_victims < (n_free >> 16).to(tl.int32)):      # only the oldest go
            victim = _top(age, victim, age, victim, n_victims, PER_THREAD_H, PER_THREAD_H, False)[0]
        free = empty.to(tl.uint32) + (victim.to(tl.uint32) << 16)          # both counted in one scan
        free_ranks = tl.cumsum(free, axis=0)
        free_rank = tl.where(empty, (free_ranks & 0xFFFF).to(tl.int32) - 1,
                             n_empty + (free_ranks >> 16).to(tl.int32) - 1)
        taken = (empty | victim) & (free_rank < n_need)
        scratch = scratch_ptr + (b * tl.num_programs(0) + s) * HB
        tl.store(scratch + free_rank, j, mask=empty | victim)  # free rank -> hot index
        tl.store(a_row + j, tl.where(held | taken, 0, age + 1), mask=j < H)
        tl.debug_barrier()
        index = tl.where(need_it, tl.load(scratch + rank, mask=need_it, other=0), res)   # hot index, chosen ids
        index_t = tl.where(need_it_t, tl.load(scratch + rank_t, mask=need_it_t, other=0), res_t)
        tl.store(r_row + own, tl.full([HB], -1, tl.int64), mask=victim & taken)
        tl.store(r_row + ids, index.to(tl.int64), mask=need_it)
        tl.store(o_row + index, ids.to(tl.int64), mask=need_it)
        if HAS_TAIL:
            tl.store(r_row + ids_t, index_t.to(tl.int64), mask=need_it_t)
            tl.store(o_row + index_t, ids_t.to(tl.int64), mask=need_it_t)
        dev = tl.load(hot_row + index, mask=chosen, other=0)      # device slot of every chosen block
        dev_t = tl.load(hot_row + index_t, mask=chosen_t, other=0)
        last = ids == n - 1                                     # the block being written
        last_t = real_t & (ids_t == n - 1)
        pad_slot = tl.load(hot_row).to(tl.int32) + tl.zeros([KB], tl.int32)
        if SPLIT:  # the resident blocks in the table, the recalled ones in the arrivals' table, each ascending
            present = chosen & ~need_it
            present_t = chosen_t & ~need_it_t
            n_pres = n_sel - n_need
            missing = BLOCK_SIZE - offset - 1                   # tokens of the block being written still to come
            lasts = _sum2((last & present).to(tl.int32) + ((last & need_it).to(tl.int32) << 1),
                          (last_t & present_t).to(tl.int32) + ((last_t & need_it_t).to(tl.int32) << 1),
                          PER_THREAD, PER_THREAD_T, HAS_TAIL)
            last_pres = lasts & 1
            last_need = lasts >> 1
            a_row = atab_ptr + b * stride_atb + s * stride_ats
            tl.store(t_row + pos - rank - 1, dev.to(tl.int32), mask=present)
            tl.store(a_row + rank, dev.to(tl.int32), mask=need_it)
            if HAS_TAIL:
                tl.store(t_row + pos_t - rank_t - 1, dev_t.to(tl.int32), mask=present_t)
                tl.store(a_row + rank_t, dev_t.to(tl.int32), mask=need_it_t)
            tl.store(t_row + kids, pad_slot, mask=(kids >= n_pres) & (kids < K))
            tl.store(a_row + kids, pad_slot, mask=(kids >= n_need) & (kids < K))
            tl.store(ctx_ptr + b * stride_cb + s * stride_cs, n_pres * BLOCK_SIZE - last_pres * missing)
            tl.store(actx_ptr + b * stride_acb + s * stride_acs, n_need * BLOCK_SIZE - last_need * missing)
        else:
            tl.store(t_row + pos, dev.to(tl.int32), mask=chosen)
            if HAS_TAIL:
                tl.store(t_row + pos_t, dev_t.to(tl.int32), mask=chosen_t)
            tl.store(t_row + kids, pad_slot, mask=pad)
        w_at = wslot_ptr + b * stride_wb + s * stride_ws
        tl.store(w_at + ids * 0, dev, mask=last)
        if HAS_TAIL:
            tl.store(w_at + ids_t * 0, dev_t, mask=last_t)
        start = tl.atomic_add(count_ptr, n_need.to(tl.int64))          # the row's place in the recall buffers
        at = start + rank
        tl.store(ids_ptr + at, units, mask=need_it & (at < capacity))     # (count not zeroed: never past them)
        tl.store(dst_ptr + at, dev, mask=need_it & (at < capacity))
        if HAS_TAIL:
            at_t = start + rank_t
            tl.store(ids_ptr + at_t, units_t, mask=need_it_t & (at_t < capacity))
            tl.store(dst_ptr + at_t, dev_t, mask=need_it_t & (at_t < capacity))
        if WRITE_KV:
            slot = _sum2(tl.where(last, dev, 0), tl.where(last_t, dev_t, 0), PER_THREAD, PER_THREAD_T, HAS_TAIL)
            hh = tl.arange(0, HG_PAD)[:, None]
            dd = tl.arange(0, HEAD_DIM)[None, :]
            heads = s * HG + hh
            k_new = tl.load(k_ptr + b * stride_kb + heads * stride_kh + dd, mask=hh < HG)
            v_new = tl.load(v_ptr + b * stride_vb + heads * stride_vh + dd, mask=hh < HG)
            dst = pool_ptr + slot * stride_pn + offset * stride_pt + hh * stride_ph + dd
            tl.store(dst, k_new.to(pool_ptr.dtype.element_ty), mask=hh < HG)
            tl.store(dst + stride_pkv, v_new.to(pool_ptr.dtype.element_ty), mask=hh < HG)
    else:
        tl.store(t_row + pos, phys, mask=chosen)
        if HAS_TAIL:
            tl.store(t_row + pos_t, phys_t, mask=chosen_t)
        tl.store(t_row + kids, tl.load(bt_row).to(tl.int32) + tl.zeros([KB], tl.int32), mask=pad)


def launch_score(q: torch.Tensor, dmax: torch.Tensor, dmin: torch.Tensor, block_tables: torch.Tensor,
                 out: torch.Tensor, count: torch.Tensor | None, *, num_kv_heads: int, head: int | None,
                 max_norm: bool, tile: int | None = None, num_warps: int | None = None) -> None:
    """`fused_selection.score_blocks` on Triton (arguments checked there); tile, num_warps: override the
    launch shape (benchmarks)."""
    b, hq, d = q.shape
    _, s, _, nb = out.shape
    if out.stride(3) != 1:
        raise ValueError("score_blocks out must be contiguous along NB")
    tile, head0, col0, col_step = _score_layout(q, dmax, dmin, nb, head, tile)
    _score_kernel[(triton.cdiv(nb, tile), s, b)](
        q, dmax, dmin, block_tables, out, count if count is not None else out, nb, head0, col0, col_step,
        q.stride(0), q.stride(1), dmax.stride(0), dmax.stride(1), block_tables.stride(0), block_tables.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        GROUP=hq // num_kv_heads, HEAD_DIM=d, TILE=tile, MAX_NORM=max_norm, HAS_COUNT=count is not None,
        num_warps=num_warps or (8 if tile * d >= 8192 else 4),
    )  # fmt: skip


def _score_layout(q: torch.Tensor, dmax: torch.Tensor, dmin: torch.Tensor, nb: int, head: int | None,
                  tile: int | None) -> tuple[int, int, int, int]:
    """(tile, head0, col0, col_step) of the score's programs, checked: TILE block columns a program (`tile` or
    the default), the first query head group, the digest column of row s (col0 + s * col_step)."""
    d = q.shape[2]
    if d & (d - 1) or q.stride(2) != 1 or dmax.stride(2) != 1 or dmax.stride() != dmin.stride():
        raise ValueError(f"the score kernel wants a power-of-two head_dim (got {d}), q and the digests "
                         "contiguous along it, and dmax and dmin of the same strides")
    tile = tile or max(16, min(_SCORE_TILE_ELEMS // d, triton.next_power_of_2(nb)))
    head0 = 0 if head is None else head
    col0, col_step = (0, 1) if head is None else ((0 if dmax.shape[1] == 1 else head), 0)
    return tile, head0, col0, col_step


def launch_select(bounds: torch.Tensor, num_tokens: torch.Tensor, config: SparseConfig, out: torch.Tensor,
                  mask: torch.Tensor, table: torch.Tensor, context_lens: torch.Tensor,
                  block_tables: torch.Tensor | None, hot: HotRecall | None, steer: Steering | None,
                  num_warps: int | None = None) -> None:
    """`fused_selection.select_blocks_fused` on Triton (arguments checked there); num_warps: override
    (benchmarks)."""
    b, s, c, nb = bounds.shape
    k = config.budget_blocks
    if max(nb, k) > _MAX_BLOCK:                    # (a power of two: so is the row's width then)
        raise ValueError(f"the select kernel holds at most {_MAX_BLOCK} block columns, got {max(nb, k)}")
    block, tail, warps = _row_split(nb, k, num_warps)
    new = hot.new_token if hot is not None else None
    dummy = out
    bt = block_tables if block_tables is not None else dummy
    res, own, slots, age, hmap, ids, dst, count, wslot = (
        (hot.resident, hot.owner, hot.hot, hot.age, hot.host_map, hot.recall_ids, hot.recall_dst, hot.count,
         hot.write_slot) if hot is not None else (dummy,) * 9)
    if any(t.stride(-1) != 1 for t in (bounds, out, mask, table, res, own, slots, age, hmap)):
        raise ValueError("select_blocks_fused wants bounds, out, mask, table and the HotRecall maps contiguous "
                         "along their last dimension")
    h = hot.hot.shape[-1] if hot is not None else k
    hb = triton.next_power_of_2(h)
    if hb > _MAX_BLOCK:
        raise ValueError(f"the select kernel holds at most {_MAX_BLOCK} hot entries a row, got {h}")
    scratch = torch.empty(b * s * hb if hot is not None else 1, dtype=torch.int32, device=bounds.device)
    kk, vv, pool = (new.k, new.v, new.pool) if new is not None else (dummy, dummy, dummy)
    hg = pool.shape[3] if new is not None else 1
    d = pool.shape[4] if new is not None else 1
    if new is not None and (d & (d - 1) or kk.stride(2) != 1 or vv.stride(2) != 1 or pool.stride(4) != 1):
        raise ValueError("the new token's K, V and the hot pool must be contiguous along a power-of-two head_dim")
    arrivals = hot.arrivals if hot is not None else None
    atab, actx = (arrivals.table, arrivals.context_lens) if arrivals is not None else (dummy, dummy)
    calls = steer.calls if steer is not None else dummy
    threshold = keep_threshold(steer.overlap, config) if steer is not None else 0
    key = steer_key(steer.seed, steer.layer) if steer is not None else 0
    rewarm = steer.rewarm if steer is not None else 0.0
    ahead = steer.ahead if steer is not None else 0.0
    pref = steer.prefetched if steer is not None and steer.ahead > 0 else None
    if pref is not None and pref.stride(-1) != 1:
        raise ValueError("select_blocks_fused wants Steering.prefetched contiguous along its last dimension")
    _select_kernel[(s, b)](
        bounds, num_tokens, out, mask, table, context_lens, bt,
        res, own, slots, age, hmap, ids, dst, count, scratch, wslot, kk, vv, pool, calls, atab, actx,
        dummy if pref is None else pref,
        nb, mask.shape[2], min(ids.numel(), dst.numel()), threshold, key, rewarm, ahead,
        bounds.stride(0), bounds.stride(1), bounds.stride(2), num_tokens.stride(0), out.stride(0), out.stride(1),
        mask.stride(0), mask.stride(1), table.stride(0), table.stride(1), context_lens.stride(0),
        context_lens.stride(1), *_s2(bt), *_s2(res), *_s2(own), *_s2(slots), *_s2(age), *_s2(hmap), *_s2(wslot),
        *_s2(kk), *_s2(vv), *(pool.stride()[:4] if new is not None else (0, 0, 0, 0)), *_s2(calls),
        *_s2(atab), *_s2(actx), *((0, 0) if pref is None else _s2(pref)),
        K=k, KB=triton.next_power_of_2(k), SINK=config.sink_blocks, LOCAL=config.local_blocks,
        BLOCK_SIZE=config.block_size, BLOCK=block, TAIL=max(tail, 1), HAS_TAIL=tail > 0,
        GROUP=c, MAX_NORM=config.group_score is GroupScore.MAX_NORM, HOT=hot is not None,
        STEER=steer is not None, REWARM=steer is not None and (steer.rewarm > 0 or steer.ahead > 0),
        AHEAD=pref is not None, WRITE_KV=new is not None,
        SPLIT=arrivals is not None, HG=hg, HG_PAD=triton.next_power_of_2(hg), HEAD_DIM=d,
        MASK_TILES=triton.cdiv(mask.shape[2], block), PER_THREAD=max(1, block // (32 * warps)),
        PER_THREAD_T=max(1, tail // (32 * warps)), H=h, HB=hb,
        PER_THREAD_H=max(1, hb // (32 * warps)), SALT=AHEAD_SALT, num_warps=warps,
    )  # fmt: skip


def _row_split(nb: int, k: int, num_warps: int | None = None) -> tuple[int, int, int]:
    """(BLOCK, TAIL, warps) of the select's rows of NB columns and budget K: one power of two of columns, or,
    where NB is just past one, that power of two and a tail of at most half as many (2050 columns: 2048 + 256,
    not 4096). A tail holds at least one column a thread, so that each thread sums its columns of both parts
    before the CTA-wide reduction, one a step of the search as without a tail. 8 warps up to BLOCK = 4096, 16
    above: the search is a chain of CTA-wide counts, whose barriers cost more with more warps, while the columns
    a thread holds cost registers (16 warps at 8192, 128K-token rows, keep them from spilling)."""
    width = triton.next_power_of_2(max(nb, k))
    half = width // 2
    warps = num_warps or (8 if half <= 4096 else 16)
    threads = 32 * warps
    tail = triton.next_power_of_2(max(nb - half, threads))
    if nb > half >= max(k, threads) and tail <= half // 2:
        return half, tail, warps
    return width, 0, num_warps or (8 if width <= 4096 else 16)


def _s2(t: torch.Tensor) -> tuple[int, int]:
    """The first two strides of a tensor (0, 0 for the dummies of unused arguments of fewer dimensions)."""
    return (t.stride(0), t.stride(1)) if t.dim() >= 2 else (0, 0)
