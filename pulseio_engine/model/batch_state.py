"""The state of one batch between layer steps: what a scheduler holds to pause and resume it.

A batch is either a decode batch (one new token per sequence, paged decode attention) or a prefill
batch (a chunk of prompt tokens per sequence, causal attention over the chunk and the sequence's
earlier KV). `next_layer` says where the forward stands; the hidden states (the residual stream, and the last
layer's MLP output not yet added to it) are the only activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..kv.cache import KVCache


@dataclass
class DecodeAttention:
    block_tables: torch.Tensor   # [B, max_blocks] int32, device
    context_lens: torch.Tensor   # [B] int32, device; includes the token being decoded


@dataclass(frozen=True)
class PrefillSpan:
    row_start: int               # first row of this sequence's chunk in the batch
    length: int                  # tokens in the chunk
    pos_start: int               # position of the chunk's first token (= tokens already in cache)
    block_ids: torch.Tensor      # [n_blocks] int64, device; covers pos_start + length tokens


@dataclass
class PrefillAttention:
    spans: tuple[PrefillSpan, ...]


class LayerAttention(Protocol):
    """Attention that replaces the paged cache's for some layers (offload requests: the sparse decode
    path, and prefill in an offload-only engine): it stores the new K/V itself and returns the output."""

    def covers(self, layer: int) -> bool: ...

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, Hq, D], k, v: [T, Hkv, D] of the batch's tokens -> [T, Hq, D]."""
        ...


@dataclass
class BatchState:
    hidden: torch.Tensor         # [T, H], model dtype
    positions: torch.Tensor      # [T] int64
    kv_rows: tuple[torch.Tensor, torch.Tensor]   # ([T], [T]) int64: where each token's K and V go
    attention: DecodeAttention | PrefillAttention
    kv: KVCache
    logit_rows: torch.Tensor | None = None   # [S] int64: rows whose logits are wanted; None = all
    next_layer: int = 0
    sparse: LayerAttention | None = None     # the layers it covers skip the paged cache
    delta: torch.Tensor | None = None        # [T, H]: the last layer's MLP output, added by the next layer's norm

    @property
    def num_tokens(self) -> int:
        return self.hidden.shape[0]
