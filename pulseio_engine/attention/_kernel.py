"""Triton kernels of flash-decoding over a paged KV cache.

Why the kernel looks the way it does (decode attention is a pure HBM stream):

- One program = one (KV head, context split, sequence). It loads each KV tile once and uses it for
  all GROUP = Hq / Hkv query heads of that KV head, through `tl.dot` with the query group padded to
  GROUP_PAD >= 16 rows (the MMA minimum). The padded rows are zeros and are never stored.
- Split-K: the context of each sequence is cut into `num_splits` ranges of whole BLOCK_N-token tiles,
  computed on the device from `context_lens`, so the grid (Hkv, num_splits, B) depends on shapes only
  (CUDA-graph safe) while the work per program follows the real length. `num_splits` is a runtime
  argument, not a constexpr, so trying several costs no recompilation.
- Tiles gather tokens through the block table, one page id per token: token t of the sequence lives at
  page block_tables[b, t // PAGE_SIZE], slot t % PAGE_SIZE. BLOCK_N may be smaller or larger than a page.
  Page ids are loaded only for t < context_len, so unused block-table entries are never read.
- Each split writes its output normalised, plus its log-sum-exp (base 2); `_reduce_splits_kernel`
  merges the splits. With one split the first kernel writes the final output itself (DIRECT), and may
  merge PRIOR partial outputs of earlier tables of the same queries into it (the last part of a
  multi-table attention, `_partials.py`): no reduce launch.
- Latency hiding: page ids are loaded one tile ahead in registers so that Triton's software pipeliner
  (num_stages) keeps num_stages - 1 K/V tiles in flight through a cp.async ring; PREFETCH=True is an
  alternative for num_stages=1 that holds the next tile in registers instead. Which wins is measured by
  benchmarks/bench_attention.py; on sm_90 the K/V loads compile to 16-byte vector loads either way.
- The program id order puts the KV head fastest, so the Hkv programs of one (sequence, split) run
  together and read neighbouring bytes of the same pages.
- Row tables (sparse attention): a sequence has TABLE_ROWS tables, row kv_head // HEADS_PER_ROW serving
  its KV heads, each with its own context length (the selected blocks differ per row). The cache holds
  CACHE_HEADS heads per page: every KV head (the paged cache: head kv_head) or one row's (a pool of
  per-row units: head kv_head % CACHE_HEADS). Plain tables are the case TABLE_ROWS = 1.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _page_ids(bt_row, tok, limit, stride_btn, PAGE_SIZE: tl.constexpr):
    """Physical page of each token; entries for tokens >= limit are never read."""
    return tl.load(bt_row + (tok // PAGE_SIZE) * stride_btn, mask=tok < limit, other=0)


@triton.jit
def _load_kv(
    k_head, v_head, page, tok, limit, offs_d,
    stride_kb, stride_kt, stride_kd, stride_vb, stride_vt, stride_vd, PAGE_SIZE: tl.constexpr,
):  # fmt: skip
    """K and V rows of tokens `tok` ([BLOCK_N]) living at `page`; tokens >= limit read as zeros."""
    page = page.to(tl.int64)
    slot = tok % PAGE_SIZE
    mask = (tok < limit)[:, None]
    k = tl.load(k_head + (page * stride_kb + slot * stride_kt)[:, None] + offs_d[None, :] * stride_kd,
                mask=mask, other=0.0)  # fmt: skip
    v = tl.load(v_head + (page * stride_vb + slot * stride_vt)[:, None] + offs_d[None, :] * stride_vd,
                mask=mask, other=0.0)  # fmt: skip
    return k, v  # [BLOCK_N, HEAD_DIM] each


@triton.jit
def _attend_tile(q, k, v, tok_mask, m_i, l_i, acc, scale_log2, DOT_PRECISION: tl.constexpr):
    """One online-softmax step (base 2) of the q group over one tile."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [GROUP_PAD, BLOCK_N]
    s = tl.where(tok_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _paged_decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    lens_ptr,
    o_ptr,
    lse_ptr,
    scale_log2,
    num_splits,
    max_context,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_btb,
    stride_bts,
    stride_btn,
    stride_lens,
    stride_lens_s,
    stride_ob,
    stride_oh,
    stride_os,
    stride_od,
    stride_lb,
    stride_lh,
    prior_part_ptr,
    prior_lse_ptr,
    stride_ppb,
    stride_pph,
    stride_pps,
    stride_plb,
    stride_plh,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DIRECT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PREFETCH: tl.constexpr,
    HEADS_PER_ROW: tl.constexpr,
    CACHE_HEADS: tl.constexpr,
    PRIOR: tl.constexpr,
):
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2)
    row = kv_head // HEADS_PER_ROW
    cache_head = kv_head % CACHE_HEADS

    ctx = tl.minimum(tl.load(lens_ptr + b * stride_lens + row * stride_lens_s), max_context)  # within the table
    n_tiles = tl.cdiv(ctx, BLOCK_N)
    tiles_per_split = tl.cdiv(n_tiles, num_splits)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, n_tiles)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=g_mask[:, None],
        other=0.0,
    )  # [GROUP_PAD, HEAD_DIM]

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb + row * stride_bts
    k_head = k_ptr + cache_head * stride_kh
    v_head = v_ptr + cache_head * stride_vh
    limit = tl.minimum(ctx, tile_hi * BLOCK_N)  # tokens of this split end here
    tok = tile_lo * BLOCK_N + offs_n
    if PREFETCH:  # registers hold tile i+1 while tile i is computed; used with num_stages=1
        page = _page_ids(bt_row, tok, limit, stride_btn, PAGE_SIZE)
        k, v = _load_kv(k_head, v_head, page, tok, limit, offs_d,
                        stride_kb, stride_kt, stride_kd, stride_vb, stride_vt, stride_vd, PAGE_SIZE)  # fmt: skip
        for _ in range(tile_lo, tile_hi):
            tok_next = tok + BLOCK_N
            page_next = _page_ids(bt_row, tok_next, limit, stride_btn, PAGE_SIZE)
            k_next, v_next = _load_kv(k_head, v_head, page_next, tok_next, limit, offs_d,
                                      stride_kb, stride_kt, stride_kd, stride_vb, stride_vt, stride_vd,
                                      PAGE_SIZE)  # fmt: skip
            m_i, l_i, acc = _attend_tile(q, k, v, tok < limit, m_i, l_i, acc, scale_log2, DOT_PRECISION)
            k, v, tok = k_next, v_next, tok_next
    else:
        # Page ids are loaded one tile ahead into registers, so the K/V addresses of a tile do not
        # depend on a load issued in the same iteration; only then does Triton's pipeliner keep
        # num_stages - 1 K/V tiles in flight (cp.async ring in shared memory) instead of one.
        page_next = _page_ids(bt_row, tok, limit, stride_btn, PAGE_SIZE)
        for _ in range(tile_lo, tile_hi):
            page = page_next
            page_next = _page_ids(bt_row, tok + BLOCK_N, limit, stride_btn, PAGE_SIZE)
            k, v = _load_kv(k_head, v_head, page, tok, limit, offs_d,
                            stride_kb, stride_kt, stride_kd, stride_vb, stride_vt, stride_vd, PAGE_SIZE)  # fmt: skip
            m_i, l_i, acc = _attend_tile(q, k, v, tok < limit, m_i, l_i, acc, scale_log2, DOT_PRECISION)
            tok += BLOCK_N

    has_work = l_i > 0.0  # false only for splits past the end of a short context
    l_safe = tl.where(has_work, l_i, 1.0)
    o = acc / l_safe[:, None]
    if PRIOR > 0:  # merge the PRIOR partial outputs of earlier tables (DIRECT, one split) into this one's
        own = tl.where(has_work, m_i + tl.log2(l_safe), float("-inf"))
        pl_row = prior_lse_ptr + b * stride_plb + heads * stride_plh
        top = own
        for p in tl.static_range(PRIOR):
            top = tl.maximum(top, tl.load(pl_row + p, mask=g_mask, other=float("-inf")))
        top = tl.where(top == float("-inf"), 0.0, top)  # padded heads only: some part of a real head has a token
        weight = tl.exp2(own - top)
        total = weight
        o = o * weight[:, None]
        pp_row = prior_part_ptr + b * stride_ppb + heads[:, None] * stride_pph + offs_d[None, :]
        for p in tl.static_range(PRIOR):
            w_p = tl.exp2(tl.load(pl_row + p, mask=g_mask, other=float("-inf")) - top)
            o += tl.load(pp_row + p * stride_pps, mask=g_mask[:, None], other=0.0) * w_p[:, None]
            total += w_p
        o = o / tl.where(total > 0.0, total, 1.0)[:, None]
    o_ptrs = o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
    if DIRECT:
        tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        tl.store(o_ptrs + split * stride_os, o, mask=g_mask[:, None])
        lse = tl.where(has_work, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=g_mask)


@triton.jit
def _reduce_splits_kernel(
    part_ptr,
    lse_ptr,
    out_ptr,
    num_splits,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    stride_od,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    head = tl.program_id(0)
    b = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    s_mask = offs_s < num_splits
    lse = tl.load(lse_ptr + b * stride_lb + head * stride_lh + offs_s, mask=s_mask, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, axis=0))  # some split has work (split 0 of one table), so the max is finite
    part = tl.load(
        part_ptr + b * stride_pb + head * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
        mask=s_mask[:, None],
        other=0.0,
    )  # [SPLITS_PAD, HEAD_DIM]
    o = tl.sum(part * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    tl.store(out_ptr + b * stride_ob + head * stride_oh + offs_d * stride_od, o.to(out_ptr.dtype.element_ty))
