"""ModelRunner: the one class that turns scheduled sequences into device work.

It owns every device tensor of the engine (weights through the model, the KV cache, the decode
graphs' static buffers) and is the only place host lists become device tensors. Prefill runs
eagerly (one sync to read the sampled tokens); decode runs a captured CUDA graph on GPU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from .decode_graph import DecodeGraphs
from .kv.block_table import blocks_for
from .kv.cache import KVCache
from .kv.handoff import KVSource, write_into
from .model.batch_state import BatchState, DecodeAttention, PrefillAttention, PrefillSpan
from .model.llama import CausalLM
from .offload_graph import OffloadStepGraph, StepRiders
from .request import Sequence
from .sampler import sample_tokens
from .scheduler import PrefillChunk
from .upload import to_device_nowait

if TYPE_CHECKING:
    from .offload import Offloader


@dataclass(frozen=True)
class RiderSeqs:
    """Another engine's decode requests riding in an offload step (`ModelRunner.offload_step`): its paged cache,
    its offloader (every block on the GPU) and its sequences, in row order."""

    kv: KVCache
    offloader: Offloader
    seqs: tuple[Sequence, ...]


class ModelRunner:
    def __init__(self, model: CausalLM, kv: KVCache, *, max_batch: int, max_model_len: int,
                 use_cuda_graphs: bool, seed: int = 0) -> None:
        self.model = model
        self.kv = kv
        self.max_blocks_per_seq = blocks_for(max_model_len, kv.block_size)
        self.graphs = DecodeGraphs(model, kv, max_batch=max_batch, max_blocks_per_seq=self.max_blocks_per_seq,
                                   use_graphs=use_cuda_graphs)
        self.generator = torch.Generator(device=model.device).manual_seed(seed)
        self._pin_uploads = model.device.type == "cuda"     # decode inputs staged pinned: the uploads are async
        self._offload_graph: OffloadStepGraph | None = None
        # (size, split, riders' size) -> the step graph of such a batch, the least recently used first
        self._step_graphs: OrderedDict[tuple[int, bool, int], OffloadStepGraph] = OrderedDict()
        # (first half's size, second's, riders') -> the pair of `offload_halves`, the least recently used first
        self._halves: OrderedDict[tuple[int, int, int], tuple[OffloadStepGraph, OffloadStepGraph]] = OrderedDict()
        self.step_graphs_built = 0                   # offload step graphs built (each captured once on a GPU)
        self.offload_pieces = use_cuda_graphs        # offload steps as pieces (captured on a GPU)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def offload_step_graph(self) -> OffloadStepGraph | None:
        """The current offload batch's step (the one the last offload decode ran), or None."""
        return self._offload_graph

    # ---- handoff -------------------------------------------------------------------------------

    def load_kv(self, seq: Sequence, source: KVSource, layers: range | None = None) -> None:
        """Write KV computed elsewhere into the sequence's blocks (`layers`: default, all the cache keeps)."""
        write_into(source, self.kv, self.block_ids(seq, len(seq.block_table)), layers)

    # ---- prefill --------------------------------------------------------------------------------

    def prepare_prefill(self, chunks: Seq[PrefillChunk]) -> BatchState:
        """A batch state for prompt chunks; logits rows are the last token of sampling chunks."""
        bs = self.kv.block_size
        ids, positions, slots, spans, rows = [], [], [], [], []
        row = 0
        for chunk in chunks:
            seq, stop = chunk.seq, chunk.start + chunk.length
            table = _host_ids(seq).astype(np.int64)
            pos = np.arange(chunk.start, stop, dtype=np.int64)
            ids.append(np.asarray(seq.token_ids[chunk.start:stop], dtype=np.int64))
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            spans.append(PrefillSpan(row, chunk.length, chunk.start, self.block_ids(seq, blocks_for(stop, bs))))
            row += chunk.length
            if chunk.samples:
                rows.append(row - 1)
        to_dev = self._to_device
        return self.model.begin(to_dev(np.concatenate(ids)), to_dev(np.concatenate(positions)),
                                to_dev(np.concatenate(slots)), PrefillAttention(tuple(spans)), self.kv,
                                logit_rows=to_dev(np.asarray(rows, dtype=np.int64)))

    def prefill_sync(self, chunks: Seq[PrefillChunk], offloader: Offloader | None = None
                     ) -> tuple[list[int], torch.Tensor]:
        """Run prompt chunks; returns one sampled token per chunk that reaches its prefill's end, and
        those chunks' logits [S, V] fp32. With `offloader` (an offload-only engine), the offloaded
        layers store and attend through it."""
        state = self.prepare_prefill(chunks)
        if offloader is not None:
            offloader.begin_prefill([c.seq.request_id for c in chunks], state)
        logits = self.model.forward(state)                       # [S, V]
        temps = [c.seq.sampling.temperature for c in chunks if c.samples]
        return sample_tokens(logits, temps, self.generator).tolist(), logits

    # ---- decode ---------------------------------------------------------------------------------

    def prepare_decode(self, seqs: Seq[Sequence]) -> BatchState:
        """An eager (unpadded, graph-free) decode batch state: one token per sequence."""
        bs = self.kv.block_size
        pos = np.asarray([s.num_computed for s in seqs], dtype=np.int64)
        tables = self._table_array(seqs, self.max_blocks_per_seq)
        slots = tables[np.arange(len(seqs)), pos // bs].astype(np.int64) * bs + pos % bs
        attention = DecodeAttention(self._to_device(tables), self._to_device((pos + 1).astype(np.int32)))
        ids = np.asarray([s.token_ids[s.num_computed] for s in seqs], dtype=np.int64)
        return self.model.begin(self._to_device(ids), self._to_device(pos), self._to_device(slots),
                                attention, self.kv)

    def decode_sync(self, seqs: Seq[Sequence]) -> tuple[list[int], torch.Tensor]:
        """One decode step for every sequence (each feeds its token at `num_computed`); returns the
        sampled tokens and the logits [B, V] fp32 (a view of the graphs' buffer: read it before the next step)."""
        batch = len(seqs)
        bucket = self.upload_decode(seqs)
        self.graphs.run_nowait(bucket)
        temps = [s.sampling.temperature for s in seqs]
        logits = self.graphs.logits[:batch]
        if any(t > 0 for t in temps):
            return sample_tokens(logits, temps, self.generator).tolist(), logits
        return self.graphs.next_tokens[:batch].tolist(), logits

    def decode_offload_sync(self, seqs: Seq[Sequence], offloader: Offloader) -> tuple[list[int], torch.Tensor]:
        """One decode step of offload requests: their offloaded layers attend to the selected blocks only.
        With graphs on, the step runs as `OffloadStepGraph` pieces around the recalls: captured and
        replayed on a GPU, run eagerly elsewhere (the same work in the same order)."""
        temps = [s.sampling.temperature for s in seqs]
        if self.offload_pieces:
            logits = self.offload_step(seqs, offloader).run()
        else:
            state = self.prepare_decode(seqs)
            offloader.begin([s.request_id for s in seqs]).start(state)
            logits = self.model.forward(state)                    # [B, V]
        tokens = sample_tokens(logits, temps, self.generator).tolist()
        if offloader.recaller is not None:
            offloader.recaller.check_landed()                     # the tokens are on the host: every recall ended
        return tokens, logits

    def offload_step(self, seqs: Seq[Sequence], offloader: Offloader, *, split: bool = False,
                     riders: RiderSeqs | None = None) -> OffloadStepGraph:
        """The batch's step graph with this step's inputs uploaded. A graph serves any batch of its size: the
        requests' state is moved into its rows (`Offloader.rebind`). One is kept per (size, split, riders' size), up
        to `OffloadConfig.kept_step_graphs`; a size not kept is captured anew, and all are once the offloader's seats
        have grown.
        `split`: a step the caller runs piece by piece (`OffloadStepGraph.run_piece`), one graph per piece.
        `riders`: another engine's requests riding in the step after these (`StepRiders`), in `rider_rows` rows,
        padded (`Offloader.padded`) as the halves' are: the logits' rows after the batch's own, the riders' first.
        Two halves of a batch are `offload_halves`'."""
        rids = tuple(s.request_id for s in seqs)
        rider_ids = () if riders is None else \
            riders.offloader.padded([s.request_id for s in riders.seqs], rider_rows(len(riders.seqs)))
        key = (len(rids), split, len(rider_ids))
        graph = _kept(self._step_graphs, key, lambda g: g.stale)
        if graph is not None:
            offloader.rebind(graph.batch, rids)
            if riders is not None:
                riders.offloader.rebind(graph.rider_batch, rider_ids)
        else:
            while len(self._step_graphs) >= offloader.offload.kept_step_graphs:
                self._step_graphs.popitem(last=False)             # its pieces' pool goes before the next capture
            ride = None if riders is None else StepRiders(riders.kv, riders.offloader, rider_ids)
            graph = OffloadStepGraph(self.model, self.kv, offloader, rids, self.max_blocks_per_seq,
                                     capture=self.graphs.use_graphs, split=split, riders=ride)
            self._step_graphs[key] = graph
            self.step_graphs_built += 1
        self._offload_graph = graph
        self._upload(graph, [*seqs, *(() if riders is None else riders.seqs)], len(rids) + len(rider_ids))
        return graph

    def offload_halves(self, first: Seq[Sequence], second: Seq[Sequence], offloader: Offloader,
                       riders: RiderSeqs) -> tuple[OffloadStepGraph, OffloadStepGraph]:
        """An offload batch as two halves (`InnerScheduler.halves`): the split step graphs of `first`, with the
        riders, and of `second`, in the offloader's seats' rows after `first`'s, paired (`OffloadStepGraph.pair`),
        with this step's inputs uploaded. The riders take `rider_rows` rows, padded (`Offloader.padded`), so that
        one pair serves every normal batch up to that size. Pairs are kept by their three sizes, up to
        `OffloadConfig.kept_step_graphs` of them."""
        ids_a, ids_b = tuple(s.request_id for s in first), tuple(s.request_id for s in second)
        rider_ids = riders.offloader.padded([s.request_id for s in riders.seqs], rider_rows(len(riders.seqs)))
        offloader.arrange(ids_a + ids_b)
        key = (len(ids_a), len(ids_b), len(rider_ids))
        pair = _kept(self._halves, key, lambda p: p[0].stale or p[1].stale)
        if pair is not None:
            offloader.rebind(pair[0].batch, ids_a)
            riders.offloader.rebind(pair[0].rider_batch, rider_ids)
            offloader.rebind(pair[1].batch, ids_b)
        else:
            while len(self._halves) >= offloader.offload.kept_step_graphs:
                self._halves.popitem(last=False)
            capture = self.graphs.use_graphs
            a = OffloadStepGraph(self.model, self.kv, offloader, ids_a, self.max_blocks_per_seq, capture=capture,
                                 split=True, riders=StepRiders(riders.kv, riders.offloader, rider_ids))
            b = OffloadStepGraph(self.model, self.kv, offloader, ids_b, self.max_blocks_per_seq, capture=capture,
                                 split=True, first_row=len(ids_a))
            a.pair(b)
            pair = self._halves[key] = (a, b)
            self.step_graphs_built += 2
        self._upload(pair[0], [*first, *riders.seqs], len(ids_a) + len(rider_ids))
        self._upload(pair[1], second)
        return pair

    def _upload(self, graph: OffloadStepGraph, seqs: Seq[Sequence], rows: int | None = None) -> None:
        """A step's inputs for `seqs`, the graph's rows in order; `rows` > len(seqs): padding rows after them
        (token 0 at position 0 of the padding block)."""
        rows = rows or len(seqs)
        pos, ids = np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64)
        pos[:len(seqs)] = [s.num_computed for s in seqs]
        ids[:len(seqs)] = [s.token_ids[s.num_computed] for s in seqs]
        graph.upload(ids, pos, self._table_array(seqs, self.max_blocks_per_seq, rows=rows))

    def decode_nowait(self, seqs: Seq[Sequence],
                      feed: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """One greedy decode step of plain (paged, dense) requests, enqueued; -> their tokens [B] int64 on the
        device (a view of the graphs' buffer: copy it before the next step). Never syncs once captured.
        `feed(input_ids)`: given the step's uploaded [B] input ids on the device, puts in place the ones still on the
        device (tokens of an overlapped round, `DecodeBatch`)."""
        bucket = self.upload_decode(seqs)
        if feed is not None:
            feed(self.graphs.input_ids[:len(seqs)])
        self.graphs.run_nowait(bucket)
        return self.graphs.next_tokens[:len(seqs)]

    def upload_decode(self, seqs: Seq[Sequence]) -> int:
        """Fill the graphs' static inputs for `seqs` (padding the rest of the bucket); returns the bucket. Each
        copy's host side is a fresh block of torch's pinned-memory cache, which takes it back only once the copy
        ran: a step enqueued while earlier ones still wait on the GPU (overlapped rounds) must not rewrite their
        inputs."""
        batch = len(seqs)
        bucket = self.graphs.bucket_for(batch)
        self.graphs.ensure_captured(bucket)
        ids, positions = np.zeros(bucket, dtype=np.int64), np.zeros(bucket, dtype=np.int64)
        ids[:batch] = [s.token_ids[s.num_computed] for s in seqs]
        positions[:batch] = [s.num_computed for s in seqs]
        tables = self._table_array(seqs, self.max_blocks_per_seq, rows=bucket)
        g = self.graphs
        for dst, src in ((g.input_ids, ids), (g.positions, positions), (g.block_tables, tables)):
            staged = torch.from_numpy(src)
            dst[:bucket].copy_(staged.pin_memory() if self._pin_uploads else staged, non_blocking=True)
        return bucket

    # ---- helpers --------------------------------------------------------------------------------

    def _table_array(self, seqs: Seq[Sequence], width: int, rows: int | None = None) -> np.ndarray:
        """[rows, width] int32 block tables, padded with block 0."""
        tables = np.zeros((rows or len(seqs), width), dtype=np.int32)
        for i, seq in enumerate(seqs):
            ids = _host_ids(seq)
            tables[i, :len(ids)] = ids
        return tables

    def block_ids(self, seq: Sequence, n_blocks: int) -> torch.Tensor:
        """[n_blocks] int64 physical blocks of a sequence, on the device."""
        return self._to_device(_host_ids(seq)[:n_blocks].astype(np.int64))

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        return to_device_nowait(torch.from_numpy(array), self.device)


def _host_ids(seq: Sequence) -> np.ndarray:
    """A sequence's physical block ids as a read-only C-int view of its table's packed copy (no per-id work)."""
    return np.frombuffer(seq.block_table.packed(), dtype=np.intc)


K = TypeVar("K")
V = TypeVar("V")
RIDER_ROWS_MIN = 16     # riders' rows in a step: at least this many, then powers of two (`rider_rows`)


def rider_rows(riders: int) -> int:
    """Rows a step with riders gives them: their count rounded up to `RIDER_ROWS_MIN` times a power of two. A step
    (or a pair of halves) is captured per its sizes and rider rows, and a capture costs many decode steps; padding
    rows cost little, since a decode step's GEMMs read their weights whatever their rows."""
    rows = RIDER_ROWS_MIN
    while rows < riders:
        rows *= 2
    return rows


def _kept(kept: OrderedDict[K, V], key: K, stale: Callable[[V], bool]) -> V | None:
    """`kept[key]`, now the most recently used, or None: absent, or stale (its seats grew), when every stale entry
    goes, their pools with them, before the caller builds anew."""
    found = kept.get(key)
    if found is not None and stale(found):
        for k in [k for k, v in kept.items() if stale(v)]:
            del kept[k]
        found = None
    if found is not None:
        kept.move_to_end(key)
    return found
