"""A plain-torch reference of SparseOffloadCache's decode, over the full KV that transformers' DynamicCache
holds: each step and offloaded layer, digests are recomputed from the dense keys, the same selection functions
pick the blocks, and attention is a softmax written out per KV head over the chosen tokens. No host pool, no
hot set, no recall, no incremental digest: what the cache must reproduce through all of those."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from pulseio.integrations.transformers import SparseSelection, block_digests, block_scores, select_blocks


def register_reference(selection: SparseSelection, name: str = "pulseio_sparse_reference") -> str:
    """Register the reference for `selection` as attention implementation `name`; returns the name."""

    def forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any,
                dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        if query.shape[2] != 1 or module.layer_idx < selection.dense_layers:
            return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs)
        assert mask is None, "the reference attends one unpadded row"
        return _sparse(selection, module.layer_idx, query, key, value, scaling), None

    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _sparse(selection: SparseSelection, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            scaling: float | None) -> torch.Tensor:
    """query: [B, Hq, 1, D]; key, value: [B, Hkv, n, D] -> [B, 1, Hq, D]."""
    b, hq, _, d = query.shape
    hkv, n, bs = key.shape[1], key.shape[2], selection.block_size
    head = None if selection.heads is None else selection.heads[layer]
    rows = key if head is None else key[:, head:head + 1]
    dmax, dmin = block_digests(rows, bs)                                            # [B, S, nb, D]
    scores = block_scores(query[:, :, 0], hkv, head, dmax.contiguous(), dmin.contiguous())
    chosen = select_blocks(scores, selection.budget_blocks, sink=selection.sink_blocks,
                           local=selection.local_blocks)                           # [B, S, K]
    scale = scaling if scaling is not None else d ** -0.5
    out = torch.empty(b, 1, hq, d, dtype=query.dtype)
    group = hq // hkv
    for i in range(b):
        for h in range(hkv):
            blocks = [j for j in chosen[i, 0 if head is not None else h].tolist() if j >= 0]
            pos = [p for j in blocks for p in range(j * bs, min((j + 1) * bs, n))]
            k, v = key[i, h, pos], value[i, h, pos]                                # [m, D]
            for g in range(group):
                q = query[i, h * group + g, 0]
                weights = torch.softmax((k @ q) * scale, dim=0)
                out[i, 0, h * group + g] = weights @ v
    return out
