"""Sparse decode of offloaded layers: full KV in the host pool, a hot set on the device, recall through pulseio.

`Offloader` owns the engine's `pulseio.Runtime`, the `HostStore` over its pools, the block digests, the
`Recaller` and every request's selection state. For a decode batch it returns an `OffloadBatch` (offload
requests) or a `DeviceSparseBatch` (all blocks on the GPU: Quest as published), the model's attention for
every offloaded layer (layers >= dense_layers; the dense layers use the paged cache). One offloaded layer
of one decode step is a few launches, all fixed-shape, no host sync:

    store_tokens(k, v)        the new token's KV to the host copy (or the paged cache), its key into the digest
    score_blocks(q)           Quest bounds of every block, read through the block table
    select_blocks_fused(...)  top-K per selecting row; the recall plan against the hot set (ids, slots, count),
                              the hot set updated, the new token into its hot slot; the attention tables
                              (offload rows: one of the blocks resident already, one of those recalled)
    recall                    pulseio: the publish (captured in the step's CUDA graph), or the sync baseline
    attention                 the paged cache in place (all on the GPU); offload rows: over the resident blocks
                              while the recall is in flight, then its device wait and the recalled blocks, whose
                              launch merges the two parts (`attention.decode_partials`)
    prefetch (`ahead`)        during the layer before: score and plan the layer's blocks from a predicted query,
                              recalled into the hot set before the layer's own selection (`OffloadBatch.prefetch`)

Every request's selection state (residency, hot-slot owners and ages, the previous selection's mask, steering
counters) lives in a row of persistent [L, R, S, ...] tensors (`kv/seats.py`); a batch of B requests is rows
[0, B), moved there by `begin`, so each layer's slice is contiguous, nothing is copied back after a step, and
a step captured for B rows serves any B requests. Benchmarks on random weights set `Offloader.steering`
(`SteeringProfile`): the real scoring and top-K still run, the measured locality steers which ids come out.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

import torch
from torch.profiler import record_function

import pulseio

from .attention import (
    DecodePartials,
    attend_last_part,
    attend_part,
    chunk_attention,
    decode_partials,
    paged_decode_attention,
)
from .config import EngineConfig, GroupScore, OffloadConfig, RecallMode, SparseMode
from .errors import OffloadCapacityError
from .kv.block_table import blocks_for
from .kv.cache import KVCache
from .kv.digests import BlockDigests
from .kv.fused_selection import Arrivals, HotRecall, NewToken, Steering, score_blocks, select_blocks_fused
from .kv.handoff import KVSource
from .kv.host_store import HostStore, OffloadSeq
from .kv.offload_layout import OffloadFootprint, UnitLayout, offload_footprint
from .kv.recall import Recaller
from .kv.retrieval_heads import RetrievalHeads
from .kv.seats import Seats
from .kv.selection import PAD
from .kv.token_store import store_tokens
from .model.batch_state import BatchState, DecodeAttention, PrefillAttention


@dataclass(frozen=True)
class SteeringProfile:
    """A step-to-step locality imposed on the selection (`kv/steering.py`), for benchmarks on random weights:
    `overlap[layer]` of each row's middle blocks stay from the previous step; `seed` seeds its randomness.
    `rewarm[layer]`: of the middle slots not kept, the fraction refilled from blocks the hot set still holds
    (offload batches only: a hot set larger than the budget finds blocks selected earlier, as on real models;
    `LocalityProfile.rewarm_for`); empty: none anywhere (a hot set of one budget holds the last selection only).
    `ahead`: with `OffloadConfig.ahead`, of the middle slots a layer has left after its rewarm, the fraction refilled
    from the blocks its recall ahead brought (`sparse_bench.ahead_hits`)."""

    overlap: tuple[float, ...]     # one fraction in [0, 1] per model layer
    seed: int = 0
    rewarm: tuple[float, ...] = ()  # one fraction in [0, 1] per model layer, or none
    ahead: float = 0.0              # in [0, 1]: of what a layer recalled ahead would still recall, the fraction
                                    # its prediction brought (`OffloadBatch.prefetch`)

    def __post_init__(self) -> None:
        if self.rewarm and len(self.rewarm) != len(self.overlap):
            raise ValueError(f"SteeringProfile.rewarm must have one fraction per layer as overlap does "
                             f"({len(self.overlap)}) or none, got {len(self.rewarm)}")
        if not 0.0 <= self.ahead <= 1.0:
            raise ValueError(f"SteeringProfile.ahead must be a fraction in [0, 1], got {self.ahead!r}")
        bad = [r for r in self.rewarm if not 0.0 <= r <= 1.0]
        if bad:
            raise ValueError(f"SteeringProfile.rewarm must hold fractions in [0, 1], got {bad[0]!r}")

    def rewarm_at(self, layer: int) -> float:
        """`rewarm[layer]`, 0 when there is none."""
        return self.rewarm[layer] if self.rewarm else 0.0


@dataclass
class SelectionState:
    """One request's selection state per offloaded layer (L) and selecting row (S), on the model's device."""

    mask: torch.Tensor       # [L, S, NB] uint8: the blocks selected at the last step
    calls: torch.Tensor      # [L, S] int64: steering's call counters
    selected: torch.Tensor   # [L, S, K] int64: the last step's selection (ids ascending, -1 padded)


@dataclass(frozen=True)
class OffloadStatistics:
    """What the offload path holds and has moved (a snapshot)."""

    unit_bytes: int              # one recalled transfer unit
    unit_heads: int              # KV heads in a unit: Hkv (shared selection) or 1 (head-wise)
    requests: int                # offload requests holding host units now
    host_units_free: int
    hot_slots_free: int
    recalls: int                 # recall requests sent to the runtime (one per offloaded layer and step, and
                                 # with `ahead` one more per offloaded layer after the first)
    bytes_recalled: int
    bytes_ahead: int = 0         # of them, recalled ahead (`ahead`), as far as the steps' ends have seen them land


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
        # the prediction's selection (`OffloadConfig.ahead_budget`): the same rules at its own budget
        self.ahead_sparse = replace(sparse, token_budget=offload.ahead_blocks * sparse.block_size)
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
                                   hot_blocks=offload.hot_blocks, dtype=dtype, device=device)
            self.recaller = Recaller(self.runtime, offload.recall)
        self.digests = BlockDigests(num_layers=model.num_layers, num_blocks=num_blocks,
                                    num_kv_heads=model.num_kv_heads, head_dim=model.head_dim,
                                    block_size=sparse.block_size, dtype=dtype, device=device, heads=selecting)
        self.model = model
        self.device = device
        self.max_blocks = max_blocks_per_seq
        self.rows = self.layout.groups if selecting is None else 1     # S: Hkv for Quest, 1 for SoloHead
        self.seqs: dict[int, OffloadSeq | None] = {}        # None: an all-on-GPU request holds nothing here
        # every request's selection state and maps, in rows: as many as the host store admits (it refuses
        # more), so the rows never move under a captured step; all-on-GPU requests have no such bound (it grows)
        self.seats = Seats(offload.max_seqs if self.store is not None else min(offload.max_seqs, 4))
        self.padding_seats = 0          # all-on-GPU: seats -1, -2, ... of padding rows (`padded`)
        self.last_batch: DeviceSparseBatch | OffloadBatch | None = None
        self.steering: SteeringProfile | None = None        # benchmarks on random weights only

    def footprint(self, context_tokens: int) -> OffloadFootprint:
        """(All-on-GPU: every layer whole on the device, plus the digests; nothing on the host.)"""
        fp = offload_footprint(self.model, self.offload, elem_bytes=self.layout.elem_bytes,
                               context_tokens=context_tokens)
        if self.on_gpu:
            return replace(fp, offload_device_bytes=fp.vanilla_device_bytes + fp.digest_bytes,
                           dense_layer_bytes=fp.vanilla_device_bytes, hot_bytes=0, host_bytes=0)
        return fp

    @property
    def last_selection(self) -> dict[int, torch.Tensor]:
        """layer -> [B, S, K] the last decode batch's selection at that layer (ids ascending, -1 padded)."""
        batch = self.last_batch
        return {} if batch is None else {self.dense + li: batch.selected[li] for li in range(batch.selected.shape[0])}

    def open(self, request_id: int, num_tokens: int) -> None:
        """Reserve host units and hot slots for a request of at most `num_tokens` tokens."""
        self.seqs[request_id] = None if self.store is None else self.store.open(num_tokens)
        parts = self._selection_parts()
        seq = self.seqs[request_id]
        if seq is not None:
            parts.update(host_map=seq.host_map, hot=seq.hot, resident=seq.resident, owner=seq.owner, age=seq.age)
        self.seats.seat(request_id, parts)

    def _selection_parts(self) -> dict[str, torch.Tensor]:
        """A fresh row of selection state (`SelectionState`), by its seats' names."""
        shape = (self.model.num_layers - self.dense, self.rows)
        state = SelectionState(
            torch.zeros((*shape, self.max_blocks), dtype=torch.uint8, device=self.device),
            torch.zeros(shape, dtype=torch.int64, device=self.device),
            torch.full((*shape, self.sparse.budget_blocks), PAD, dtype=torch.int64, device=self.device))
        return {"mask": state.mask, "calls": state.calls, "selected": state.selected}

    def padded(self, request_ids: Seq[int], rows: int) -> tuple[int, ...]:
        """These requests followed by padding seats up to `rows`: a step captured for `rows` rows then serves
        fewer requests, its padding rows selecting in seats of their own (ids -1, -2, ...; an engine's are >= 0)
        and attending the cache's padding block. The first call for `rows` seats at least `rows` - 1 of them, which
        stay, so that fewer requests later do not grow the seats under the steps captured since. All-on-GPU only: a
        padding row has no host units."""
        if not self.on_gpu:
            raise ValueError("padding rows are for an all-on-GPU offloader (RecallMode.ALL_ON_GPU): an offload "
                             "request's row needs host units")
        if len(request_ids) > rows:
            raise ValueError(f"{len(request_ids)} requests do not fit {rows} rows")
        pads = tuple(range(-1, len(request_ids) - rows - 1, -1))
        while self.padding_seats < max(rows - 1, len(pads)):
            self.padding_seats += 1
            self.seats.seat(-self.padding_seats, self._selection_parts())
        return (*request_ids, *pads)

    def close_request(self, request_id: int) -> None:
        seq = self.seqs.pop(request_id, None)
        if request_id in self.seats:
            self.seats.unseat(request_id)
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

    def begin(self, request_ids: Seq[int], *, first_row: int = 0) -> OffloadBatch | DeviceSparseBatch:
        """The offloaded layers' attention of a decode batch of these requests, in this order: their state in
        rows [0, B) (`arrange`), which a CUDA graph of the batch's steps updates in place. Call `start(state)`
        on it for each step. `first_row` > 0: a second batch beside one in rows [0, first_row), whose requests
        the caller has arranged after that batch's (`arrange(first + second)`)."""
        self._seat(request_ids, first_row)
        batch: OffloadBatch | DeviceSparseBatch
        if self.on_gpu:
            batch = DeviceSparseBatch(self, request_ids, first_row)
        else:
            batch = OffloadBatch(self, request_ids, first_row)
        self.last_batch = batch
        return batch

    def rebind(self, batch: OffloadBatch | DeviceSparseBatch, request_ids: Seq[int]) -> None:
        """A batch built by `begin` for as many requests now serves these: their state into its rows."""
        self._seat(request_ids, batch.first_row)
        self.last_batch = batch

    def _seat(self, request_ids: Seq[int], first_row: int) -> None:
        if first_row == 0:
            self.arrange(request_ids)
        elif not self.seats.holds(request_ids, first_row):
            raise ValueError(f"requests {list(request_ids)} are not in rows [{first_row}, "
                             f"{first_row + len(request_ids)}) of the seats: arrange the batch before them and "
                             "these together first (Offloader.arrange)")

    def arrange(self, request_ids: Seq[int]) -> None:
        """Put these requests' state in rows [0, B), in this order: what a batch of B rows (a captured step
        included) then reads and updates. A few gathers when the members changed, nothing otherwise."""
        missing = [r for r in request_ids if r not in self.seqs and not -self.padding_seats <= r < 0]
        if missing:
            raise OffloadCapacityError(f"requests {missing} are not offload requests (no host units); "
                                       "add them with add_request(..., offload=True)")
        self.seats.arrange(request_ids)

    def statistics(self) -> OffloadStatistics:
        if self.runtime is None or self.store is None:
            return OffloadStatistics(self.layout.unit_bytes, self.layout.heads_per_unit, len(self.seqs), 0, 0, 0, 0)
        rt = self.runtime.statistics()
        return OffloadStatistics(self.layout.unit_bytes, self.layout.heads_per_unit, len(self.seqs),
                                 self.store.units_free, self.store.slots_free, rt.submitted, rt.bytes_moved,
                                 0 if self.recaller is None else self.recaller.ahead_bytes)

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()


def _runtime_config(offload: OffloadConfig, layout: UnitLayout, num_layers: int, device: str
                    ) -> pulseio.RuntimeConfig:
    """Pools of transfer units: `host_blocks` on the host; on the device every offload request's hot
    sets, `hot_blocks` per row (+1: slot 0 is never handed out). One recall moves at most a batch's rows x
    budget units (the prediction's budget, `ahead_blocks`, if larger): only selected blocks are recalled, however large
    the hot set.

    Recalls come once per layer (twice with `ahead`: its prefetch), a fraction of a millisecond apart, so on a
    GPU the poller spins (GIL-free, `poll_spin_iterations`) through that gap before it sleeps, and a resident copier
    generation stays up between layers (`RESIDENT_IDLE_US`, unless `offload.dma` says otherwise), so it
    serves the next layer's recall and the next generation takes over after that recall, not on its
    path. While up it holds `RECALL_COPY_CTAS` copy CTAs, which the model's kernels share their SMs with.
    On a CPU the poller sleeps at once: spinning would take a core from the decode it serves."""
    rows = offload.max_seqs * layout.groups       # selecting rows of one layer, every offload request's
    posts = num_layers * (2 if offload.ahead else 1)          # recalls a step: a layer's, and its prefetch
    on_gpu = device.startswith("cuda")
    dma = offload.dma or (pulseio.DmaConfig(zero_copy_ctas=RECALL_COPY_CTAS, resident_idle_us=RESIDENT_IDLE_US)
                          if on_gpu else pulseio.DmaConfig())
    return pulseio.RuntimeConfig(
        device=device, host_blocks=offload.host_blocks, device_slots=num_layers * rows * offload.hot_blocks + 1,
        block_bytes=layout.unit_bytes, max_blocks_per_request=rows * max(offload.sparse.budget_blocks,
                                                                        offload.ahead_blocks),
        ring_slots=max(64, STEPS_AHEAD * posts), max_outstanding=max(1024, 2 * STEPS_AHEAD * posts),
        spin_iterations=offload.poll_spin_iterations if on_gpu else 1, poll_sleep_s=offload.poll_sleep_s,
        dma=dma)


STEPS_AHEAD = 12   # steps of recalls the ring holds: a host enqueueing that far ahead of the GPU never waits for room


RESIDENT_IDLE_US = 5000   # longer than a decode step's gap between two layers' recalls, and than most steps
RECALL_COPY_CTAS = 16     # a layer's scattered recall at ~0.8 of the link; each more CTA costs the model's kernels


class PrefillOffload:
    """The offloaded layers of a prefill batch in an offload-only engine. Per sequence chunk: its new K/V
    go to the host (through the pool's device view) and the digests; its attention reads earlier
    chunks back from the host, in the same stream order. One loop iteration per sequence, none per block."""

    def __init__(self, owner: Offloader, seqs: list[OffloadSeq | None], state: BatchState) -> None:
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
            units = seq.host_map[li][:, positions // bs].T                  # type: ignore[union-attr]  # [n, S]
            history = store.read(seq, li, span.pos_start)                   # type: ignore[arg-type, union-attr]
            store_tokens(store.host_view, units, positions % bs, k[rows], v[rows])   # type: ignore[union-attr]
            o.digests.update(layer, k[rows], span.block_ids[positions // bs] * bs + positions % bs)   # many a block
            out[rows] = chunk_attention(q[rows], torch.cat([history[0], k[rows]]),
                                        torch.cat([history[1], v[rows]]), span.pos_start, o.scale)
        return out


class _SparseBatch:
    """A decode batch's selection (shared by both modes): the state of rows [first_row, first_row + B) of the
    offloader's seats, and the per-step buffers its five launches per layer write (bounds, selection, attention
    table, lengths)."""

    def __init__(self, owner: Offloader, request_ids: Seq[int], first_row: int = 0) -> None:
        o = owner
        b, s, k = len(request_ids), o.rows, o.sparse.budget_blocks
        self.owner, self.first_row = o, first_row
        self.mask = o.seats.batch("mask", b, first_row)                       # [L, B, S, NB] uint8
        self.calls = o.seats.batch("calls", b, first_row)                     # [L, B, S] int64
        self.selected = o.seats.batch("selected", b, first_row)               # [L, B, S, K] int64
        groups = o.model.num_heads // o.model.num_kv_heads
        c = 1 if o.sparse.group_score is GroupScore.SUM else groups
        dev = o.device
        self.bounds = torch.empty((b, s, c, o.max_blocks), dtype=torch.float32, device=dev)
        self.table = torch.zeros((b, s, k), dtype=torch.int32, device=dev)
        self.context_lens = torch.ones((b, s), dtype=torch.int32, device=dev)
        self.head = None if o.digests.heads is None else o.digests.heads   # per layer, or None (every head)

    def start(self, state: BatchState) -> None:
        """This step's rows (graph-safe: derived on the device from the state's metadata); the batch
        becomes the state's attention for the offloaded layers."""
        meta: DecodeAttention = state.attention    # type: ignore[assignment]
        bs = self.owner.sparse.block_size
        self.block_tables = meta.block_tables                       # [B, NB] int32 physical blocks
        self.num_tokens = meta.context_lens                         # [B] int32, the token being decoded included
        self.offsets = state.positions % bs                         # [B] int64
        self.block = state.positions // bs                          # [B] logical block being written
        self.blocks = state.kv_rows[0][:, 0]                        # [B] int64 physical block being written
        state.sparse = self

    def covers(self, layer: int) -> bool:
        return layer >= self.owner.dense

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [B, Hq, D], k, v: [B, Hkv, D] of the tokens being decoded -> attention output [B, Hq, D]."""
        self.recall_around_resident(layer, q, self.prepare(layer, q, k, v))
        return self.finish(layer, q, k, v)

    def recall_around_resident(self, layer: int, q: torch.Tensor,
                               recall: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None, *,
                               in_flight: Callable[[], None] | None = None) -> None:
        """Post `layer`'s recall (None: nothing to bring), then the work that reads no slot it writes while it
        flies (`in_flight`; default: the layer's attention to the blocks already on the GPU), then its device
        wait."""
        pending = None
        if recall is not None:
            with record_function("offload.recall"):
                pending = self.owner.recaller.post(*recall, tag=layer)      # type: ignore[union-attr]
        if in_flight is None:
            self.attend_resident(layer, q)
        else:
            in_flight()
        if pending is not None:
            with record_function("offload.recall"):
                pending.wait_device()

    def prepare(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        raise NotImplementedError

    def attend_resident(self, layer: int, q: torch.Tensor) -> None:
        """After `prepare` and the recall's post, before its device wait: the part of the layer's attention that
        needs no recalled block (none here: the all-on-GPU batch attends in `finish`)."""

    def finish(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's attention output [B, Hq, D], into `out` where given (a step's rows of a larger output)."""
        raise NotImplementedError

    def _select(self, layer: int, q: torch.Tensor, count: torch.Tensor | None = None, **mode: object) -> None:
        """Score (`_score`) and select `layer`'s blocks (PAGED: `block_tables=`, HOT: `hot=`)."""
        o, li = self.owner, layer - self.owner.dense
        with record_function("offload.select"):
            self._score(layer, q, count)
            steer = None if o.steering is None else self._steering(o.steering, layer)
            select_blocks_fused(self.bounds, self.num_tokens, o.sparse, mask=self.mask[li], table=self.table,
                                context_lens=self.context_lens, steer=steer, out=self.selected[li],
                                **mode)       # type: ignore[arg-type]

    def _score(self, layer: int, q: torch.Tensor, count: torch.Tensor | None, *, narrowed: bool = False) -> None:
        """`layer`'s Quest bounds into `bounds`. q: [B, Hq, D], or (`narrowed`) only the selecting head's query group
        ([B, G, D], `CausalLM.selection_query`) where one head selects, which the score then reads as head 0 of 1."""
        o = self.owner
        head = None if self.head is None else self.head[layer]
        heads = o.model.num_kv_heads
        if narrowed and head is not None:
            head, heads = 0, 1
        score_blocks(q, o.digests.max[layer], o.digests.min[layer], self.block_tables, num_kv_heads=heads, head=head,
                     rule=o.sparse.group_score, count=count, out=self.bounds)

    def _steering(self, profile: SteeringProfile, layer: int) -> Steering:
        """`layer`'s steering: the profile's overlap (no rewarm: all blocks on the GPU, no hot set)."""
        return Steering(profile.overlap[layer], self.calls[layer - self.owner.dense], seed=profile.seed, layer=layer)


class DeviceSparseBatch(_SparseBatch):
    """The all-on-GPU baseline (Quest as published, or SoloHead): the paged cache keeps every block, each
    offloaded layer attends to its selected blocks there, in place (row tables: one launch for every row)."""

    def start(self, state: BatchState) -> None:
        super().start(state)
        self.kv, self.kv_rows = state.kv, state.kv_rows

    def prepare(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new token (and its key into the digest), select: nothing to recall."""
        with record_function("offload.store"):
            self.kv.write(layer, k, v, self.kv_rows, digests=self.owner.digests)
        self._select(layer, q, block_tables=self.block_tables)
        return None

    def finish(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Attention over the layer's selected blocks, in the paged cache."""
        with record_function("offload.attention"):
            return paged_decode_attention(q, self.kv.k(layer), self.kv.v(layer), self.table, self.context_lens,
                                          self.owner.scale, out=out, num_kv_heads=self.owner.model.num_kv_heads)


class _Prefetch:
    """`OffloadBatch.prefetch`'s buffers: scratch for the parts of a selection a prediction must not keep (mask,
    table, steering counters, ...) and its own recall, for a batch's rows (S selecting rows, NBW mask columns)."""

    def __init__(self, rows: torch.Size, budget: int, device: torch.device) -> None:
        b, s, nbw = rows
        self.mask = torch.zeros((b, s, nbw), dtype=torch.uint8, device=device)
        self.calls = torch.zeros((b, s), dtype=torch.int64, device=device)
        self.table = torch.zeros((b, s, budget), dtype=torch.int32, device=device)
        self.context_lens = torch.zeros((b, s), dtype=torch.int32, device=device)
        self.selected = torch.zeros((b, s, budget), dtype=torch.int64, device=device)
        self.write_slot = torch.zeros((b, s), dtype=torch.int64, device=device)
        self.ids = torch.zeros(b * s * budget, dtype=torch.int64, device=device)
        self.dst = torch.zeros(b * s * budget, dtype=torch.int64, device=device)
        self.count = torch.zeros(1, dtype=torch.int64, device=device)


class OffloadBatch(_SparseBatch):
    """A decode batch of offload requests: full KV on the host, each row's hot set on the device."""

    def __init__(self, owner: Offloader, request_ids: Seq[int], first_row: int = 0) -> None:
        super().__init__(owner, request_ids, first_row)
        seats, r = owner.seats, first_row
        b, s, k = len(request_ids), owner.rows, owner.sparse.budget_blocks
        self.host_map = seats.batch("host_map", b, r)           # [L, B, S, NB] host unit of each block
        self.hot = seats.batch("hot", b, r)                     # [L, B, S, H] device slot of each hot entry
        self.resident = seats.batch("resident", b, r)           # [L, B, S, NB] hot entry of each block, or -1
        self.owners = seats.batch("owner", b, r)                # [L, B, S, H] block in each hot entry, or -1
        self.ages = seats.batch("age", b, r)                    # [L, B, S, H] int32 calls since each was selected
        dev = owner.device
        self.recall_ids = torch.zeros(b * s * k, dtype=torch.int64, device=dev)    # [B*S*K] host units
        self.recall_dst = torch.zeros(b * s * k, dtype=torch.int64, device=dev)    # [B*S*K] device slots
        self.count = torch.zeros(1, dtype=torch.int64, device=dev)                 # [1] pairs to recall
        self.write_slot = torch.zeros((b, s), dtype=torch.int64, device=dev)
        self.arrivals = Arrivals(torch.zeros((b, s, k), dtype=torch.int32, device=dev),    # the recalled blocks'
                                 torch.zeros((b, s), dtype=torch.int32, device=dev))       # table (`table`: the rest)
        self.partials: DecodePartials | None = None     # the attention's two parts, built by the first step
        self.ahead = _Prefetch(self.mask.shape[1:], owner.offload.ahead_blocks, dev) if owner.offload.ahead else None

    def start(self, state: BatchState) -> None:
        super().start(state)
        length, b, s, _ = self.host_map.shape
        at = self.block[None, :, None, None].expand(length, b, s, 1)
        self.write_units = self.host_map.gather(3, at)[..., 0]       # [L, B, S] host unit being written

    def prepare(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Everything of `attend` before the recall, device work only: the new token to the host (and its key
        into the digest), select and plan -> the recall (host units, hot slots, count) for `Recaller.recall`."""
        o = self.owner
        store = o.store
        assert store is not None
        with record_function("offload.store"):
            store_tokens(store.host_view, self.write_units[layer - o.dense], self.offsets, k, v, digests=o.digests,
                         layer=layer, digest_blocks=self.blocks)
        self._select(layer, q, count=self.count, hot=self._hot_recall(layer, NewToken(k, v, store.hot)))
        return self.recall_ids, self.recall_dst, self.count

    def _hot_recall(self, layer: int, new_token: NewToken | None, prediction: _Prefetch | None = None) -> HotRecall:
        """`layer`'s hot set and the step's recall buffers (or a `prediction`'s, which splits no table), as a selection
        plans against them."""
        li = layer - self.owner.dense
        if prediction is None:
            ids, dst, count, slot, arrivals = (self.recall_ids, self.recall_dst, self.count, self.write_slot,
                                               self.arrivals)
        else:
            p = prediction
            ids, dst, count, slot, arrivals = p.ids, p.dst, p.count, p.write_slot, None
        return HotRecall(resident=self.resident[li], owner=self.owners[li], hot=self.hot[li], age=self.ages[li],
                         host_map=self.host_map[li], recall_ids=ids, recall_dst=dst, count=count, write_slot=slot,
                         new_token=new_token, arrivals=arrivals)

    def _steering(self, profile: SteeringProfile, layer: int) -> Steering:
        """`layer`'s steering, with the profile's rewarm: refills from the hot set's blocks not selected last step.
        A layer recalled ahead (`prefetch`) refills `profile.ahead` of the rest from the blocks its prediction
        brought (`kv/steering.py`)."""
        steer = replace(super()._steering(profile, layer), rewarm=profile.rewarm_at(layer))
        if self.ahead is None or layer == self.owner.dense:            # (the first offloaded layer has none)
            return steer
        return replace(steer, ahead=profile.ahead, prefetched=self.ahead.mask)

    def prefetch(self, layer: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`OffloadConfig.ahead`, run during the layer before `layer`: select `layer`'s blocks from q, the queries
        its weights make of an earlier stream (`CausalLM.selection_query` of the selecting heads), and plan them
        against its hot set as a selection does (the hot set and its ages updated; no table, no new token) -> the
        recall (host units, hot slots, count). Its selection state stays as it was: the prediction's selection and
        steering counters go to scratch copies. `layer`'s own selection must come after this recall landed (its
        new token goes into a slot this recall may write). Steered (random weights), the prediction keeps the
        previous selection as the step will and takes the rest by its own scores, never refilling from the hot set:
        a refill drawn as the step's own is would be a subset of the step's (the same draws), and hand the step
        hits that no prediction made (`kv/steering.py`'s ahead class credits those)."""
        o, li, p = self.owner, layer - self.owner.dense, self.ahead
        assert p is not None, "prefetch needs OffloadConfig.ahead"
        hot = self._hot_recall(layer, None, p)
        with record_function("offload.prefetch"):
            self._score(layer, q, p.count, narrowed=True)      # q holds the selecting head's group only
            steer = None
            if o.steering is not None:                # reads the previous selection and bumps the counters
                p.mask.copy_(self.mask[li])
                p.calls.copy_(self.calls[li])
                steer = Steering(o.steering.overlap[layer], p.calls, seed=o.steering.seed, layer=layer)
            select_blocks_fused(self.bounds, self.num_tokens, o.ahead_sparse, mask=p.mask, table=p.table,
                                context_lens=p.context_lens, steer=steer, out=p.selected, hot=hot)
        return p.ids, p.dst, p.count

    def attend_resident(self, layer: int, q: torch.Tensor) -> None:
        """Attention over the selected blocks that were resident already: it reads no slot the recall writes,
        so it runs while the recall is in flight."""
        hot = self.owner.store.hot                                             # type: ignore[union-attr]
        heads = self.owner.model.num_kv_heads
        if self.partials is None:
            self.partials = decode_partials(q, hot[:, 0], self.table.shape[2], 2, num_kv_heads=heads)
        with record_function("offload.attention"):
            attend_part(self.partials, 0, q, hot[:, 0], hot[:, 1], self.table, self.context_lens, self.owner.scale,
                        num_kv_heads=heads)

    def finish(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Everything of `attend` after the recall: attention over the recalled blocks, merged with the resident
        blocks' part in the same launch."""
        hot = self.owner.store.hot                                             # type: ignore[union-attr]
        assert self.partials is not None, "attend_resident runs before finish"
        with record_function("offload.attention"):
            return attend_last_part(self.partials, q, hot[:, 0], hot[:, 1], self.arrivals.table,
                                    self.arrivals.context_lens, self.owner.scale,
                                    torch.empty_like(q) if out is None else out,
                                    num_kv_heads=self.owner.model.num_kv_heads)
