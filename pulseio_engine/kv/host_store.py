"""The full KV of offload requests in a `pulseio.HostPool`, and their hot slots in the `DevicePool`.

Both pools belong to the engine's `pulseio.Runtime` and hold transfer units (`UnitLayout`):
`[2, block_size, heads_per_unit, head_dim]`, K then V. A request gets, at `open`, one host unit per
(offloaded layer, selecting row, block) for its whole life and `hot_blocks` hot slots per (offloaded layer,
selecting row) (`OffloadConfig.hot_blocks`: the budget's K, or more to keep blocks selected earlier, the least
recently selected evicted by the select kernel, `age` its clock); `OffloadSeq` maps them. The prompt's KV is
stored at the end of prefill (`store_blocks`), each decoded token's KV as it is computed (`append`), so the host
copy is always whole and a recall can fetch any block, the one being written included.

Every write to the host pool goes through its device-mapped view (`host_view`, from
`HostPool.device_view`): kernels on the model's stream (`token_store.store_tokens`) store into pinned
memory over the bus, ordered before the recalls that read it, with no copy call and no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import pulseio

from ..errors import OffloadCapacityError
from ..upload import to_device_nowait
from .block_table import BlockAllocator, blocks_for
from .offload_layout import UnitLayout
from .selection import PAD


@dataclass
class OffloadSeq:
    """One offload request's maps, on the model's device (L = offloaded layers, S = selecting rows, H = hot-set
    entries per row, `hot_blocks`)."""

    host_map: torch.Tensor    # [L, S, NB] int64: host unit of each block; 0 (the pool's spare) past its blocks
    hot: torch.Tensor         # [L, S, H] int64: device slot of each hot-set entry
    resident: torch.Tensor    # [L, S, NB] int64: hot-set entry holding each block, or -1
    owner: torch.Tensor       # [L, S, H] int64: block held by each hot-set entry, or -1 (resident's inverse)
    age: torch.Tensor         # [L, S, H] int32: selection calls since each entry's block was last selected (LRU)
    units: list[int]          # host units held, for `close`
    slots: list[int]          # device slots held, for `close`


class HostStore:
    """Views of the runtime's pools as transfer units, and who holds which (see the module doc)."""

    def __init__(self, host_pool: pulseio.HostPool, device_pool: pulseio.DevicePool, layout: UnitLayout, *,
                 num_layers: int, max_blocks_per_seq: int, hot_blocks: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        """host_pool, device_pool: the runtime's pools, in units of `layout.unit_bytes`;
        num_layers: offloaded layers; hot_blocks: hot-set entries per (layer, selecting row)."""
        self.layout = layout
        self.num_layers = num_layers
        self.max_blocks = max_blocks_per_seq
        self.hot_blocks = hot_blocks
        self.device = device
        self.host = host_pool.view(dtype, *layout.unit_shape)                 # [n_host, 2, bs, hg, D], CPU
        self._host_writes = host_pool.device_view(dtype, *layout.unit_shape)  # the same memory, on `device`
        self.hot = device_pool.view(dtype, *layout.unit_shape)                # [n_slots, 2, bs, hg, D]
        self._units = BlockAllocator(self.host.shape[0])     # unit 0 is never handed out: padding reads it
        self._slots = BlockAllocator(self.hot.shape[0])

    def units_for(self, num_tokens: int) -> int:
        """Host units a request of `num_tokens` tokens holds."""
        return self.num_layers * self.layout.groups * blocks_for(num_tokens, self.layout.block_size)

    @property
    def host_view(self) -> torch.Tensor:
        """[n_host, 2, bs, hg, D]: the host pool as the device writes it (device-mapped pinned memory)."""
        return self._host_writes

    @property
    def units_free(self) -> int:
        return self._units.num_free

    @property
    def slots_free(self) -> int:
        return self._slots.num_free

    @property
    def slots_per_seq(self) -> int:
        return self.num_layers * self.layout.groups * self.hot_blocks

    def open(self, num_tokens: int) -> OffloadSeq:
        """Reserve a request's host units and hot slots; refuses, naming the numbers, when they are not free."""
        units, slots = self.units_for(num_tokens), self.slots_per_seq
        if not self._units.can_allocate(units):
            raise OffloadCapacityError(
                f"an offload request of {num_tokens} tokens needs {units} host units of "
                f"{self.layout.unit_bytes} B, the host pool has {self._units.num_free} free of "
                f"{self._units.capacity}; raise OffloadConfig.host_blocks or shorten the request")
        if not self._slots.can_allocate(slots):
            raise OffloadCapacityError(
                f"an offload request needs {slots} hot slots, {self._slots.num_free} are free: "
                f"OffloadConfig.max_seqs offload requests are running; wait for one to finish or raise it")
        shape = (self.num_layers, self.layout.groups)
        n = blocks_for(num_tokens, self.layout.block_size)
        unit_ids, slot_ids = self._units.allocate(units), self._slots.allocate(slots)
        host_map = torch.zeros((*shape, self.max_blocks), dtype=torch.int64)
        host_map[:, :, :n] = torch.tensor(unit_ids, dtype=torch.int64).view(*shape, n)
        hot = torch.tensor(slot_ids, dtype=torch.int64).view(*shape, self.hot_blocks)
        dev = self.device
        return OffloadSeq(host_map=to_device_nowait(host_map, dev), hot=to_device_nowait(hot, dev),
                          resident=torch.full((*shape, self.max_blocks), PAD, dtype=torch.int64, device=dev),
                          owner=torch.full((*shape, self.hot_blocks), PAD, dtype=torch.int64, device=dev),
                          age=torch.zeros((*shape, self.hot_blocks), dtype=torch.int32, device=dev),
                          units=unit_ids, slots=slot_ids)

    def close(self, seq: OffloadSeq) -> None:
        self._units.free(seq.units)
        self._slots.free(seq.slots)

    def store_blocks(self, layer: int, seq: OffloadSeq, blocks: torch.Tensor) -> None:
        """Write a request's first n blocks of offloaded layer `layer` to the host.
        blocks: [n, 2, bs, Hkv, D] (the KV cache's layout)."""
        n, s, hg = blocks.shape[0], self.layout.groups, self.layout.heads_per_unit
        units = blocks.unflatten(3, (s, hg)).permute(3, 0, 1, 2, 4, 5)       # [S, n, 2, bs, hg, D]
        ids = seq.host_map[layer, :, :n].reshape(-1)                         # [S * n]
        self._host_writes.index_copy_(0, ids, units.reshape(s * n, *self.layout.unit_shape)
                                      .to(self._host_writes.dtype))

    def read(self, seq: OffloadSeq, layer: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A request's first `num_tokens` K and V of offloaded layer `layer`, gathered on the device from
        the host pool (stream-ordered after earlier writes) -> ([n, Hkv, D], [n, Hkv, D])."""
        n = blocks_for(num_tokens, self.layout.block_size)
        units = self._host_writes[seq.host_map[layer, :, :n]]              # [S, n, 2, bs, hg, D]
        kv = units.permute(2, 1, 3, 0, 4, 5).flatten(3, 4).flatten(1, 2)   # [2, n * bs, Hkv, D]
        return kv[0, :num_tokens], kv[1, :num_tokens]
