"""SparseLayout: where a sparse-offload cache keeps what (this module imports no transformers).

The first `dense_layers` layers stay whole on the device (Quest's layers 0-1). Every other layer o keeps its
KV in host units of one block: [2, hpu, block_size, D] (K then V) for the hpu = Hkv / S heads of one selecting
row, S = Hkv rows per batch row under Quest (each KV head selects, 8 KiB units for D = 128 in bf16) or S = 1
under SoloHead (one selection for all heads: whole-block units, 64 KiB for 8 KV heads). Row r = b * S + s of
offloaded layer o holds host units unit0 = (o * R + r) * NB + block (R = B * S rows, NB blocks of the longest
context) and device slots (o * R + r) * K + entry (K = budget blocks): the hot set.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cache_base import KVGeometry


@dataclass(frozen=True)
class SparseSelection:
    """How a sparse-offload cache selects: `budget_tokens` per row and layer in blocks of `block_size`, the
    first `sink_blocks` and last `local_blocks` always; `heads`: None for Quest (every KV head selects), or
    one KV head per layer (SoloHead: it selects for all heads; entries of dense layers are ignored)."""

    budget_tokens: int = 2048
    block_size: int = 16
    sink_blocks: int = 1
    local_blocks: int = 2
    dense_layers: int = 2
    heads: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("budget_tokens", "block_size", "local_blocks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("sink_blocks", "dense_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.budget_tokens % self.block_size:
            raise ValueError(f"budget_tokens={self.budget_tokens} must be a multiple of block_size={self.block_size}")
        if self.budget_blocks < self.sink_blocks + self.local_blocks:
            raise ValueError(f"budget_tokens={self.budget_tokens} ({self.budget_blocks} blocks) must cover "
                             f"sink_blocks + local_blocks = {self.sink_blocks + self.local_blocks}")

    @property
    def budget_blocks(self) -> int:
        return self.budget_tokens // self.block_size

    def check(self, g: KVGeometry) -> None:
        """Raise ValueError unless this selection fits the model's geometry."""
        if not 0 <= self.dense_layers < g.num_layers:
            raise ValueError(f"dense_layers={self.dense_layers} must leave a layer to offload (the model has "
                             f"{g.num_layers})")
        if self.heads is None:
            return
        if len(self.heads) != g.num_layers:
            raise ValueError(f"heads names {len(self.heads)} layers' SoloHead heads; the model has {g.num_layers} "
                             "(one KV head per layer, e.g. the `best` list of `pulseio-engine calibrate`)")
        bad = [h for h in self.heads if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < g.num_kv_heads]
        if bad:
            raise ValueError(f"heads holds {bad}, not KV heads in [0, {g.num_kv_heads})")


@dataclass(frozen=True)
class SparseLayout:
    """Pool geometry of a sparse-offload cache (see the module doc)."""

    offloaded: int  # layers kept in the host pool
    rows: int  # R = B * S selecting rows per layer
    selecting: int  # S
    heads_per_unit: int  # hpu
    max_blocks: int  # NB
    budget: int  # K
    block_size: int
    head_dim: int
    elem_bytes: int

    @classmethod
    def of(cls, g: KVGeometry, selection: SparseSelection) -> SparseLayout:
        selecting = g.num_kv_heads if selection.heads is None else 1
        return cls(offloaded=g.num_layers - selection.dense_layers, rows=g.batch_size * selecting,
                   selecting=selecting, heads_per_unit=g.num_kv_heads // selecting,
                   max_blocks=-(-g.max_cache_len // selection.block_size), budget=selection.budget_blocks,
                   block_size=selection.block_size, head_dim=g.head_dim, elem_bytes=g.elem_bytes)

    @property
    def unit_shape(self) -> tuple[int, int, int, int]:
        return (2, self.heads_per_unit, self.block_size, self.head_dim)

    @property
    def unit_bytes(self) -> int:
        return 2 * self.heads_per_unit * self.block_size * self.head_dim * self.elem_bytes

    @property
    def host_units(self) -> int:
        return self.offloaded * self.rows * self.max_blocks

    @property
    def device_slots(self) -> int:
        return self.offloaded * self.rows * self.budget

    @property
    def recall_width(self) -> int:
        """Blocks one layer's recall names at most (every row's whole budget)."""
        return self.rows * self.budget

    def first_unit(self, layer: int) -> list[int]:
        """Host unit of block 0 of each row of offloaded layer `layer`: [R]."""
        return [(layer * self.rows + r) * self.max_blocks for r in range(self.rows)]

    def first_slot(self, layer: int) -> list[int]:
        """Device slot of entry 0 of each row of offloaded layer `layer`: [R]."""
        return [(layer * self.rows + r) * self.budget for r in range(self.rows)]
