"""The paged KV cache on the device: one tensor per layer, laid out block-major.

Layout (fixed with the team): `kv[layer]: [num_blocks, 2, block_size, num_kv_heads, head_dim]`;
K is `kv[layer][:, 0]`, V is `kv[layer][:, 1]`. One (layer, block) pair is one contiguous unit of
2 * block_size * Hkv * D elements (64 KiB in bf16 for block 16, 8 KV heads, head_dim 128): the unit
later issues move between host and GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .digests import BlockDigests
from .token_store import store_tokens


@dataclass(frozen=True)
class KVCacheStatistics:
    num_layers: int
    num_blocks: int
    block_size: int
    bytes_total: int
    bytes_per_block: int   # one (layer, block) unit


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of K and V one token occupies across all layers."""
    return num_layers * 2 * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class KVCache:
    def __init__(self, *, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str,
                 paged_layers: int | None = None) -> None:
        """`paged_layers`: only layers [0, paged_layers) have blocks (default: all). The others hold
        zero blocks, so any write to them fails loudly: an offload-only engine keeps its offloaded
        layers in the host pool and its hot slots, never here."""
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.paged_layers = num_layers if paged_layers is None else paged_layers
        # kv[l]: [num_blocks, 2, block_size, Hkv, D] (0 blocks for l >= paged_layers)
        self.kv = [torch.zeros((num_blocks if layer < self.paged_layers else 0, 2, block_size, num_kv_heads,
                                head_dim), dtype=dtype, device=device)
                   for layer in range(num_layers)]

    @property
    def dtype(self) -> torch.dtype:
        return self.kv[0].dtype

    @property
    def device(self) -> torch.device:
        return self.kv[0].device

    def k(self, layer: int) -> torch.Tensor:
        return self.kv[layer][:, 0]   # [num_blocks, block_size, Hkv, D], strided view

    def v(self, layer: int) -> torch.Tensor:
        return self.kv[layer][:, 1]   # [num_blocks, block_size, Hkv, D], strided view

    def rows(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where tokens go, for `write`. slots: [T] int64 (block * block_size + offset) -> (blocks [T, 1],
        offsets [T]) int64. Computed once per batch step, used by every layer."""
        return (slots // self.block_size)[:, None], slots % self.block_size

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, rows: tuple[torch.Tensor, torch.Tensor],
              digests: BlockDigests | None = None) -> None:
        """Store new tokens' K/V at `rows` (from `rows(slots)`), and fold K into `digests` in the same pass.
        k, v: [T, Hkv, D]. No host sync: safe inside CUDA-graph capture."""
        blocks, offsets = rows
        store_tokens(self.kv[layer], blocks, offsets, k, v, digests=digests, layer=layer, digest_blocks=blocks[:, 0])

    def gather(self, layer: int, block_ids: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's first `num_tokens` K and V. block_ids: [n_blocks] int64 -> ([n, Hkv, D], [n, Hkv, D])."""
        pages = self.kv[layer][block_ids]            # [n_blocks, 2, block_size, Hkv, D]
        k = pages[:, 0].reshape(-1, self.num_kv_heads, self.head_dim)[:num_tokens]
        v = pages[:, 1].reshape(-1, self.num_kv_heads, self.head_dim)[:num_tokens]
        return k, v

    def statistics(self) -> KVCacheStatistics:
        per_block = 2 * self.block_size * self.num_kv_heads * self.head_dim * self.kv[0].element_size()
        return KVCacheStatistics(self.num_layers, self.num_blocks, self.block_size,
                                 per_block * self.num_blocks * self.paged_layers, per_block)
