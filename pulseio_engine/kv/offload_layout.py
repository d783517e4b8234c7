"""How an offload request's KV is cut into transfer units, and what it costs on the device.

CPU-only bookkeeping (no torch). One transfer unit is one block of one layer for the KV heads of one
selecting row, K and V together, contiguous: `[2, block_size, heads_per_unit, head_dim]`.

- Shared selection (SoloHead and its reversed control): one row per (request, layer) picks for every
  KV head, so a unit holds all Hkv heads: 2 * block_size * Hkv * D * dtype bytes (64 KiB for
  Qwen3-14B in bf16, 6 KiB for SmolLM2-135M in fp32). The copy engine moves units this size well.
- Head-wise selection (Quest): each KV head picks its own blocks, so a unit is one (layer, KV head,
  block): Hkv times smaller (8 KiB for Qwen3-14B in bf16).

Layers [0, dense_layers) are not offloaded: their whole KV stays on the device, as in Quest.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig, OffloadConfig, SparseMode
from .block_table import blocks_for


@dataclass(frozen=True)
class UnitLayout:
    """One offloaded layer's KV in transfer units: `groups` selecting rows of `heads_per_unit` KV heads."""

    groups: int            # S: 1 (shared selection) or Hkv (head-wise)
    heads_per_unit: int    # Hkv / S
    block_size: int
    head_dim: int
    elem_bytes: int

    @classmethod
    def for_mode(cls, model: ModelConfig, offload: OffloadConfig, elem_bytes: int) -> UnitLayout:
        hkv = model.num_kv_heads
        groups = hkv if offload.sparse.mode is SparseMode.QUEST else 1
        return cls(groups, hkv // groups, offload.sparse.block_size, model.head_dim, elem_bytes)

    @property
    def unit_shape(self) -> tuple[int, int, int, int]:
        """[2 (K, V), block_size, heads_per_unit, head_dim]."""
        return (2, self.block_size, self.heads_per_unit, self.head_dim)

    @property
    def unit_bytes(self) -> int:
        return 2 * self.block_size * self.heads_per_unit * self.head_dim * self.elem_bytes


def host_units_for(model: ModelConfig, offload: OffloadConfig, num_tokens: int) -> int:
    """Host units one offload request of `num_tokens` tokens holds: one per (offloaded layer, selecting
    row, block), Hkv times more, and Hkv times smaller, under head-wise selection."""
    groups = UnitLayout.for_mode(model, offload, elem_bytes=1).groups
    return (model.num_layers - offload.dense_layers) * groups * blocks_for(num_tokens, offload.sparse.block_size)


@dataclass(frozen=True)
class OffloadFootprint:
    """Device and host bytes of one request of `context_tokens` tokens, offloaded vs vanilla."""

    context_tokens: int
    vanilla_device_bytes: int     # every layer's KV on the device
    offload_device_bytes: int     # dense_layer_bytes + hot_bytes + digest_bytes
    dense_layer_bytes: int        # layers [0, dense_layers), whole
    hot_bytes: int                # hot_blocks hot slots (fewer: the context's blocks) per selecting row of each
                                  # offloaded layer
    digest_bytes: int             # key max and min per block of each offloaded layer
    host_bytes: int               # the full KV of the offloaded layers, in the host pool
    unit_bytes: int               # one recalled transfer unit

    @property
    def saving(self) -> float:
        """vanilla / offload device bytes."""
        return self.vanilla_device_bytes / self.offload_device_bytes


def offload_footprint(model: ModelConfig, offload: OffloadConfig, *, elem_bytes: int,
                      context_tokens: int) -> OffloadFootprint:
    """What one offload request needs on the device and the host, next to what vanilla needs.
    Digests are counted per offloaded layer at the digested width (Hkv for Quest, 1 for SoloHead)."""
    layout = UnitLayout.for_mode(model, offload, elem_bytes)
    sparse, n_blocks = offload.sparse, blocks_for(context_tokens, offload.sparse.block_size)
    layer_bytes = n_blocks * layout.groups * layout.unit_bytes      # one layer's KV, whole blocks
    offloaded = model.num_layers - offload.dense_layers
    hot = offloaded * layout.groups * min(offload.hot_blocks, n_blocks) * layout.unit_bytes
    width = layout.groups if sparse.mode is SparseMode.QUEST else 1
    digests = offloaded * n_blocks * width * model.head_dim * 2 * elem_bytes
    dense = offload.dense_layers * layer_bytes
    return OffloadFootprint(context_tokens, model.num_layers * layer_bytes, dense + hot + digests, dense, hot,
                            digests, offloaded * layer_bytes, layout.unit_bytes)
