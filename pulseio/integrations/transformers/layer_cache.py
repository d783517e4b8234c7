"""LayerOffloadCache: every layer's KV in a pinned pulseio `HostPool`; during decode the next layers are
recalled into a ring of device buffers through a `DmaEngine` while the current layer computes.

Layout. A layer's KV is token-major, [cap, 2, B, Hkv, D] (cap = max_cache_len rounded up to whole units),
one contiguous range of the host pool cut into units of `tokens_per_unit` tokens. The first n tokens of a
layer are then one contiguous range too: recalling them is one large copy (BATCHED: one
`cuMemcpyBatchAsync`, cut only where the host pool's pinned segments meet), at the link's rate, and the
device buffer a layer lands in is the same layout, so the new tokens reach the host in one contiguous
store. Attention reads [B, Hkv, n, D] views of it (strided, innermost dim contiguous). The device pool holds
`prefetch_layers + 1` layer buffers. A recall's `TransferPlan` is built (validated, coalesced) once per
(layer, buffer, units) and submitted again until the layer grows a unit.

One decode step, layer l (visit v = forward x L + l, buffer v % R, R = prefetch_layers + 1):
    device_wait(the recall of layer l)        the model's stream waits on the GPU, the host does not
    new tokens -> buffer -> host pool         the host copy through the pool's device view: a kernel
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
import time
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
    recall_runs: int  # contiguous runs the last recall was coalesced into (1; the copy engine may cut one where
    # the host pool's pinned segments meet)


class LayerOffloadCache(PulseioCache):
    """Whole-layer KV offload for `model.generate(past_key_values=cache)`; see the module doc.

    model: a transformers decoder (every layer full attention) on its device and dtype; max_cache_len:
    tokens the cache holds (prompt + new tokens); prefetch_layers: layers recalled ahead (P; the device
    holds P + 1 layer buffers); tokens_per_unit: tokens per pool unit (every head, K and V); strategy: the
    pulseio route of the recalls (BATCHED: the copy engine, one driver call a layer); dma: the engine's
    DmaConfig (default: issue on pulseio's worker thread, so that a driver call waiting for room behind the
    previous layer's copy never holds up the model's thread)."""

    def __init__(self, model: Any, *, max_cache_len: int, batch_size: int = 1, prefetch_layers: int = 1,
                 tokens_per_unit: int = 256, strategy: pulseio.Strategy = pulseio.Strategy.BATCHED,
                 dma: pulseio.DmaConfig | None = None) -> None:
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
        self._tpu = tpu
        self._layer_units = -(-max_cache_len // tpu)
        cap = self._layer_units * tpu
        token_shape = (2, g.batch_size, g.num_kv_heads, g.head_dim)
        block_bytes = tpu * 2 * g.batch_size * g.num_kv_heads * g.head_dim * g.elem_bytes
        before = device_allocated(g.device)
        backend = pulseio.open_backend(str(g.device))
        self.host_pool = pulseio.HostPool(backend, g.num_layers * self._layer_units, block_bytes)
        self.device_pool = pulseio.DevicePool(backend, self.buffers * self._layer_units, block_bytes)
        # staging is for the GATHER_DMA route only: one unit keeps its device twin small
        dma = dma or pulseio.DmaConfig(staging_bytes=block_bytes, staging_buffers=2, inline_issue=False)
        self._dma = pulseio.DmaEngine(self.host_pool, self.device_pool, dma)
        self._pulseio_device_bytes = allocated_beside(g.device, before, self.device_pool.slots.numel())
        if strategy not in self._dma.available:  # e.g. BATCHED needs cuMemcpyBatchAsync (CUDA 12.8 drivers)
            log.warning("pulseio strategy %s is not available on this backend (%s); recalling layers with AUTO",
                        strategy.value, sorted(s.value for s in self._dma.available))
            self.strategy = pulseio.Strategy.AUTO
        self._host = self.host_pool.device_view(g.dtype, tpu, *token_shape).view(g.num_layers, cap, *token_shape)
        self._buf = self.device_pool.view(g.dtype, tpu, *token_shape).view(self.buffers, cap, *token_shape)
        self._plans: dict[tuple[int, int], tuple[int, pulseio.TransferPlan]] = {}  # (layer, buffer) -> (units, plan)
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
        host = self._host[layer_idx, n:n + t]                                  # [T, 2, B, Hkv, D]
        if n > 0:
            buf = self._buf[self._use(visit, layer_idx, n)]                   # [cap, 2, B, Hkv, D]
            new = buf[n:n + t]
            new[:, 0] = key_states.permute(2, 0, 1, 3)
            new[:, 1] = value_states.permute(2, 0, 1, 3)
            host.copy_(new)                                                   # one contiguous store
            kv = (buf[:n + t, 0].permute(1, 2, 0, 3), buf[:n + t, 1].permute(1, 2, 0, 3))
        else:
            host[:, 0] = key_states.permute(2, 0, 1, 3)
            host[:, 1] = value_states.permute(2, 0, 1, 3)
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
            transfer = self._dma.submit(self._plan(layer, index, -(-length // self._tpu)), strategy=self.strategy)
            self._recalls += 1
            if not self._dma.config.inline_issue:
                time.sleep(0)  # hand the GIL to pulseio's worker now: it issues the copy, not a switch interval later
        self._loaded[index] = loaded = _Loaded(layer, length, transfer)
        return loaded

    def _plan(self, layer: int, index: int, units: int) -> pulseio.TransferPlan:
        """The recall of `layer`'s first `units` units into buffer `index`: one run, built once per units."""
        cached = self._plans.get((layer, index))
        if cached is None or cached[0] != units:
            first = np.arange(units, dtype=np.int64)
            plan = self._dma.plan_recall(host_ids=first + layer * self._layer_units,
                                         device_slots=first + index * self._layer_units)
            cached = self._plans[(layer, index)] = (units, plan)
        self._last_runs = len(cached[1].runs[2])
        return cached[1]

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
