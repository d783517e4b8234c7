"""Plain-torch paged decode attention: the numerical reference and the CPU path.

Per sequence (one Python iteration each) it gathers the sequence's pages with one index op,
then does grouped attention in fp32 with an fp32 softmax. It reads `context_lens` on the host,
so it syncs on GPU and is not CUDA-graph safe: use it for CPU inference and for tests.
"""

from __future__ import annotations

import torch


def paged_decode_attention_reference(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B] int32, >= 1, includes the current token
    scale: float,
) -> torch.Tensor:  # [B, Hq, D], q.dtype
    batch, hq, head_dim = q.shape
    block_size, hkv = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    out = torch.empty((batch, hq, head_dim), dtype=torch.float32, device=q.device)
    lens = context_lens.tolist()
    for b, n in enumerate(lens):
        n_blocks = -(-n // block_size)
        pages = block_tables[b, :n_blocks].long()
        k = k_cache[pages].reshape(n_blocks * block_size, hkv, head_dim)[:n].float()  # [n, Hkv, D]
        v = v_cache[pages].reshape(n_blocks * block_size, hkv, head_dim)[:n].float()  # [n, Hkv, D]
        qb = q[b].float().view(hkv, group, head_dim)  # [Hkv, G, D]
        scores = torch.einsum("hgd,nhd->hgn", qb, k) * scale  # [Hkv, G, n]
        probs = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("hgn,nhd->hgd", probs, v).reshape(hq, head_dim)
    return out.to(q.dtype)
