"""Offload requests: full KV in the host pool, a hot set on the device, recall through pulseio.

`Offloader` owns the engine's `pulseio.Runtime`, the `HostStore` over its pools, the block digests
and the `Recaller`. For a decode batch of offload requests it returns an `OffloadBatch`, the model's
attention for every offloaded layer (layers >= dense_layers; the dense layers use the paged cache).
One offloaded layer of one decode step, all in fixed-shape tensors:

    digests.update(k)                     fold the new key into its block's digest
    store.append(k, v)                    the new token's KV to the host copy
    select_for_layer(q)                   sink + local + top-k blocks, [B, S, K]
    plan_recall(selected, resident)       which blocks to recall, into which hot slots
    recaller.recall(...)                  pulseio: post_recall + device_wait (or the sync baseline)
    store.write_hot(k, v)                 the new token into its (now resident) block's hot slot
    hot_attention(q, selected slots)      attention over the selected blocks only
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

import torch
from torch.profiler import record_function

import pulseio

from .attention import chunk_attention, paged_decode_attention
from .config import EngineConfig, OffloadConfig, RecallMode, SparseMode
from .errors import OffloadCapacityError
from .kv.block_table import blocks_for
from .kv.cache import KVCache
from .kv.digests import BlockDigests
from .kv.handoff import KVSource
from .kv.host_store import HostStore, OffloadSeq
from .kv.offload_layout import OffloadFootprint, UnitLayout, offload_footprint
from .kv.recall import Recaller, compact
from .kv.residency import RecallPlan, apply_recall, plan_recall
from .kv.retrieval_heads import RetrievalHeads
from .kv.selection import BlockSelector, DigestSelector
from .model.batch_state import BatchState, DecodeAttention, PrefillAttention


def hot_attention(q: torch.Tensor, hot: torch.Tensor, table: torch.Tensor, context_lens: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """Decode attention over selected hot slots. q: [B, Hq, D]; hot: [n_slots, 2, bs, hg, D];
    table: [B * S, K] int64 slots, selected blocks ascending (the block being written last), padding
    after; context_lens: [B * S] tokens in those blocks -> [B, Hq, D]. Each selecting row is one
    'sequence' of the paged kernel with its hg KV heads and their Hq / S query heads."""
    b, hq, d = q.shape
    s = table.shape[0] // b
    out = paged_decode_attention(q.reshape(b * s, hq // s, d), hot[:, 0], hot[:, 1], table.int(),
                                 context_lens.int(), scale)
    return out.view(b, hq, d)


@dataclass(frozen=True)
class OffloadStatistics:
    """What the offload path holds and has moved (a snapshot)."""

    unit_bytes: int              # one recalled transfer unit
    unit_heads: int              # KV heads in a unit: Hkv (shared selection) or 1 (head-wise)
    requests: int                # offload requests holding host units now
    host_units_free: int
    hot_slots_free: int
    recalls: int                 # recall requests sent to the runtime (one per offloaded layer and step)
    bytes_recalled: int


class Offloader:
    """Owns the runtime, the host store, the digests and the recaller of the engine's offload requests."""

    def __init__(self, config: EngineConfig, *, dtype: torch.dtype, num_blocks: int, max_blocks_per_seq: int,
                 scale: float, heads: RetrievalHeads | None) -> None:
        """num_blocks: the paged cache's blocks (digests are indexed by physical block)."""
        offload: OffloadConfig = config.offload   # type: ignore[assignment]
        model, sparse = config.model, offload.sparse
        if heads is None and sparse.mode is not SparseMode.QUEST:
            raise ValueError(f"SparseMode {sparse.mode.value!r} needs retrieval heads; pass "
                             "retrieval_heads=RetrievalHeads.load(path) (write one with `pulseio-engine calibrate`)")
        selecting = None if heads is None else heads.heads_for(sparse.mode)
        self.offload, self.sparse, self.scale = offload, sparse, scale
        self.dense = offload.dense_layers
        self.layout = UnitLayout.for_mode(model, offload, torch.empty((), dtype=dtype).element_size())
        num_layers = model.num_layers - self.dense
        device = torch.device(config.device)
        self.on_gpu = offload.recall is RecallMode.ALL_ON_GPU     # no runtime, no host copy, no hot slots
        self.runtime = self.store = self.recaller = None
        if not self.on_gpu:
            self.runtime = pulseio.open_runtime(_runtime_config(offload, self.layout, num_layers, config.device))
            self.store = HostStore(self.runtime.host_pool, self.runtime.device_pool, self.layout,
                                   num_layers=num_layers, max_blocks_per_seq=max_blocks_per_seq,
                                   budget_blocks=sparse.budget_blocks, dtype=dtype, device=device)
            self.recaller = Recaller(self.runtime, offload.recall)
        self.digests = BlockDigests(num_layers=model.num_layers, num_blocks=num_blocks,
                                    num_kv_heads=model.num_kv_heads, head_dim=model.head_dim,
                                    block_size=sparse.block_size, dtype=dtype, device=device, heads=selecting)
        self.model = model
        self.seqs: dict[int, OffloadSeq | None] = {}        # None: an all-on-GPU request holds nothing here
        self.last_selection: dict[int, torch.Tensor] = {}   # layer -> [B, S, K] of the last decode step
        # the digests' top-k; a benchmark on random weights may drive it with a recall-locality model instead
        self.selector: BlockSelector = DigestSelector(self.digests, sparse)

    def footprint(self, context_tokens: int) -> OffloadFootprint:
        """(All-on-GPU: every layer whole on the device, plus the digests; nothing on the host.)"""
        fp = offload_footprint(self.model, self.offload, elem_bytes=self.layout.elem_bytes,
                               context_tokens=context_tokens)
        if self.on_gpu:
            return replace(fp, offload_device_bytes=fp.vanilla_device_bytes + fp.digest_bytes,
                           dense_layer_bytes=fp.vanilla_device_bytes, hot_bytes=0, host_bytes=0)
        return fp

    def open(self, request_id: int, num_tokens: int) -> None:
        """Reserve host units and hot slots for a request of at most `num_tokens` tokens."""
        self.seqs[request_id] = None if self.store is None else self.store.open(num_tokens)

    def close_request(self, request_id: int) -> None:
        seq = self.seqs.pop(request_id, None)
        if seq is not None and self.store is not None:
            self.store.close(seq)

    def store_prefill(self, request_id: int, kv: KVCache, block_ids: torch.Tensor, num_tokens: int) -> None:
        """Copy a prefilled prompt's offloaded layers from the paged cache to the host and digest them.
        block_ids: [>= n_blocks] int64 physical blocks on the cache's device."""
        n = blocks_for(num_tokens, kv.block_size)
        for layer in range(self.dense, kv.num_layers):
            self._store_blocks(request_id, layer, kv.kv[layer][block_ids[:n]], block_ids, num_tokens)

    def load_handoff(self, request_id: int, source: KVSource, kv: KVCache, block_ids: torch.Tensor) -> None:
        """Handed-in KV (disaggregated prefill): the offloaded layers go straight to the host and the
        digests, never through the paged cache (all-on-GPU: the engine has put them there; digests only).
        block_ids: as for `store_prefill`."""
        n = blocks_for(source.num_tokens, kv.block_size)
        for layer in range(self.dense, kv.num_layers):
            blocks = kv.kv[layer][block_ids[:n]] if self.on_gpu else source.layer_blocks(layer, kv)
            self._store_blocks(request_id, layer, blocks, block_ids, source.num_tokens)

    def _store_blocks(self, request_id: int, layer: int, blocks: torch.Tensor, block_ids: torch.Tensor,
                      num_tokens: int) -> None:
        """blocks: [n_blocks, 2, bs, Hkv, D] a request's first blocks of `layer`, whole."""
        bs = blocks.shape[2]
        positions = torch.arange(num_tokens, device=blocks.device)
        slots = block_ids[positions // bs] * bs + positions % bs                # [P]
        seq = self.seqs[request_id]
        if self.store is not None and seq is not None:
            self.store.store_blocks(layer - self.dense, seq, blocks)
        self.digests.update(layer, blocks[:, 0].flatten(0, 1)[:num_tokens], slots)

    def begin_prefill(self, request_ids: Seq[int], state: BatchState) -> None:
        """An offload-only engine's prefill batch: its offloaded layers attend and store through
        `PrefillOffload` (the paged cache has no room for them)."""
        state.sparse = PrefillOffload(self, [self.seqs[r] for r in request_ids], state)

    def begin(self, request_ids: Seq[int], state: BatchState) -> OffloadBatch:
        """The offloaded layers' attention of a decode batch (prepared by the runner, eager)."""
        missing = [r for r in request_ids if r not in self.seqs]
        if missing:
            raise OffloadCapacityError(f"requests {missing} are not offload requests (no host units); "
                                       "add them with add_request(..., offload=True)")
        if self.on_gpu:
            state.sparse = DeviceSparseBatch(self, state)
            return state.sparse
        seqs: list[OffloadSeq] = [self.seqs[r] for r in request_ids]      # type: ignore[misc]
        batch = OffloadBatch(self, state, seqs)
        state.sparse = batch
        return batch

    def end(self, request_ids: Seq[int], batch: OffloadBatch | DeviceSparseBatch) -> None:
        """Keep the batch's residency maps for the requests' next steps."""
        if isinstance(batch, OffloadBatch):
            batch.write_back()

    def statistics(self) -> OffloadStatistics:
        if self.runtime is None or self.store is None:
            return OffloadStatistics(self.layout.unit_bytes, self.layout.heads_per_unit, len(self.seqs), 0, 0, 0, 0)
        rt = self.runtime.statistics()
        return OffloadStatistics(self.layout.unit_bytes, self.layout.heads_per_unit, len(self.seqs),
                                 self.store.units_free, self.store.slots_free, rt.submitted, rt.bytes_moved)

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()


def _runtime_config(offload: OffloadConfig, layout: UnitLayout, num_layers: int, device: str
                    ) -> pulseio.RuntimeConfig:
    """Pools of transfer units: `host_blocks` on the host; on the device every offload request's hot
    sets (+1: slot 0 is never handed out). One recall moves at most a batch's rows x budget units.

    Recalls come once per layer, a fraction of a millisecond apart, so on a GPU the poller spins
    (GIL-free, `poll_spin_iterations`) through that gap before it sleeps, and a resident copier
    generation stays up between layers (`RESIDENT_IDLE_US`, unless `offload.dma` says otherwise), so it
    serves the next layer's recall and the next generation takes over after that recall, not on its
    path. On a CPU the poller sleeps at once: spinning would take a core from the decode it serves."""
    per_seq = num_layers * layout.groups * offload.sparse.budget_blocks
    on_gpu = device.startswith("cuda")
    dma = offload.dma or (pulseio.DmaConfig(resident_idle_us=RESIDENT_IDLE_US) if on_gpu else pulseio.DmaConfig())
    return pulseio.RuntimeConfig(
        device=device, host_blocks=offload.host_blocks, device_slots=offload.max_seqs * per_seq + 1,
        block_bytes=layout.unit_bytes, max_blocks_per_request=offload.max_seqs * per_seq // num_layers,
        spin_iterations=offload.poll_spin_iterations if on_gpu else 1, poll_sleep_s=offload.poll_sleep_s,
        dma=dma)


RESIDENT_IDLE_US = 5000   # longer than a decode step's gap between two layers' recalls, and than most steps


class PrefillOffload:
    """The offloaded layers of a prefill batch in an offload-only engine. Per sequence chunk: its new K/V
    go to the host (through the pool's device view) and the digests; its attention reads earlier
    chunks back from the host, in the same stream order. One loop iteration per sequence, none per block."""

    def __init__(self, owner: Offloader, seqs: list[OffloadSeq], state: BatchState) -> None:
        meta: PrefillAttention = state.attention     # type: ignore[assignment]
        self.owner, self.seqs, self.spans = owner, seqs, meta.spans

    def covers(self, layer: int) -> bool:
        return layer >= self.owner.dense

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        o, li = self.owner, layer - self.owner.dense
        bs, store = o.sparse.block_size, o.store
        out = torch.empty_like(q)
        for seq, span in zip(self.seqs, self.spans, strict=True):
            rows = slice(span.row_start, span.row_start + span.length)
            positions = torch.arange(span.pos_start, span.pos_start + span.length, device=q.device)
            units = seq.host_map[li][:, positions // bs].T                  # [n, S]
            history = store.read(seq, li, span.pos_start)                   # ([p, Hkv, D], [p, Hkv, D])
            store.append(units, positions % bs, k[rows], v[rows])
            o.digests.update(layer, k[rows], span.block_ids[positions // bs] * bs + positions % bs)
            out[rows] = chunk_attention(q[rows], torch.cat([history[0], k[rows]]),
                                        torch.cat([history[1], v[rows]]), span.pos_start, o.scale)
        return out


class _DecodeRows:
    """Where each request of a decode batch stands: its blocks, length and the slot being written."""

    def __init__(self, owner: Offloader, state: BatchState) -> None:
        meta: DecodeAttention = state.attention    # type: ignore[assignment]
        bs = owner.sparse.block_size
        self.owner = owner
        self.block_tables = meta.block_tables.long()                 # [B, NB] physical blocks
        self.num_tokens = meta.context_lens.long()                   # [B], the token being decoded included
        self.block = state.positions // bs                           # [B] logical block being written
        self.offsets = state.positions % bs                          # [B]
        self.slots = self.block_tables.gather(1, self.block[:, None])[:, 0] * bs + self.offsets   # [B]

    def covers(self, layer: int) -> bool:
        return layer >= self.owner.dense


class DeviceSparseBatch(_DecodeRows):
    """The all-on-GPU baseline (Quest as published): the paged cache keeps every block, each offloaded
    layer attends to its selected blocks there. One attention call per selecting row (S <= Hkv)."""

    def __init__(self, owner: Offloader, state: BatchState) -> None:
        super().__init__(owner, state)
        self.kv, self.kv_rows = state.kv, state.kv_rows

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.prepare(layer, q, k, v)
        return self.finish(layer, q, k, v)

    def prepare(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new token, select (nothing to recall: `OffloadBatch.prepare`'s counterpart)."""
        o, kv = self.owner, self.kv
        kv.write(layer, k, v, self.kv_rows)
        o.digests.update(layer, k, self.slots)
        with record_function("offload.select"):
            selected = o.selector(layer, q, self.block_tables, self.num_tokens)     # [B, S, K]
        o.last_selection[layer] = selected

    def write_back(self) -> None:
        """Nothing to keep between steps: the paged cache holds every block."""

    def finish(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention over the layer's selected blocks, in the paged cache."""
        o, kv = self.owner, self.kv
        selected = o.last_selection[layer]
        b, s, kk = selected.shape
        tables = self.block_tables.gather(1, selected.clamp(min=0).view(b, s * kk)).view(b, s, kk).int()
        count = (selected >= 0).sum(2)                                          # [B, S]
        context = ((count - 1) * o.sparse.block_size + self.offsets[:, None] + 1).int()
        hg, gq = kv.num_kv_heads // s, q.shape[1] // s
        out = torch.empty_like(q)
        for row in range(s):
            heads, queries = slice(row * hg, (row + 1) * hg), slice(row * gq, (row + 1) * gq)
            out[:, queries] = paged_decode_attention(q[:, queries], kv.k(layer)[:, :, heads], kv.v(layer)[:, :, heads],
                                                     tables[:, row], context[:, row], o.scale)
        return out


class OffloadBatch(_DecodeRows):
    """Per-step tensors of a decode batch of offload requests (L offloaded layers, S rows, K budget)."""

    def __init__(self, owner: Offloader, state: BatchState, seqs: list[OffloadSeq]) -> None:
        super().__init__(owner, state)
        block = self.block
        self.seqs = seqs
        self._planned: dict[int, tuple[torch.Tensor, RecallPlan]] = {}
        self.host_map = torch.stack([s.host_map for s in seqs])      # [B, L, S, NB]
        self.hot = torch.stack([s.hot for s in seqs])                # [B, L, S, K]
        self.resident = torch.stack([s.resident for s in seqs])      # [B, L, S, NB]
        s = self.host_map.shape[2]
        self.write_units = self.host_map.gather(3, block[:, None, None, None].expand(-1, self.host_map.shape[1],
                                                                                      s, 1))[..., 0]   # [B, L, S]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [B, Hq, D], k, v: [B, Hkv, D] of the tokens being decoded -> attention output [B, Hq, D]."""
        ids, dst, count = self.prepare(layer, q, k, v)
        with record_function("offload.recall"):
            self.owner.recaller.recall(ids, dst, count, tag=layer)
        return self.finish(layer, q, k, v)

    def prepare(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Everything of `attend` before the recall, device work only: store the new token, select,
        plan -> the compacted recall (host units, hot slots, count), for `Recaller.recall`."""
        o, li = self.owner, layer - self.owner.dense
        b, _, s, nb = self.host_map.shape
        kk = o.sparse.budget_blocks
        with record_function("offload.store"):
            o.digests.update(layer, k, self.slots)
            o.store.append(self.write_units[:, li], self.offsets, k, v)
        with record_function("offload.select"):
            selected = o.selector(layer, q, self.block_tables, self.num_tokens)
        o.last_selection[layer] = selected                           # [B, S, K]
        with record_function("offload.plan"):
            rows = selected.reshape(b * s, kk)
            resident = self.resident[:, li].reshape(b * s, nb)
            plan = plan_recall(rows, resident, kk)
            hot = self.hot[:, li].reshape(b * s, kk)                  # [B*S, K] device slots
            units = self.host_map[:, li].reshape(b * s, nb).gather(1, plan.blocks.clamp(min=0))
            self._planned[layer] = (rows, plan)
            return compact(units, hot.gather(1, plan.slots.clamp(min=0)), plan.blocks >= 0)

    def finish(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Everything of `attend` after the recall: residency, the new token into its hot slot, attention."""
        o, li = self.owner, layer - self.owner.dense
        b, _, s, nb = self.host_map.shape
        kk, bs = o.sparse.budget_blocks, o.sparse.block_size
        rows, plan = self._planned.pop(layer)
        with record_function("offload.attention"):
            resident = self.resident[:, li].reshape(b * s, nb)
            self.resident[:, li] = apply_recall(resident, plan).view(b, s, nb)
            hot = self.hot[:, li].reshape(b * s, kk)
            table = hot.gather(1, plan.selected_slots.clamp(min=0))  # [B*S, K] slots, ascending blocks
            count = (rows >= 0).sum(1)                                # [B*S]
            o.store.write_hot(table.gather(1, (count - 1)[:, None]).view(b, s), self.offsets, k, v)
            context = (count - 1) * bs + self.offsets.repeat_interleave(s) + 1
            return hot_attention(q, o.store.hot, table, context, o.scale)

    def write_back(self) -> None:
        """Each request's residency map for its next step (copies, so a graph replay keeps them too)."""
        for i, seq in enumerate(self.seqs):
            seq.resident.copy_(self.resident[i])
