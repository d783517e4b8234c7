"""Test and benchmark helpers: random paged KV layouts built from dense per-sequence K/V.

`random_paged_case` writes dense K/V into shuffled physical pages of an engine-shaped
`kv: [num_blocks, 2, block_size, Hkv, D]` tensor, so `k_cache`/`v_cache` are the same strided views the
engine passes. Everything a correct kernel must not read is poisoned: unused pages and the slots past
each context hold NaN, unused block-table entries hold out-of-range ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

POISON_PAGE_ID = 1 << 30  # far out of range: reading it faults on GPU


@dataclass(frozen=True)
class PagedCase:
    q: torch.Tensor  # [B, Hq, D]
    kv: torch.Tensor  # [num_blocks, 2, block_size, Hkv, D]
    block_tables: torch.Tensor  # [B, max_blocks] int32
    context_lens: torch.Tensor  # [B] int32
    dense_k: list[torch.Tensor]  # per sequence [n_b, Hkv, D]
    dense_v: list[torch.Tensor]  # per sequence [n_b, Hkv, D]
    scale: float

    @property
    def k_cache(self) -> torch.Tensor:  # [num_blocks, block_size, Hkv, D], strided view
        return self.kv[:, 0]

    @property
    def v_cache(self) -> torch.Tensor:
        return self.kv[:, 1]


def random_paged_case(
    *,
    context_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    max_blocks: int | None = None,
    spare_blocks: int = 3,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    q_scale: float = 1.0,
    poison: bool = True,
    seed: int = 0,
) -> PagedCase:
    """A random batch; `q_scale` > 1 sharpens the softmax. Dense K/V are kept for naive checks."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_seq = [-(-n // block_size) for n in context_lens]
    max_blocks = max_blocks or max(pages_per_seq)
    num_blocks = sum(pages_per_seq) + spare_blocks
    fill = float("nan") if poison else 0.0
    kv = torch.full((num_blocks, 2, block_size, num_kv_heads, head_dim), fill, dtype=dtype)
    tables = torch.full((len(context_lens), max_blocks), POISON_PAGE_ID if poison else 0, dtype=torch.int32)
    physical = torch.randperm(num_blocks, generator=gen)
    dense_k, dense_v, used = [], [], 0
    for b, (n, pages) in enumerate(zip(context_lens, pages_per_seq, strict=False)):
        ids = physical[used : used + pages]
        used += pages
        tables[b, :pages] = ids.int()
        if poison and b % 2:
            tables[b, pages:] = -7  # negative garbage on odd rows, huge ids on even rows
        k = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        for i in range(pages):
            lo, hi = i * block_size, min(n, (i + 1) * block_size)
            kv[ids[i], 0, : hi - lo] = k[lo:hi]
            kv[ids[i], 1, : hi - lo] = v[lo:hi]
        dense_k.append(k.to(device))
        dense_v.append(v.to(device))
    q = (torch.randn(len(context_lens), num_q_heads, head_dim, generator=gen) * q_scale).to(dtype)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return PagedCase(q.to(device), kv.to(device), tables.to(device), lens.to(device), dense_k, dense_v, head_dim**-0.5)


def dense_attention(case: PagedCase) -> torch.Tensor:  # [B, Hq, D], float64, on case's device
    """Naive float64 attention over the dense per-sequence K/V (independent of the page layout)."""
    batch, hq, head_dim = case.q.shape
    outs = []
    for b in range(batch):
        k = case.dense_k[b].double()  # [n, Hkv, D]
        v = case.dense_v[b].double()
        group = hq // k.shape[1]
        k = k.repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", case.q[b].double(), k) * case.scale
        outs.append(torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v))
    return torch.stack(outs)


@dataclass(frozen=True)
class RowCase:
    """Row tables over a paged case: row s of sequence b reads a subset of its pages with KV heads
    [s * Hkv / S, (s + 1) * Hkv / S); `pooled` re-lays the pages as per-row units of Hkv / S heads."""

    q: torch.Tensor  # [B, Hq, D]
    k_cache: torch.Tensor  # [pages, block_size, C, D], C = Hkv (paged) or Hkv / S (pooled)
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, S, max_blocks] int32
    context_lens: torch.Tensor  # [B, S] int32
    num_kv_heads: int
    scale: float
    expect: torch.Tensor  # [B, Hq, D] float64: naive attention over each row's selected tokens


def random_row_case(base: PagedCase, *, rows: int, pooled: bool, seed: int = 0) -> RowCase:
    """Each (sequence, row) keeps a random subset of its pages, always its last (partly filled) one,
    ascending: the shape of a sparse selection."""
    gen = torch.Generator().manual_seed(seed)
    batch, hq, head_dim = base.q.shape
    num_pages, _, block_size, hkv, _ = base.kv.shape
    per_row, group = hkv // rows, hq // hkv
    lens = base.context_lens.tolist()
    max_blocks = base.block_tables.shape[1]
    tables = torch.zeros((batch, rows, max_blocks), dtype=torch.int32)
    row_lens = torch.zeros((batch, rows), dtype=torch.int32)
    units: list[torch.Tensor] = []  # pooled: [2, block_size, per_row, D] per (page, row) used
    expect = torch.zeros((batch, hq, head_dim), dtype=torch.float64)
    for b, n in enumerate(lens):
        pages = -(-n // block_size)
        for s in range(rows):
            keep = sorted(set(torch.randperm(pages, generator=gen)[: max(1, pages // 2)].tolist()) | {pages - 1})
            heads = slice(s * per_row, (s + 1) * per_row)
            ids = base.block_tables[b, keep].long()
            if pooled:
                tables[b, s, : len(keep)] = torch.arange(len(units), len(units) + len(keep), dtype=torch.int32)
                units.extend(base.kv[ids.tolist()][:, :, :, heads].unbind(0))
            else:
                tables[b, s, : len(keep)] = ids.int()
            row_lens[b, s] = (len(keep) - 1) * block_size + (n - 1) % block_size + 1
            tokens = torch.cat([torch.arange(p * block_size, min(n, (p + 1) * block_size)) for p in keep])
            k = base.dense_k[b].cpu()[tokens][:, heads].double()          # [t, per_row, D]
            v = base.dense_v[b].cpu()[tokens][:, heads].double()
            qs = base.q[b, s * per_row * group:(s + 1) * per_row * group].cpu().double().view(per_row, group, -1)
            probs = torch.softmax(torch.einsum("hgd,thd->hgt", qs, k) * base.scale, dim=-1)
            expect[b, s * per_row * group:(s + 1) * per_row * group] = \
                torch.einsum("hgt,thd->hgd", probs, v).reshape(-1, head_dim)
    kv = torch.stack(units) if pooled else base.kv.cpu()
    dev = base.q.device
    return RowCase(base.q, kv[:, 0].to(dev), kv[:, 1].to(dev), tables.to(dev), row_lens.to(dev), hkv,
                   base.scale, expect.to(dev))


def split_rows(case: RowCase, block_size: int, *, seed: int = 0, first: float = 0.5
               ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Each row's pages dealt into two tables, each in the row's order (so the partly filled last page stays last
    in whichever table holds it), a page going to the first with probability `first` (1.0 or 0.0: one table
    empty): -> ((tables, context_lens) of the first, (tables, context_lens) of the second)."""
    gen = torch.Generator().manual_seed(seed)
    batch, rows, width = case.block_tables.shape
    tables = [torch.zeros((batch, rows, width), dtype=torch.int32) for _ in range(2)]
    lens = [torch.zeros((batch, rows), dtype=torch.int32) for _ in range(2)]
    all_tables, all_lens = case.block_tables.cpu(), case.context_lens.cpu()
    for b in range(batch):
        for s in range(rows):
            n = int(all_lens[b, s])
            pages = -(-n // block_size)
            to_first = torch.rand(pages, generator=gen) < first
            for part in range(2):
                keep = [p for p in range(pages) if bool(to_first[p]) == (part == 0)]
                tables[part][b, s, :len(keep)] = all_tables[b, s, keep]
                full = len(keep) * block_size
                lens[part][b, s] = full - (block_size - ((n - 1) % block_size + 1) if pages - 1 in keep else 0)
    dev = case.q.device
    return ((tables[0].to(dev), lens[0].to(dev)), (tables[1].to(dev), lens[1].to(dev)))
