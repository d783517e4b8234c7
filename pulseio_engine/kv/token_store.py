"""Store decoded (or prefilled) tokens' K and V where they live, and keep the block digests current.

Every KV store of the engine is the same operation on a tensor of transfer units
`pool: [n_units, 2 (K, V), block_size, hg, D]`: the paged cache of one layer (unit = physical block,
hg = Hkv), the host pool through its device-mapped view, or the hot slots (hg = Hkv / S heads of one
selecting row per unit). Row t's KV head h goes to unit `units[t, h // hg]` at `offsets[t]`, head h % hg.
With `digests`, K is folded into the Quest digest of the token's physical block in the same pass
(`BlockDigests.update`'s rule: a token at offset 0 starts its block afresh).

On CUDA tensors this is one Triton kernel (`store_kernel.py`) per call: for an offloaded layer the new
token's KV and its digest are one launch, where index copies and scatter-reductions were six. Elsewhere
it is the plain-torch path below, which is also the reference the kernel is tested against.
"""

from __future__ import annotations

import torch

from .digests import BlockDigests


def store_tokens(pool: torch.Tensor, units: torch.Tensor, offsets: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 *, digests: BlockDigests | None = None, layer: int = 0, digest_blocks: torch.Tensor | None = None
                 ) -> None:
    """pool: [n_units, 2, bs, hg, D]; units: [T, S] int64 (S = Hkv / hg); offsets: [T] int64;
    k, v: [T, Hkv, D]; digest_blocks: [T] int64 physical blocks of the tokens (with `digests`).
    Each (unit, offset) and each digested block at most once per call. No host sync (graph-safe)."""
    if digests is not None and digest_blocks is None:
        raise ValueError("store_tokens: digests need digest_blocks, the tokens' physical blocks")
    if k.shape[0] == 0:
        return
    if pool.is_cuda:
        from .store_kernel import launch_store_tokens  # Triton is imported only on the CUDA path

        digest = None
        if digests is not None:
            head = -1 if digests.heads is None else digests.heads[layer]
            digest = (digests.max[layer], digests.min[layer], digest_blocks, head)
        launch_store_tokens(pool, units, offsets, k, v, digest)
        return
    _store_units(pool, units, offsets, k, v)
    if digests is not None:
        assert digest_blocks is not None     # checked on entry
        digests.update(layer, k, digest_blocks * digests.block_size + offsets)


def _store_units(pool: torch.Tensor, units: torch.Tensor, offsets: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> None:
    _, _, bs, hg, d = pool.shape
    flat = pool.view(-1, hg, d)                                          # [n * 2 * bs, hg, D]
    rows = (units * (2 * bs) + offsets[:, None]).reshape(-1)             # [T * S] K rows
    flat.index_copy_(0, rows, k.reshape(-1, hg, d).to(pool.dtype))
    flat.index_copy_(0, rows + bs, v.reshape(-1, hg, d).to(pool.dtype))
