"""Quest block digests: per (layer, block, KV head), the element-wise max and min of the block's
post-RoPE keys, kept up to date as tokens are appended.

A partially filled block's digest covers only its filled tokens: the token at offset 0 of a block
overwrites the digest (so a reused block forgets its last owner), later tokens fold in with
max/min. Both steps are index ops over the batch's tokens (no host sync, no data-dependent
shapes), so `update` may run inside a captured CUDA graph next to `KVCache.write`.

Digests are indexed by physical block id, like the KV cache; block 0 is the cache's padding block
and doubles here as the scratch row that absorbs writes meant for no block. With `heads` (SoloHead),
only one KV head per layer is digested, so the tables are [L, N, 1, D]: 1/Hkv of Quest's memory.
"""

from __future__ import annotations

import torch

from .block_table import PAD_BLOCK


class BlockDigests:
    """Key max/min per (layer, block, digested KV head), on the KV cache's device."""

    def __init__(self, *, num_layers: int, num_blocks: int, num_kv_heads: int, head_dim: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str, heads: tuple[int, ...] | None = None) -> None:
        """`heads`: the one KV head digested per layer (SoloHead), or None for every KV head (Quest)."""
        if heads is not None and len(heads) != num_layers:
            raise ValueError(f"heads names {len(heads)} layers, the model has {num_layers}; "
                             "pass one KV head per layer (a calibration file for this model)")
        if heads is not None and not all(0 <= h < num_kv_heads for h in heads):
            raise ValueError(f"heads {heads} must be KV heads in [0, {num_kv_heads})")
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.heads = heads
        width = num_kv_heads if heads is None else 1
        # max[l], min[l]: [num_blocks, width, D]
        self.max = torch.zeros((num_layers, num_blocks, width, head_dim), dtype=dtype, device=device)
        self.min = torch.zeros((num_layers, num_blocks, width, head_dim), dtype=dtype, device=device)

    @property
    def width(self) -> int:
        """KV heads digested per layer: Hkv (Quest) or 1 (SoloHead)."""
        return self.max.shape[2]

    def update(self, layer: int, k: torch.Tensor, slots: torch.Tensor) -> None:
        """Fold new tokens' keys into their blocks' digests. k: [T, Hkv, D] post-RoPE keys;
        slots: [T] int64 (block * block_size + offset), each slot at most once."""
        if self.heads is not None:
            k = k[:, self.heads[layer]:self.heads[layer] + 1]              # [T, 1, D]
        k = k.to(self.max.dtype)
        block, offset = slots // self.block_size, slots % self.block_size
        first = torch.where(offset == 0, block, torch.full_like(block, PAD_BLOCK))   # [T]
        index = block[:, None, None].expand_as(k)                                     # [T, width, D]
        for table, reduce in ((self.max[layer], "amax"), (self.min[layer], "amin")):
            table.index_copy_(0, first, k)                                   # a block's first token resets it
            table.scatter_reduce_(0, index, k, reduce, include_self=True)

    def gather(self, layer: int, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Digests of each request's blocks. block_tables: [B, NB] physical ids (padding: any id)
        -> (max, min), each [B, NB, width, D]."""
        return self.max[layer][block_tables], self.min[layer][block_tables]
