"""LayerOffloadCache: every layer's KV in a pinned pulseio `HostPool`; during decode the next layers are
recalled into a ring of device buffers through a `DmaEngine` while the current layer computes.

Layout. A layer's KV is [2, B, Hkv, cap, D] (K then V; cap = max_cache_len rounded up to whole units), one
contiguous range of the host pool, cut into units of `tokens_per_unit` tokens of one head row. The device
pool holds `prefetch_layers + 1` such layer buffers. Recalling a layer of n tokens moves the first
ceil(n / tokens_per_unit) units of each of its 2 x B x Hkv head rows: pulseio coalesces them into one run
per row (one run for the whole layer once n fills it), so the copy engine sees 2 x B x Hkv large copies
(BATCHED: one `cuMemcpyBatchAsync`), not a copy per block.

One decode step, layer l (visit v = forward x L + l, buffer v % R, R = prefetch_layers + 1):
    device_wait(the recall of layer l)        the model's stream waits on the GPU, the host does not
    new tokens -> buffer, and -> host pool    the host copy through the pool's device view: a kernel
                                              storing over the bus, no copy call, no host sync
    recall layer (l + P) mod L                stream-ordered: the copy starts once the work enqueued so far
                                              (the attention of the buffer's last occupant) is done
    return the buffer's [:n + 1] views        transformers' own attention reads them
Only the new tokens go back to the host each step. The buffer a recall overwrites was last read by visit
v + P - R <= v - 1, whose attention is already enqueued: stream order keeps it intact. No host sync: the
recall's ids are host ints (the cache counts tokens on the host), and a device wait is a stream wait. A
prompt (a forward on an empty layer) attends to the model's own tensors and is written to the host pool the
same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import pulseio

from .cache_base import CacheFootprint, KVGeometry, PulseioCache, allocated_beside, device_allocated

log = logging.getLogger(__name__)


@dataclass
class _Loaded:
    """What a device buffer holds or is being filled with: `length` tokens of `layer`."""

    layer: int
    length: int
    transfer: Any  # the pulseio Transfer filling it, or None (nothing to copy)
    waited: bool = False  # the model's stream already waits for it


@dataclass(frozen=True)
class LayerOffloadStatistics:
    """What a LayerOffloadCache has moved (a snapshot; no device sync)."""

    recalls: int  # layer recalls submitted
    bytes_recalled: int  # landed so far
    recall_runs: int  # contiguous copies the last recall was coalesced into


class LayerOffloadCache(PulseioCache):
    """Whole-layer KV offload for `model.generate(past_key_values=cache)`; see the module doc.

    model: a transformers decoder (every layer full attention) on its device and dtype; max_cache_len:
    tokens the cache holds (prompt + new tokens); prefetch_layers: layers recalled ahead (P; the device
    holds P + 1 layer buffers); tokens_per_unit: tokens of one head row per pool unit; strategy: the
    pulseio route of the recalls (BATCHED: the copy engine, one driver call a layer)."""

    def __init__(self, model: Any, *, max_cache_len: int, batch_size: int = 1, prefetch_layers: int = 1,
                 tokens_per_unit: int = 256, strategy: pulseio.Strategy = pulseio.Strategy.BATCHED) -> None:
        geometry = KVGeometry.of(model, batch_size=batch_size, max_cache_len=max_cache_len)
        super().__init__(geometry)
        if isinstance(prefetch_layers, bool) or not isinstance(prefetch_layers, int) or prefetch_layers < 1:
            raise ValueError(f"prefetch_layers must be an int >= 1, got {prefetch_layers!r}")
        if isinstance(tokens_per_unit, bool) or not isinstance(tokens_per_unit, int) or tokens_per_unit < 1:
            raise ValueError(f"tokens_per_unit must be an int >= 1, got {tokens_per_unit!r}")
        g, tpu = geometry, tokens_per_unit
        self.strategy = strategy
        self.depth = min(prefetch_layers, g.num_layers - 1)  # P: a layer is never prefetched over itself
        self.buffers = self.depth + 1  # R
        cap = -(-max_cache_len // tpu) * tpu
        rows = 2 * g.batch_size * g.num_kv_heads
        self._tpu, self._row_units, self._rows = tpu, cap // tpu, rows
        self._layer_units = rows * self._row_units
        block_bytes = tpu * g.head_dim * g.elem_bytes
        before = device_allocated(g.device)
        backend = pulseio.open_backend(str(g.device))
        self.host_pool = pulseio.HostPool(backend, g.num_layers * self._layer_units, block_bytes)
        self.device_pool = pulseio.DevicePool(backend, self.buffers * self._layer_units, block_bytes)
        # staging is for the GATHER_DMA route only: one unit keeps its device twin small
        self._dma = pulseio.DmaEngine(self.host_pool, self.device_pool,
                                      pulseio.DmaConfig(staging_bytes=block_bytes, staging_buffers=2))
        self._pulseio_device_bytes = allocated_beside(g.device, before, self.device_pool.slots.numel())
        if strategy not in self._dma.available:  # e.g. BATCHED needs cuMemcpyBatchAsync (CUDA 12.8 drivers)
            log.warning("pulseio strategy %s is not available on this backend (%s); recalling layers with AUTO",
                        strategy.value, sorted(s.value for s in self._dma.available))
            self.strategy = pulseio.Strategy.AUTO
        shape = (2, g.batch_size, g.num_kv_heads, cap, g.head_dim)
        self._host = self.host_pool.device_view(g.dtype, tpu, g.head_dim).view(g.num_layers, *shape)
        self._buf = self.device_pool.view(g.dtype, tpu, g.head_dim).view(self.buffers, *shape)
        self._row_start = np.arange(rows, dtype=np.int64) * self._row_units  # [rows] first unit of each row
        self._loaded: list[_Loaded | None] = [None] * self.buffers
        self._forward = -1
        self._recalls = 0
        self._last_runs = 0

    # -- transformers' side ------------------------------------------------------------------------------

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states, value_states: [B, Hkv, T, D] new post-RoPE KV of `layer_idx` -> all its KV [B, Hkv, n + T, D]."""
        n, t = self.get_seq_length(layer_idx), key_states.shape[-2]
        self.geometry.check_update(key_states, n)
        if layer_idx == 0:
            self._forward += 1
        visit = self._forward * self.geometry.num_layers + layer_idx
        kv = (key_states, value_states)
        if n > 0:
            buf = self._buf[self._use(visit, layer_idx, n)]               # [2, B, Hkv, cap, D]
            buf[0, :, :, n:n + t] = key_states
            buf[1, :, :, n:n + t] = value_states
            kv = (buf[0, :, :, :n + t], buf[1, :, :, :n + t])
        self._host[layer_idx, 0, :, :, n:n + t] = key_states
        self._host[layer_idx, 1, :, :, n:n + t] = value_states
        self._advance(layer_idx, t)
        if self.depth:
            self._prefetch(visit + self.depth)
        return kv

    # -- the recalls -------------------------------------------------------------------------------------

    def _use(self, visit: int, layer: int, length: int) -> int:
        """The buffer holding `layer`'s first `length` tokens for this visit, recalled now if no prefetch
        did; the model's stream waits for it on the device."""
        index = visit % self.buffers
        loaded = self._loaded[index]
        if loaded is None or (loaded.layer, loaded.length) != (layer, length):
            loaded = self._recall(index, layer, length)
        if loaded.transfer is not None and not loaded.waited:
            loaded.transfer.device_wait()
            loaded.waited = True
        return index

    def _prefetch(self, visit: int) -> None:
        layer = visit % self.geometry.num_layers
        self._recall(visit % self.buffers, layer, self.get_seq_length(layer))

    def _recall(self, index: int, layer: int, length: int) -> _Loaded:
        """Submit the recall of `layer`'s first `length` tokens into buffer `index` (host ids: no device sync)."""
        old = self._loaded[index]
        if old is not None and old.transfer is not None and not old.waited:
            old.transfer.device_wait()  # two copies into one buffer are not ordered: order them on our stream
        transfer = None
        if length > 0:
            units = -(-length // self._tpu)
            host, slots = self._unit_ids(layer, index, units)
            transfer = self._dma.recall(host_ids=host, device_slots=slots, strategy=self.strategy)
            self._recalls += 1
        self._loaded[index] = loaded = _Loaded(layer, length, transfer)
        return loaded

    def _unit_ids(self, layer: int, index: int, units: int) -> tuple[np.ndarray, np.ndarray]:
        """The first `units` units of each head row of `layer` (host) and of buffer `index` (device): [rows x units]."""
        rows = (self._row_start[:, None] + np.arange(units, dtype=np.int64)).reshape(-1)
        self._last_runs = self._rows if units < self._row_units else 1
        return rows + layer * self._layer_units, rows + index * self._layer_units

    # -- lifecycle ---------------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every token (a new generate call); the pools stay."""
        for loaded in self._loaded:
            if loaded is not None and loaded.transfer is not None and not loaded.waited:
                loaded.transfer.device_wait()
        self._loaded = [None] * self.buffers
        self._forward = -1
        super().reset()

    def statistics(self) -> LayerOffloadStatistics:
        stats = self._dma.statistics()
        return LayerOffloadStatistics(recalls=self._recalls, bytes_recalled=stats.bytes_moved,
                                      recall_runs=self._last_runs)

    def memory_footprint(self) -> CacheFootprint:
        """The device pool's R layer buffers and pulseio's own device buffers; the host pool."""
        return CacheFootprint.of(self.host_pool.blocks.numel(), layer_buffers=self.device_pool.slots.numel(),
                                 pulseio=self._pulseio_device_bytes)

    def close(self) -> None:
        if not self._closed:
            self._dma.close()  # lets the copies in flight land
            self.device_pool.close()
            self.host_pool.close()
        super().close()
