"""Plain-torch paged decode attention: the numerical reference and the CPU path.

Per sequence (one Python iteration each, and one per table row with row tables) it gathers the pages with
one index op, then does grouped attention in fp32 with an fp32 softmax. It reads `context_lens` on the
host, so it syncs on GPU and is not CUDA-graph safe: use it for CPU inference and for tests.
"""

from __future__ import annotations

import torch


def paged_decode_attention_reference(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, C, D]: C = Hkv, or Hkv / S with row tables
    v_cache: torch.Tensor,  # [num_blocks, block_size, C, D]
    block_tables: torch.Tensor,  # [B, max_blocks] or row tables [B, S, max_blocks], int32
    context_lens: torch.Tensor,  # [B] (or [B, S]) int32, >= 1, includes the current token
    scale: float,
    *,
    num_kv_heads: int | None = None,  # Hkv; default C
) -> torch.Tensor:  # [B, Hq, D], q.dtype
    batch, hq, head_dim = q.shape
    block_size, cache_heads = k_cache.shape[1], k_cache.shape[2]
    hkv = num_kv_heads or cache_heads
    tables = block_tables if block_tables.dim() == 3 else block_tables[:, None]        # [B, S, M]
    lens = (context_lens if context_lens.dim() == 2 else context_lens[:, None]).tolist()  # [B][S]
    rows = tables.shape[1]
    per_row, group = hkv // rows, hq // hkv
    out = torch.empty((batch, hq, head_dim), dtype=torch.float32, device=q.device)
    for b in range(batch):
        for s, n in enumerate(lens[b]):
            heads = slice(s * per_row, (s + 1) * per_row)                              # KV heads of the row
            in_cache = heads if cache_heads == hkv else slice(0, per_row)
            n_blocks = -(-n // block_size)
            pages = tables[b, s, :n_blocks].long()
            k = k_cache[pages][:, :, in_cache].reshape(n_blocks * block_size, per_row, head_dim)[:n].float()
            v = v_cache[pages][:, :, in_cache].reshape(n_blocks * block_size, per_row, head_dim)[:n].float()
            qb = q[b, s * per_row * group:(s + 1) * per_row * group].float().view(per_row, group, head_dim)
            probs = torch.softmax(torch.einsum("hgd,nhd->hgn", qb, k) * scale, dim=-1)   # [per_row, G, n]
            out[b, s * per_row * group:(s + 1) * per_row * group] = \
                torch.einsum("hgn,nhd->hgd", probs, v).reshape(-1, head_dim)
    return out.to(q.dtype)
