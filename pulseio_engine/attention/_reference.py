"""Plain-torch paged decode attention: the numerical reference and the CPU path.

Per sequence (one Python iteration each, and one per table row with row tables) it gathers the pages with
one index op, then does grouped attention in fp32 with an fp32 softmax. It reads `context_lens` on the
host, so it syncs on GPU and is not CUDA-graph safe: use it for CPU inference and for tests.
"""

from __future__ import annotations

import math

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
    out, _ = _attend(q, k_cache, v_cache, block_tables, context_lens, scale, num_kv_heads, with_lse=False)
    return out.to(q.dtype)


def attention_with_lse_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, *, num_kv_heads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`paged_decode_attention_reference` before the cast -> (out [B, Hq, D] fp32, lse [B, Hq] fp32: the
    log-sum-exp of the scaled scores in base 2). A row of context 0 gives out 0 and lse -inf."""
    out, lse = _attend(q, k_cache, v_cache, block_tables, context_lens, scale, num_kv_heads, with_lse=True)
    assert lse is not None
    return out, lse


def _attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
            context_lens: torch.Tensor, scale: float, num_kv_heads: int | None, *, with_lse: bool
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Both references' loop; the log-sum-exps only `with_lse` (a second pass over every row's scores)."""
    batch, hq, head_dim = q.shape
    block_size, cache_heads = k_cache.shape[1], k_cache.shape[2]
    hkv = num_kv_heads or cache_heads
    tables = block_tables if block_tables.dim() == 3 else block_tables[:, None]        # [B, S, M]
    lens = (context_lens if context_lens.dim() == 2 else context_lens[:, None]).tolist()  # [B][S]
    rows = tables.shape[1]
    per_row, group = hkv // rows, hq // hkv
    out = torch.zeros((batch, hq, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.full((batch, hq), float("-inf"), dtype=torch.float32, device=q.device) if with_lse else None
    for b in range(batch):
        for s, n in enumerate(lens[b]):
            if n == 0:
                continue
            heads = slice(s * per_row, (s + 1) * per_row)                              # KV heads of the row
            in_cache = heads if cache_heads == hkv else slice(0, per_row)
            n_blocks = -(-n // block_size)
            pages = tables[b, s, :n_blocks].long()
            k = k_cache[pages][:, :, in_cache].reshape(n_blocks * block_size, per_row, head_dim)[:n].float()
            v = v_cache[pages][:, :, in_cache].reshape(n_blocks * block_size, per_row, head_dim)[:n].float()
            q_heads = slice(s * per_row * group, (s + 1) * per_row * group)
            qb = q[b, q_heads].float().view(per_row, group, head_dim)
            scores = torch.einsum("hgd,nhd->hgn", qb, k) * scale                       # [per_row, G, n]
            probs = torch.softmax(scores, dim=-1)
            out[b, q_heads] = torch.einsum("hgn,nhd->hgd", probs, v).reshape(-1, head_dim)
            if lse is not None:
                lse[b, q_heads] = (torch.logsumexp(scores, dim=-1) / math.log(2)).reshape(-1)
    return out, lse
