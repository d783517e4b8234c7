"""Triton kernel of `token_store.store_tokens`: new tokens' K and V into their units, digests folded in.

One program per (token, KV head): it loads the head's K and V row once, stores them at their unit's slot
(the paged cache, the host pool through its device-mapped view, or a hot pool: any
[units, 2, block_size, hg, D] tensor), and, when the head is digested, folds K into its block's max / min
(a token at offset 0 starts the block afresh). Each digest row belongs to one token of the batch, so no
two programs write the same row.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _store_tokens_kernel(
    k_ptr, v_ptr, pool_ptr, units_ptr, offsets_ptr, dmax_ptr, dmin_ptr, dblock_ptr, digest_head,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_pu, stride_pkv, stride_po, stride_ph,
    stride_ut, stride_us, stride_off, stride_db,
    stride_dn, stride_dw,
    HEADS_PER_UNIT: tl.constexpr, HEAD_DIM: tl.constexpr, DIGEST: tl.constexpr, ALL_HEADS_DIGESTED: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + offs_d)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + offs_d)
    unit = tl.load(units_ptr + t * stride_ut + (h // HEADS_PER_UNIT) * stride_us).to(tl.int64)
    offset = tl.load(offsets_ptr + t * stride_off).to(tl.int64)
    slot = pool_ptr + unit * stride_pu + offset * stride_po + (h % HEADS_PER_UNIT) * stride_ph + offs_d
    tl.store(slot, k.to(pool_ptr.dtype.element_ty))
    tl.store(slot + stride_pkv, v.to(pool_ptr.dtype.element_ty))
    if DIGEST:
        if ALL_HEADS_DIGESTED or h == digest_head:
            column = h if ALL_HEADS_DIGESTED else 0
            row = tl.load(dblock_ptr + t * stride_db).to(tl.int64) * stride_dn + column * stride_dw + offs_d
            key = k.to(dmax_ptr.dtype.element_ty)
            if offset == 0:
                tl.store(dmax_ptr + row, key)
                tl.store(dmin_ptr + row, key)
            else:
                tl.store(dmax_ptr + row, tl.maximum(tl.load(dmax_ptr + row), key))
                tl.store(dmin_ptr + row, tl.minimum(tl.load(dmin_ptr + row), key))


def launch_store_tokens(pool, units, offsets, k, v, digest) -> None:  # noqa: ANN001 - checked by the caller
    """digest: None or (dmax [N, W, D], dmin, blocks [T], head or -1 for every head)."""
    t, hkv, d = k.shape
    hg = pool.shape[3]
    if digest is None:
        dmax = dmin = dblock = k  # unread
        head, strides, all_heads = 0, (0, 0), True
    else:
        dmax, dmin, dblock, head = digest
        strides, all_heads = (dmax.stride(0), dmax.stride(1)), head < 0
    _store_tokens_kernel[(t, hkv)](
        k, v, pool, units, offsets, dmax, dmin, dblock, max(head, 0),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        pool.stride(0), pool.stride(1), pool.stride(2), pool.stride(3),
        units.stride(0), units.stride(1), offsets.stride(0), dblock.stride(0),
        *strides,
        HEADS_PER_UNIT=hg, HEAD_DIM=d, DIGEST=digest is not None, ALL_HEADS_DIGESTED=all_heads,
        num_warps=1,
    )  # fmt: skip
