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
from dataclasses import dataclass

import torch

import pulseio

from .attention import paged_decode_attention
from .config import EngineConfig, OffloadConfig, SparseMode
from .errors import OffloadCapacityError
from .kv.block_table import blocks_for
from .kv.cache import KVCache
from .kv.digests import BlockDigests
from .kv.host_store import HostStore, OffloadSeq
from .kv.offload_layout import OffloadFootprint, UnitLayout, offload_footprint
from .kv.recall import Recaller
from .kv.residency import apply_recall, plan_recall
from .kv.retrieval_heads import RetrievalHeads
from .kv.selection import select_for_layer
from .model.batch_state import BatchState, DecodeAttention


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
        self.runtime = pulseio.open_runtime(_runtime_config(offload, self.layout, num_layers, config.device))
        device = torch.device(config.device)
        self.store = HostStore(self.runtime.host_pool, self.runtime.device_pool, self.layout,
                               num_layers=num_layers, max_blocks_per_seq=max_blocks_per_seq,
                               budget_blocks=sparse.budget_blocks, dtype=dtype, device=device)
        self.digests = BlockDigests(num_layers=model.num_layers, num_blocks=num_blocks,
                                    num_kv_heads=model.num_kv_heads, head_dim=model.head_dim,
                                    block_size=sparse.block_size, dtype=dtype, device=device, heads=selecting)
        self.recaller = Recaller(self.runtime, offload.recall)
        self.model = model
        self.seqs: dict[int, OffloadSeq] = {}
        self.last_selection: dict[int, torch.Tensor] = {}   # layer -> [B, S, K] of the last decode step

    def footprint(self, context_tokens: int) -> OffloadFootprint:
        return offload_footprint(self.model, self.offload, elem_bytes=self.layout.elem_bytes,
                                 context_tokens=context_tokens)

    def open(self, request_id: int, num_tokens: int) -> None:
        """Reserve host units and hot slots for a request of at most `num_tokens` tokens."""
        self.seqs[request_id] = self.store.open(num_tokens)

    def close_request(self, request_id: int) -> None:
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.store.close(seq)

    def store_prefill(self, request_id: int, kv: KVCache, block_ids: torch.Tensor, num_tokens: int) -> None:
        """Copy a prefilled prompt's offloaded layers to the host and digest them.
        block_ids: [>= n_blocks] int64 physical blocks on the cache's device."""
        seq, bs = self.seqs[request_id], kv.block_size
        n = blocks_for(num_tokens, bs)
        positions = torch.arange(num_tokens, device=kv.device)
        slots = block_ids[positions // bs] * bs + positions % bs                # [P]
        for layer in range(self.dense, kv.num_layers):
            self.store.store_blocks(layer - self.dense, seq, kv.kv[layer][block_ids[:n]])
            self.digests.update(layer, kv.gather(layer, block_ids, num_tokens)[0], slots)

    def begin(self, request_ids: Seq[int], state: BatchState) -> OffloadBatch:
        """The offloaded layers' attention of a decode batch (prepared by the runner, eager)."""
        missing = [r for r in request_ids if r not in self.seqs]
        if missing:
            raise OffloadCapacityError(f"requests {missing} are not offload requests (no host units); "
                                       "add them with add_request(..., offload=True)")
        seqs = [self.seqs[r] for r in request_ids]
        batch = OffloadBatch(self, state, seqs)
        state.sparse = batch
        return batch

    def end(self, request_ids: Seq[int], batch: OffloadBatch) -> None:
        """Keep the batch's residency maps for the requests' next steps."""
        for i, rid in enumerate(request_ids):
            self.seqs[rid].resident = batch.resident[i]

    def statistics(self) -> OffloadStatistics:
        rt = self.runtime.statistics()
        return OffloadStatistics(self.layout.unit_bytes, self.layout.heads_per_unit, len(self.seqs),
                                 self.store.units_free, self.store.slots_free, rt.submitted, rt.bytes_moved)

    def close(self) -> None:
        self.runtime.close()


def _runtime_config(offload: OffloadConfig, layout: UnitLayout, num_layers: int, device: str
                    ) -> pulseio.RuntimeConfig:
    """Pools of transfer units: `host_blocks` on the host; on the device every offload request's hot
    sets (+1: slot 0 is never handed out). One recall moves at most a batch's rows x budget units."""
    per_seq = num_layers * layout.groups * offload.sparse.budget_blocks
    return pulseio.RuntimeConfig(
        device=device, host_blocks=offload.host_blocks, device_slots=offload.max_seqs * per_seq + 1,
        block_bytes=layout.unit_bytes, max_blocks_per_request=offload.max_seqs * per_seq // num_layers,
        spin_iterations=1, poll_sleep_s=offload.poll_sleep_s)


class OffloadBatch:
    """Per-step tensors of a decode batch of offload requests (L offloaded layers, S rows, K budget)."""

    def __init__(self, owner: Offloader, state: BatchState, seqs: list[OffloadSeq]) -> None:
        meta: DecodeAttention = state.attention    # type: ignore[assignment]
        bs = owner.sparse.block_size
        self.owner = owner
        self.block_tables = meta.block_tables.long()                 # [B, NB] physical blocks
        self.num_tokens = meta.context_lens.long()                   # [B], the token being decoded included
        block = state.positions // bs                                # [B] logical block being written
        self.offsets = state.positions % bs                          # [B]
        self.slots = self.block_tables.gather(1, block[:, None])[:, 0] * bs + self.offsets   # [B]
        self.host_map = torch.stack([s.host_map for s in seqs])      # [B, L, S, NB]
        self.hot = torch.stack([s.hot for s in seqs])                # [B, L, S, K]
        self.resident = torch.stack([s.resident for s in seqs])      # [B, L, S, NB]
        s = self.host_map.shape[2]
        self.write_units = self.host_map.gather(3, block[:, None, None, None].expand(-1, self.host_map.shape[1],
                                                                                      s, 1))[..., 0]   # [B, L, S]

    def covers(self, layer: int) -> bool:
        return layer >= self.owner.dense

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [B, Hq, D], k, v: [B, Hkv, D] of the tokens being decoded -> attention output [B, Hq, D]."""
        o, li = self.owner, layer - self.owner.dense
        b, _, s, nb = self.host_map.shape
        kk, bs = o.sparse.budget_blocks, o.sparse.block_size
        o.digests.update(layer, k, self.slots)
        o.store.append(self.write_units[:, li], self.offsets, k, v)
        selected = select_for_layer(o.digests, layer, q, self.block_tables, self.num_tokens, o.sparse)
        o.last_selection[layer] = selected                           # [B, S, K]
        rows = selected.reshape(b * s, kk)
        resident = self.resident[:, li].reshape(b * s, nb)
        plan = plan_recall(rows, resident, kk)
        hot = self.hot[:, li].reshape(b * s, kk)                      # [B*S, K] device slots
        o.recaller.recall(self.host_map[:, li].reshape(b * s, nb).gather(1, plan.blocks.clamp(min=0)),
                          hot.gather(1, plan.slots.clamp(min=0)), plan.blocks >= 0, tag=layer)
        self.resident[:, li] = apply_recall(resident, plan).view(b, s, nb)
        table = hot.gather(1, plan.selected_slots.clamp(min=0))      # [B*S, K] slots, ascending blocks
        count = (rows >= 0).sum(1)                                    # [B*S]
        o.store.write_hot(table.gather(1, (count - 1)[:, None]).view(b, s), self.offsets, k, v)
        context = (count - 1) * bs + self.offsets.repeat_interleave(s) + 1
        return hot_attention(q, o.store.hot, table, context, o.scale)
