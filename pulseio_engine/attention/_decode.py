"""The dispatcher: Triton split-K kernel for CUDA tensors, the plain-torch reference elsewhere."""

from __future__ import annotations

import torch

from ._checks import check_paged_decode_args
from ._reference import paged_decode_attention_reference


def paged_decode_attention(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], any strides (e.g. kv[:, 0])
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], any strides (e.g. kv[:, 1])
    block_tables: torch.Tensor,  # [B, max_blocks] (or row tables [B, S, max_blocks]) int32; entries past
                                 # a sequence's pages are never read
    context_lens: torch.Tensor,  # [B] (or [B, S]) int32, >= 1, tokens in cache including the current one
    scale: float,
    *,
    out: torch.Tensor | None = None,  # [B, Hq, D], q.dtype; written in place and returned
    num_kv_heads: int | None = None,  # Hkv, with row tables over a cache of Hkv / S heads; default k_cache's
) -> torch.Tensor:  # [B, Hq, D], q.dtype
    """Decode attention of one new token per sequence over its paged KV cache.

    Row tables (sparse attention): row s of a sequence's [S, max_blocks] table lists the pages its KV heads
    [s * Hkv / S, (s + 1) * Hkv / S) read, with their own context length; the cache holds either every KV head
    (the paged cache) or just the row's Hkv / S heads in each page (a pool of per-row units, such as the hot
    slots of offloaded layers). One launch serves every row.

    On CUDA this is CUDA-graph safe: no host syncs, and the grid depends only on shapes
    (`max_blocks`, not `context_lens` values). Callers must keep context_lens <= max_blocks * block_size.
    """
    check_paged_decode_args(q, k_cache, v_cache, block_tables, context_lens, scale, out, num_kv_heads)
    if q.is_cuda:
        from ._launch import paged_decode_attention_triton  # Triton is imported only on the CUDA path

        return paged_decode_attention_triton(q, k_cache, v_cache, block_tables, context_lens, scale, out=out,
                                             num_kv_heads=num_kv_heads)
    result = paged_decode_attention_reference(q, k_cache, v_cache, block_tables, context_lens, scale,
                                              num_kv_heads=num_kv_heads)
    if out is None:
        return result
    out.copy_(result)
    return out
