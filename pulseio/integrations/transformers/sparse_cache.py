"""SparseOffloadCache: all KV in a pinned pulseio `HostPool` in block units; per offloaded layer a hot set of
budget blocks on the device; each decode step recalls the selected blocks that are not hot through the
doorbell (`Runtime.post_recall`, ids decided on the device) and attends to the selected blocks only.

transformers calls, per layer and forward, `update` and then the attention function (`attention.py`,
registered as attn_implementation="pulseio_sparse"). For an offloaded layer in decode:

    update(k, v)           the new token -> its block's digest (max / min) and the host pool (through the
                           pool's device view: a kernel storing over the bus); returns an empty marker
    attention(q)           Quest bounds of q against the digests -> sink + local + top-k blocks [B, S, K]
                           -> HotSet.plan: the missing blocks and free slots -> post_recall(count=) and
                           device_wait (the stream waits on the GPU) -> the new token into its hot slot ->
                           gather the selected blocks in position order -> transformers' SDPA over them

No step makes the host wait on the GPU: block counts are host ints (every row has the same length), the
recall's count stays on the device. A prompt (a forward on an empty cache) attends densely to the model's own
tensors and fills the host pool and the digests; a later multi-token forward reads earlier KV back from the
host pool. Dense layers keep their KV whole on the device. With a budget that covers the context every block
is selected, in position order, and the attention sees exactly the keys and values a DynamicCache holds.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

import pulseio

from .cache_base import CacheFootprint, KVGeometry, PulseioCache, allocated_beside, device_allocated
from .hot_set import HotSet
from .selection import block_digests, selected_tokens
from .sparse_layout import SparseLayout, SparseSelection
from .sparse_step import Graphs, LayerStep, LayerTensors, Pools, StepInputs

SPARSE_ATTENTION = "pulseio_sparse"
RESIDENT_IDLE_US = 5000  # a resident copier generation stays up between two layers' recalls (GPU)


class RecallError(RuntimeError):
    """A recall through pulseio failed after its layer had gone on (see `SparseOffloadCache._check_landed`)."""


@dataclass(frozen=True)
class SparseOffloadStatistics:
    """What a SparseOffloadCache has recalled (a snapshot; no device sync)."""

    recalls: int  # post_recall requests (one per offloaded layer and decode step)
    landed: int
    bytes_recalled: int
    unit_bytes: int
    graphed_halves: int  # decode halves replayed from CUDA graphs (2 per offloaded layer once captured)
    graph_failure: str | None  # why capture was given up (the step then runs eagerly), or None


class SparseOffloadCache(PulseioCache):
    """Sparse KV offload for `model.generate(past_key_values=cache)` on a model loaded with
    attn_implementation="pulseio_sparse"; see the module doc. Selection options: `SparseSelection`;
    cuda_graphs: on a GPU, replay each layer's decode work from CUDA graphs (sparse_step.py); runtime: the
    pulseio RuntimeConfig (default: one unit a block, see `_runtime_config`)."""

    def __init__(self, model: Any, *, max_cache_len: int, batch_size: int = 1, budget_tokens: int = 2048,
                 block_size: int = 16, sink_blocks: int = 1, local_blocks: int = 2, dense_layers: int = 2,
                 heads: list[int] | tuple[int, ...] | None = None, cuda_graphs: bool = True,
                 runtime: pulseio.RuntimeConfig | None = None) -> None:
        geometry = KVGeometry.of(model, batch_size=batch_size, max_cache_len=max_cache_len)
        implementation = getattr(model.config, "_attn_implementation", None)
        if implementation != SPARSE_ATTENTION:
            raise ValueError(f"the model attends with {implementation!r}; SparseOffloadCache needs "
                             f"attn_implementation={SPARSE_ATTENTION!r} (from_pretrained(..., attn_implementation=...) "
                             f"or model.set_attn_implementation({SPARSE_ATTENTION!r}))")
        self.selection = SparseSelection(budget_tokens, block_size, sink_blocks, local_blocks, dense_layers,
                                         None if heads is None else tuple(heads))
        self.selection.check(geometry)
        super().__init__(geometry)
        g, lay = geometry, SparseLayout.of(geometry, self.selection)
        self.layout, dev = lay, geometry.device
        before = device_allocated(dev)
        self.runtime = pulseio.open_runtime(runtime or _runtime_config(lay, dev))
        self._pulseio_device_bytes = allocated_beside(dev, before, self.runtime.device_pool.slots.numel())
        self.host_pool, self.device_pool = self.runtime.host_pool, self.runtime.device_pool
        self._host = self.host_pool.device_view(g.dtype, *lay.unit_shape)   # [units, 2, hpu, bs, D], writes
        self._hot = self.device_pool.view(g.dtype, *lay.unit_shape)         # [slots, 2, hpu, bs, D]
        cap = lay.max_blocks * lay.block_size
        self._dense = torch.empty((dense_layers, 2, g.batch_size, g.num_kv_heads, cap, g.head_dim), dtype=g.dtype,
                                  device=dev)                               # [Ld, 2, B, Hkv, cap, D]
        digest = (lay.offloaded, g.batch_size, lay.selecting, lay.max_blocks, g.head_dim)
        self._dmax = torch.empty(digest, dtype=g.dtype, device=dev)         # [Lo, B, S, NB, D]
        self._dmin = torch.empty(digest, dtype=g.dtype, device=dev)
        self._hot_sets = [HotSet(torch.tensor(lay.first_unit(o), device=dev),
                                 torch.tensor(lay.first_slot(o), device=dev), lay.budget, lay.max_blocks)
                          for o in range(lay.offloaded)]
        self._markers = [self._marker(o + dense_layers) for o in range(lay.offloaded)]
        self._pending: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * lay.offloaded
        self._inputs, self._pools = StepInputs.allocate(g), Pools.of(self._host, self._hot, g, lay)
        self.graphs = Graphs(dev) if cuda_graphs and dev.type == "cuda" else None
        solo = self.selection.heads
        self._steps = [LayerStep(LayerTensors(self._dmax[o], self._dmin[o], self._hot_sets[o],
                                              None if solo is None else solo[o + dense_layers]),
                                 self._inputs, self._pools, budget=lay.budget, sink=sink_blocks,
                                 local=local_blocks, graphs=self.graphs) for o in range(lay.offloaded)]
        self._posted: list[Any] = []  # this step's and unfinished earlier recalls (pulseio Completions)

    def _marker(self, layer: int) -> torch.Tensor:
        """An empty [B, Hkv, 0, D] tensor that `update` returns for an offloaded decode layer: it tells the
        registered attention function which cache and layer it attends for (a mis-set attention reads nothing)."""
        g = self.geometry
        marker = torch.empty((g.batch_size, g.num_kv_heads, 0, g.head_dim), dtype=g.dtype, device=g.device)
        marker._pulseio_sparse = (weakref.ref(self), layer)  # type: ignore[attr-defined]
        return marker

    # -- update: what transformers hands the cache -----------------------------------------------------

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states, value_states: [B, Hkv, T, D] -> what the layer attends to (see the module doc)."""
        n, t = self.get_seq_length(layer_idx), key_states.shape[-2]
        self.geometry.check_update(key_states, n)
        dense = self.selection.dense_layers
        self._advance(layer_idx, t)
        if layer_idx < dense:
            buf = self._dense[layer_idx]                                    # [2, B, Hkv, cap, D]
            buf[0, :, :, n:n + t] = key_states
            buf[1, :, :, n:n + t] = value_states
            return buf[0, :, :, :n + t], buf[1, :, :, :n + t]
        o = layer_idx - dense
        if n == 0:
            self._hot_sets[o].reset()
            self._store_blocks(o, key_states, value_states)
            self._set_digests(o, 0, key_states)
            return key_states, value_states
        if t > 1:   # a later chunk: earlier KV back from the host, attended densely
            old_k, old_v = self._read_host(o, n)
            keys, values = torch.cat([old_k, key_states], 2), torch.cat([old_v, value_states], 2)
            self._store_tokens(o, n, key_states, value_states)
            self._set_digests(o, n // self.layout.block_size, keys)
            self._hot_sets[o].reset()   # hot copies of the block the chunk went on lack its tokens
            return keys, values
        if o == 0:
            self._check_landed()
        self._pending[o] = (key_states, value_states)   # to the host pool, its digest and hot slot: sparse_step
        return self._markers[o], self._markers[o]

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """[B, Hkv, T, D] -> [R, hpu, T, D]: each selecting row's heads."""
        lay = self.layout
        return x.reshape(lay.rows, lay.heads_per_unit, *x.shape[2:])

    def _selecting_keys(self, o: int, keys: torch.Tensor) -> torch.Tensor:
        """[B, Hkv, T, D] -> [B, S, T, D]: the keys of the heads that select."""
        heads = self.selection.heads
        if heads is None:
            return keys
        head = heads[o + self.selection.dense_layers]
        return keys[:, head:head + 1]

    def _store_blocks(self, o: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """A prompt's KV [B, Hkv, T, D] into whole host units (contiguous writes of a unit each)."""
        lay = self.layout
        nb = -(-keys.shape[2] // lay.block_size)
        pad = nb * lay.block_size - keys.shape[2]
        kv = torch.stack([self._rows(keys), self._rows(values)], 1)                   # [R, 2, hpu, T, D]
        kv = torch.nn.functional.pad(kv, (0, 0, 0, pad)).unflatten(3, (nb, lay.block_size))
        units = kv.permute(0, 3, 1, 2, 4, 5).reshape(lay.rows * nb, *lay.unit_shape)   # [R * nb, 2, hpu, bs, D]
        ids = (self._hot_sets[o].unit0 + torch.arange(nb, device=keys.device)).reshape(-1)
        self._host.index_copy_(0, ids, units)

    def _store_tokens(self, o: int, n: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """New tokens n .. n + T - 1 ([B, Hkv, T, D]) into their host units, a row of each."""
        lay, t = self.layout, keys.shape[2]
        pos = torch.arange(n, n + t, device=keys.device)
        units = self._hot_sets[o].unit0 + pos // lay.block_size                       # [R, T]
        flat = self._host.view(-1, lay.heads_per_unit, lay.block_size, lay.head_dim)  # [units * 2, hpu, bs, D]
        offsets = pos % lay.block_size
        flat[units * 2, :, offsets] = self._rows(keys).transpose(1, 2)                  # [R, T, hpu, D]
        flat[units * 2 + 1, :, offsets] = self._rows(values).transpose(1, 2)

    def _read_host(self, o: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n tokens of offloaded layer o from the host pool -> K, V [B, Hkv, n, D] (a device gather)."""
        lay, g = self.layout, self.geometry
        nb = -(-n // lay.block_size)
        ids = self._hot_sets[o].unit0 + torch.arange(nb, device=g.device)               # [R, nb]
        units = self._host[ids]                                                          # [R, nb, 2, hpu, bs, D]
        kv = units.permute(2, 0, 3, 1, 4, 5).reshape(2, g.batch_size, g.num_kv_heads, nb * lay.block_size, -1)
        return kv[0, :, :, :n], kv[1, :, :, :n]

    def _set_digests(self, o: int, first_block: int, keys: torch.Tensor) -> None:
        """Digests of blocks first_block.. from keys [B, Hkv, T, D] whose token 0 is block first_block's first."""
        bs = self.layout.block_size
        dmax, dmin = block_digests(self._selecting_keys(o, keys[:, :, first_block * bs:]), bs)
        last = first_block + dmax.shape[2]
        self._dmax[o, :, :, first_block:last] = dmax
        self._dmin[o, :, :, first_block:last] = dmin

    def _check_landed(self) -> None:
        """Raise RecallError for a recall of an earlier step that failed: pulseio's watchdog let the layer's
        stream go on over slots that were not written (see pulseio's device-wait contract), so that step's
        output was wrong. Recalls not finished yet are looked at next step. No device sync."""
        posted, self._posted = self._posted, []
        for done in posted:
            if not done.done():
                self._posted.append(done)
            elif done.exception() is not None:
                raise RecallError(f"the recall for layer {done.tag} failed, so an earlier step attended slots that "
                                  f"were not written: {done.exception()}") from done.exception()

    # -- attention: called by the registered attention function -----------------------------------------

    def attend_selected(self, layer: int, query: torch.Tensor, attention_mask: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """query: [B, Hq, 1, D] of an offloaded layer in decode -> (K, V [B, Hkv, n_sel, D], mask) of the
        selected blocks in position order, recalled and waited for on the device (see sparse_step.py)."""
        o = layer - self.selection.dense_layers
        pending, self._pending[o] = self._pending[o], None
        if pending is None:
            raise RuntimeError(f"layer {layer}: attention without a preceding update of the same layer")
        lay, x = self.layout, self._inputs
        n = self.get_seq_length(layer)
        if o == 0:   # every offloaded layer of a decode step has the same context
            x.num_blocks.fill_(-(-n // lay.block_size))
            x.block.fill_((n - 1) // lay.block_size)
            x.offset.fill_((n - 1) % lay.block_size)
        x.q.copy_(query[:, :, -1])
        x.k.copy_(pending[0][:, :, -1])
        x.v.copy_(pending[1][:, :, -1])
        step = self._steps[o]
        plan = step.before()
        done = self.runtime.post_recall(host_ids=plan.host_ids, device_slots=plan.device_slots, count=plan.count,
                                        tag=layer)
        done.device_wait()
        self._posted.append(done)
        step.after(plan)
        valid = selected_tokens(n, lay.budget, lay.block_size)
        mask = None if attention_mask is None else self._select_mask(attention_mask, plan.selected, valid)
        gathered = self._pools.gathered
        return gathered[0, :, :, :valid], gathered[1, :, :, :valid], mask

    def _select_mask(self, mask: torch.Tensor, selected: torch.Tensor, valid: int) -> torch.Tensor:
        """mask: [B, 1, 1, n] (transformers' decode mask, shared by heads) -> [B, Hq, 1, valid] at the
        positions of the selected blocks' tokens."""
        if mask.shape[1] != 1 or mask.shape[2] != 1:
            raise ValueError(f"pulseio_sparse attends one query token with a mask shared by all heads; got a mask "
                             f"of shape {tuple(mask.shape)}")
        lay, g = self.layout, self.geometry
        pos = selected.view(g.batch_size, lay.selecting, lay.budget).clamp(min=0)[..., None] * lay.block_size
        pos = (pos + torch.arange(lay.block_size, device=mask.device)).flatten(2)[..., :valid]     # [B, S, valid]
        picked = mask[:, 0, 0].gather(1, pos.flatten(1)).view(g.batch_size, lay.selecting, 1, valid)
        return picked.repeat_interleave(g.num_heads // lay.selecting, dim=1)

    # -- lifecycle ---------------------------------------------------------------------------------------

    def statistics(self) -> SparseOffloadStatistics:
        rt = self.runtime.statistics()
        graphs = self.graphs
        return SparseOffloadStatistics(recalls=rt.submitted, landed=rt.completed, bytes_recalled=rt.bytes_moved,
                                       unit_bytes=self.layout.unit_bytes,
                                       graphed_halves=0 if graphs is None else graphs.captured,
                                       graph_failure=None if graphs is None else graphs.failed)

    def memory_footprint(self) -> CacheFootprint:
        """The hot sets, digests, residency maps, dense layers and step buffers on the device, pulseio's own
        device buffers and the CUDA graphs' pool (once captured, at the second decode step); the host pool."""
        maps = sum(h.resident.numel() * 8 + h.where.numel() * 8 + h.unit0.numel() * 16 for h in self._hot_sets)
        step = sum(t.numel() * t.element_size() for t in (*self._inputs.tensors(), self._pools.gathered))
        return CacheFootprint.of(self.host_pool.blocks.numel(), hot_sets=self.device_pool.slots.numel(),
                                 digests=2 * self._dmax.numel() * self._dmax.element_size(),
                                 dense_layers=self._dense.numel() * self._dense.element_size(), residency=maps,
                                 step_buffers=step, pulseio=self._pulseio_device_bytes,
                                 graphs=0 if self.graphs is None else self.graphs.bytes)

    def close(self) -> None:
        if not self._closed:
            self.runtime.close()
        super().close()


def _runtime_config(layout: SparseLayout, device: torch.device) -> pulseio.RuntimeConfig:
    """Pools of one block unit each; one request per offloaded layer and step, at most every row's budget.
    On a GPU the poller spins through the gap between two layers' recalls (GIL-free, a few ms) and a resident
    copier generation stays up between them; on a CPU the poller sleeps at once (a spin would take a core
    from the decode it serves)."""
    on_gpu = device.type == "cuda"
    idle = RESIDENT_IDLE_US if on_gpu else pulseio.DmaConfig.resident_idle_us
    dma = pulseio.DmaConfig(staging_bytes=layout.unit_bytes, staging_buffers=2, resident_idle_us=idle)
    return pulseio.RuntimeConfig(device=str(device), host_blocks=layout.host_units, device_slots=layout.device_slots,
                                 block_bytes=layout.unit_bytes, max_blocks_per_request=layout.recall_width,
                                 ring_slots=64, max_outstanding=128, dma=dma,
                                 spin_iterations=5_000_000 if on_gpu else 1)

