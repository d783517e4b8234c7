"""The "pulseio_sparse" attention implementation: transformers' SDPA over the blocks a SparseOffloadCache
selected and recalled, registered in transformers' AttentionInterface (and its mask interface, which makes
the masks SDPA gets). Where the cache handed the layer a whole KV (a prompt, a dense layer, another cache)
it is transformers' SDPA unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .sparse_cache import SPARSE_ATTENTION


def sparse_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """query: [B, Hq, T, D]; key, value: [B, Hkv, S, D], or a SparseOffloadCache's marker -> transformers' SDPA
    output ([B, T, Hq, D], None)."""
    owner = getattr(key, "_pulseio_sparse", None)
    if owner is not None:
        cache, layer = owner[0](), owner[1]
        if cache is None:
            raise RuntimeError("the SparseOffloadCache this layer's KV belongs to was garbage-collected")
        key, value, attention_mask = cache.attend_selected(layer, query, attention_mask)
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def register() -> str:
    """Register the implementation (idempotent); returns its name, for attn_implementation=."""
    AttentionInterface.register(SPARSE_ATTENTION, sparse_attention_forward)
    AttentionMaskInterface.register(SPARSE_ATTENTION, sdpa_mask)
    return SPARSE_ATTENTION
