"""One decode step of a fixed batch of offload requests as CUDA graphs, with the recalls captured inside.

Why: an eager offloaded layer is some twenty kernel launches (norms, projections, store, score, select and
plan, attention, MLP) and a recall, so at 40 layers the host, not the GPU, would set the step time. The
step is written as pieces, each ending where a layer's recall is posted:

    piece 0      embed, the dense layers, the first offloaded layer up to its planned recall
    piece i      the previous layer's attention to its recalled blocks, the merge with its resident part,
                 the MLP; the next layer up to its planned recall
    last piece   the last layer's attention and MLP, final norm, logits

After each piece's recall is posted and before its device wait, the layer attends to its selected blocks
that were resident already (`_resident`), so that part of attention runs while the recall is in flight.
Captured, the publish, the riders' attention and the prediction of a recall ahead are branches of their own
beside that attention (`_post_beside_resident`).

How the recalls run between pieces decides how the step is captured:

- no recall (all-on-GPU) or doorbell recalls: the whole step is ONE graph. A doorbell recall is captured
  with its device wait (`pulseio.RecallGraph`: the publish takes its seq on the device, the wait reads it),
  so a replay publishes fresh requests; before each replay the host arms the graph's requests (their
  Completions, one copier generation, the watchdog): a few hundred microseconds a step, nothing per layer.
- sync recalls (the ArkVale-like baseline, ids to the host): one graph per piece, and the recall runs
  eagerly between replays, as the baseline must.

Split (`split=True`, the serving loop's IRQ): the caller runs the pieces one by one (`run_piece`) and may run
another batch's layers between them; each piece's recall is posted without its device wait (`PendingRecall`),
and the caller waits on the device, or sees it landed on the host, before the next piece. Captured, that is
one graph per piece, a doorbell publish captured at each piece's end (`RecallGraph.post(wait=False)`), one
`arm` before piece 0 and an eager `RecallGraph.wait_device` only for a recall the host has not seen land.

Recall ahead (`OffloadConfig.ahead`): each piece that begins a layer keeps the stream entering it, and after that
layer's recall is posted the next layer's predicted blocks are planned and posted too (`_prefetch`: captured as a
branch of its own, its publish after the layer's own). The next layer's `_begin` waits for that recall on the device
before it selects. A whole step joins the branch there, so the prediction runs under the rest of the layer; a split
step's piece joins it before the piece ends (a graph may not join a branch another graph forked), and the wait is
captured into the next piece's graph (`RecallGraph.wait_device`), so the caller's own landing check stays the layer's
recall. Pieces captured as graphs of their own because their recalls run from the host wait for it before the piece
is replayed (`_wait_ahead`), as no Python runs inside a replay.

Riders (`StepRiders`): rows of another engine whose blocks all stay on the GPU (the serving loop's normal batch)
may ride in the step, after the batch's own rows. They share the step's embedding, projections, norms, MLPs and
logits, so a round reads the weights once for both; each kind of row attends to its own cache: the riders through
their engine's `DeviceSparseBatch` (the paged cache, in place), or paged attention in the dense layers. In an
offloaded layer the riders' store, selection and attention run while the batch's recall flies (`_resident`);
captured, on a branch of their own forked before the batch's selection. Their inputs are uploaded with the
batch's (`upload` takes every row); `logits` holds every row's.

Pieces are captured once per batch (the same requests in the same order) into one memory pool; each reads
the tensors the one before wrote, kept alive by this object. A step uploads token ids, positions, block
tables and context lengths into static buffers (or `advance_nowait` moves them on on the device); slots
are derived inside piece 0. The first step of a batch runs the pieces eagerly (it warms compilation
up), then they are captured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .attention import paged_decode_attention
from .kv.cache import KVCache
from .kv.recall import AHEAD_TAG, PendingRecall
from .model.batch_state import BatchState, DecodeAttention
from .model.llama import CausalLM

CHAIN_PRIORITY = -1     # torch's stream priority of a captured step's chain (see `_Branches`); lower is higher


@dataclass(frozen=True)
class StepRiders:
    """Rows of another engine riding in an offload step (see the module doc): its paged cache and its offloader,
    which must keep every block on the GPU (all-on-GPU sparse attention), and its requests, in row order."""

    kv: KVCache
    offloader: Any
    request_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.offloader.on_gpu:
            raise ValueError("StepRiders need an offloader that keeps every block on the GPU (RecallMode.ALL_ON_GPU): "
                             "a rider's attention cannot wait for a recall")
        if not self.request_ids:
            raise ValueError("StepRiders need at least one request")


@dataclass(frozen=True)
class _Branches:
    """The streams of a step captured with doorbell recalls: the one it is captured on, and the side streams of each
    layer's window (`OffloadStepGraph._post_beside_resident`). Taken together from torch's pools, which hand out the
    32 streams of each priority round-robin, so none is another; torch's shared capture stream, taken apart, could be
    one of them, and a branch on the capturing stream runs in line with it.

    A captured kernel keeps the priority of the stream it was captured on (torch instantiates graphs to honour each
    node's), so the priorities are set here: the chain, the riders and the publishes high (`CHAIN_PRIORITY`), the
    prediction at the default, the lowest. The next layer's prediction has the rest of the layer to finish, so where
    both wait for SMs the block scheduler starts the chain's blocks first."""

    capture: torch.cuda.Stream     # the capturing stream: the step's own chain
    publish: torch.cuda.Stream     # doorbell publishes, in post order
    predict: torch.cuda.Stream     # the next layer's predicted selection (`OffloadConfig.ahead`)
    riders: torch.cuda.Stream      # the riders' store, selection and attention


def _capturing(branches: _Branches | None) -> torch.cuda.Stream | None:
    """The stream to capture a step on: its branches' own, or torch's shared one (None) for a step without."""
    return None if branches is None else branches.capture


class _Rows:
    """One kind of row of a step (the batch's own, or the riders'): rows [start, stop) of every activation, the
    cache they attend to, and their offloaded layers' attention (a `_SparseBatch`)."""

    def __init__(self, start: int, stop: int, kv: KVCache, batch: Any) -> None:
        self.rows, self.kv, self.batch = slice(start, stop), kv, batch

    def start(self, state: BatchState) -> None:
        """Their part of the step's state: positions, cache rows and tables; `batch` starts on it."""
        r, meta = self.rows, state.attention
        assert isinstance(meta, DecodeAttention)
        self.state = BatchState(state.hidden[r], state.positions[r], (state.kv_rows[0][r], state.kv_rows[1][r]),
                                DecodeAttention(meta.block_tables[r], meta.context_lens[r]), self.kv)
        self.batch.start(self.state)

    def attend_paged(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     out: torch.Tensor) -> None:
        """A dense layer: their new token into their paged cache, and attention over it into their rows of `out`."""
        r, meta = self.rows, self.state.attention
        assert isinstance(meta, DecodeAttention)
        self.kv.write(layer, k[r], v[r], self.state.kv_rows)
        paged_decode_attention(q[r], self.kv.k(layer), self.kv.v(layer), meta.block_tables, meta.context_lens,
                               scale, out=out[r])


class OffloadStepGraph:
    """The captured step of one offload batch (see the module doc)."""

    def __init__(self, model: CausalLM, kv: KVCache, offloader: Any, request_ids: tuple[int, ...],
                 max_blocks: int, *, capture: bool = True, split: bool = False,
                 riders: StepRiders | None = None, first_row: int = 0) -> None:
        """`capture=False` runs the pieces eagerly every step (a CPU, or a check of the pieces). `split`: run
        piece by piece (`run_piece`), captured as one graph per piece (see the module doc). `riders`: another
        engine's rows after the batch's own (see the module doc); every buffer below then covers both.
        `first_row`: the batch's requests sit in the offloader's seats from that row (`Offloader.begin`)."""
        b = len(request_ids)
        self.capture, self.split = capture, split
        self.model, self.kv, self.offloader, self.riders = model, kv, offloader, riders
        self.batch = offloader.begin(request_ids, first_row=first_row)   # its seats' rows; the graph updates them
        self.size = b
        self._kinds = [_Rows(0, b, kv, self.batch)]
        if riders is not None:
            if riders.offloader.dense != offloader.dense:
                raise ValueError(f"StepRiders' engine offloads from layer {riders.offloader.dense}, this batch's "
                                 f"from layer {offloader.dense}: their layers must match to share a step")
            self.rider_batch = riders.offloader.begin(riders.request_ids)
            self._kinds.append(_Rows(b, b + len(riders.request_ids), riders.kv, self.rider_batch))
        self._seats = [offloader.seats, *(() if riders is None else (riders.offloader.seats,))]
        self._generations = self._seat_generations()      # of the seats' storage it reads rows of
        dev, rows = model.device, self._kinds[-1].rows.stop
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros((rows, max_blocks), dtype=torch.int32, device=dev)
        self.context_lens = torch.ones(rows, dtype=torch.int32, device=dev)
        self.logits: torch.Tensor | None = None
        self._graphs: list[torch.cuda.CUDAGraph] = []
        self._advance_graph: torch.cuda.CUDAGraph | None = None     # split, captured: `advance_nowait`
        self._recall_graph: Any = None          # pulseio.RecallGraph when the recalls are captured
        self._recalls: list[tuple[int, tuple[torch.Tensor, ...] | None]] = []   # (layer, compacted recall)
        # per piece as `_recalls`: the next layer's recall ahead to plan after it (layer, stream, positions), or None
        self._aheads: list[tuple[int, torch.Tensor, torch.Tensor] | None] = []
        self._live: list[object] = []                                            # what the pieces share
        self._shared: dict[str, Any] = {}                                        # the state pieces pass on
        self._eager: list[Callable[[], None]] = []     # split, before capture: this step's pieces
        self._ran_eagerly = False                      # split: a step ran eagerly, the next one captures
        self._posts: dict[int, int] = {}               # split, captured: piece -> its RecallGraph post
        self._armed: list[Any] = []                    # split, captured: this step's Completions, in post order
        self._follower: OffloadStepGraph | None = None   # halves: the second half, captured with this one (`pair`)
        self._leader: OffloadStepGraph | None = None     # halves: the first half, whose arm covers these posts
        self._pending: PendingRecall | None = None     # split: the last piece's recall
        self._branch_streams: _Branches | None = None   # captured: a layer's side streams (`_post_beside_resident`)

    def _seat_generations(self) -> tuple[int, ...]:
        return tuple(seats.generation for seats in self._seats)

    @property
    def stale(self) -> bool:
        """Whether the seats it reads (its batch's, and its riders') grew since it was built: its rows are old."""
        return self._generations != self._seat_generations()

    @property
    def num_pieces(self) -> int:
        """Pieces of a step: the first (embedding, dense layers, the first offloaded layer to its recall), one
        per further offloaded layer, and the last (the last layer's attention and MLP, the logits)."""
        return self.model.config.num_layers - self.offloader.dense + 1

    @property
    def graphs_per_step(self) -> int:
        """CUDA graph replays per step once captured (1 unless the recalls run on the host)."""
        return len(self._graphs)

    def upload(self, ids: np.ndarray, positions: np.ndarray, tables: np.ndarray) -> None:
        """This step's inputs: [B] token ids and positions, [B, max_blocks] block tables (host arrays)."""
        self.input_ids.copy_(torch.from_numpy(ids), non_blocking=True)
        self.positions.copy_(torch.from_numpy(positions), non_blocking=True)
        self.block_tables.copy_(torch.from_numpy(tables), non_blocking=True)
        self.context_lens.copy_(torch.from_numpy((positions + 1).astype(np.int32)), non_blocking=True)

    def advance_nowait(self) -> None:
        """Feed each row's greedy token back and move it one position on, on the device (the benchmark loop, and
        IRQ's normal batch between its steps of a round; the block tables must already cover the next position).
        A captured split step replays the advance captured with it: its kernels launched for the first time
        inside another batch's step would wait for every running kernel, a copier pinned to a later recall
        included."""
        assert self.logits is not None, "run a step first"
        if self._advance_graph is not None:
            self._advance_graph.replay()
        else:
            self._advance()

    def _advance(self) -> None:
        assert self.logits is not None
        self.input_ids.copy_(self.logits.argmax(dim=-1))
        self.positions.add_(1)
        self.context_lens.add_(1)

    def run(self) -> torch.Tensor:
        """One decode step -> logits [B, V] fp32 (a static buffer: read it before the next step). Never
        syncs the host once captured, except what a sync recall does."""
        if self.split:
            for piece in range(self.num_pieces):
                pending = self.run_piece(piece)
                if pending is not None:
                    pending.wait_device()
            assert self.logits is not None
            return self.logits
        if not self._graphs:
            self._run_eagerly()
            logits = self.logits          # this step's; capturing points self.logits at the graph's buffer,
            if self.capture:              # which holds nothing until the first replay
                self._capture()
        elif self._recall_graph is not None or len(self._graphs) == 1:
            if self._recall_graph is not None:
                self.offloader.recaller.arm(self._recall_graph)
            self._graphs[0].replay()
            logits = self.logits
        else:
            for piece, graph in enumerate(self._graphs):
                self._wait_ahead(piece)                  # in these graphs no piece waits for its recall ahead
                graph.replay()
                self._recall(piece, resident=False)
            logits = self.logits
        assert logits is not None
        return logits

    def run_piece(self, piece: int) -> PendingRecall | None:
        """Split steps: run piece `piece` (0 first, then in order) and post the recall it planned without the
        device wait; -> that recall (None: the piece plans none). Before a piece, the previous piece's recall
        is waited for on the device unless the caller saw it land. After the last piece, `logits` holds the
        step's logits. The first step of a batch runs eagerly; with `capture`, the next one captures at piece 0."""
        if not self.split:
            raise RuntimeError("run_piece needs an OffloadStepGraph built with split=True (this is a bug in "
                               "pulseio_engine)")
        previous, self._pending = self._pending, None
        if piece > 0 and previous is not None and not previous.landed_nowait():
            previous.wait_device()
        if piece == 0:
            self.prepare_split()
            if self._leader is not None and self._graphs:
                self._armed = self._leader._armed                # armed with the first half's piece 0, just before
            elif self._recall_graph is not None:
                self._armed = self.offloader.recaller.arm(self._recall_graph)
        recaller = self.offloader.recaller                      # eager, or captured with recalls the host posts
        host_recalls = not self._graphs or (recaller is not None and not recaller.captures)
        if self._graphs:
            if host_recalls:
                self._wait_ahead(piece)           # no Python runs inside a replay
            self._graphs[piece].replay()          # its resident attention (and publishes, if captured) in it
        else:
            self._eager[piece]()
        self._pending = self._posted(piece)
        if host_recalls:
            self._prefetch(piece, None)
        if not self._graphs:
            self._resident(piece)
        if piece == self.num_pieces - 1 and not self._graphs:
            self._ran_eagerly, self._eager = True, []
        return self._pending

    @property
    def captured(self) -> bool:
        """Whether steps replay captured graphs (False: the next step runs eagerly)."""
        return bool(self._graphs)

    def prepare_split(self) -> None:
        """Before a split step, ahead of any other batch's work: capture the pieces if a step already ran eagerly
        (a capture synchronizes the device, so it must not fall inside another batch's step), or build this
        step's eager pieces. `run_piece(0)` does it itself if not done. Halves (`pair`): the first half captures
        both once both ran a step eagerly; the second half's own call then finds itself captured."""
        if not self._graphs and self._ran_eagerly and self.capture and self._leader is None:
            follower = self._follower
            if follower is None:
                self._capture_split()
            elif follower._ran_eagerly and not follower._graphs:
                self._capture_split(follower)
        if not self._graphs and not self._eager:
            self._eager = self._pieces()

    def pair(self, second: OffloadStepGraph) -> None:
        """Make `second` this split step's second half, both fresh (no step run yet): their pieces replay
        alternating (this one's piece l, then `second`'s), so both are captured together, their publishes into one
        RecallGraph in that order, and this one's arm before its piece 0 numbers both halves' posts as the device
        publishes them."""
        if not (self.split and second.split) or self.num_pieces != second.num_pieces:
            raise ValueError("halves are two split steps of one model: pieces of each replay in turn")
        if self.offloader is not second.offloader:
            raise ValueError("halves are one offloader's batches: one runtime numbers their recalls")
        steps = (self, second)
        if any(g._graphs or g._ran_eagerly or g._eager or g._leader or g._follower for g in steps):
            raise ValueError("halves pair two fresh steps (a step that ran, or is paired, keeps its own capture)")
        self._follower, second._leader = second, self

    def _posted(self, piece: int) -> PendingRecall | None:
        if piece >= len(self._recalls) or self._recalls[piece][1] is None:
            return None
        layer, args = self._recalls[piece]
        if piece not in self._posts:
            return self.offloader.recaller.post(*args, tag=layer)        # type: ignore[misc]
        index, recalls = self._posts[piece], self._recall_graph
        return PendingRecall(self._armed[index], layer, waiter=lambda: recalls.wait_device(index))

    def _capture_split(self, *partners: OffloadStepGraph) -> None:
        """One graph per piece, each step in its own pool; a doorbell recall's publish captured at its piece's end,
        no wait. With `partners` (halves, `pair`): every step's pieces captured in replay order (this one's piece
        l, then each partner's), every publish into one RecallGraph."""
        steps = (self, *partners)
        recaller = self.offloader.recaller
        recalls = recaller.recall_graph() if recaller is not None and recaller.captures else None
        pools = [torch.cuda.graph_pool_handle() for _ in steps]
        branches = [None if recalls is None else step._branches() for step in steps]
        pieces = [step._pieces(b) for step, b in zip(steps, branches, strict=True)]
        graphs: list[list[torch.cuda.CUDAGraph]] = [[] for _ in steps]
        posts: list[dict[int, int]] = [{} for _ in steps]
        for i in range(self.num_pieces):
            for h, step in enumerate(steps):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pools[h], stream=_capturing(branches[h])):
                    pieces[h][i]()
                    index = step._post_beside_resident(recalls, i)   # a recall run from the host comes after the
                    if index is not None:                             # resident attention (safe: it reads no slot
                        posts[h][i] = index                           # a recall writes)
                graphs[h].append(graph)
        for h, step in enumerate(steps):
            advance = torch.cuda.CUDAGraph()
            with torch.cuda.graph(advance, pool=pools[h]):  # after the pieces: logits is the last one's buffer
                step._advance()
            step._graphs, step._posts, step._advance_graph = graphs[h], posts[h], advance
            step._recall_graph = recalls if any(posts) else None

    def _run_eagerly(self) -> None:
        pieces = self._pieces()
        for i, piece in enumerate(pieces):
            piece()
            self._recall(i)

    def _capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        recaller = self.offloader.recaller
        if recaller is None or recaller.captures:
            recalls = None if recaller is None else recaller.recall_graph()
            branches = None if recalls is None else self._branches()
            pieces = self._pieces(branches)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=_capturing(branches)):
                for i, piece in enumerate(pieces):
                    piece()
                    index = self._post_beside_resident(recalls, i)
                    if index is not None:
                        recalls.wait_device(index)                        # type: ignore[union-attr]
            self._graphs, self._recall_graph = [graph], recalls
            return
        graphs = []
        pieces = self._pieces()
        for i, piece in enumerate(pieces):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                piece()
                self._resident(i)         # before the recall, which runs from the host: it reads no slot that writes
            graphs.append(graph)
        self._graphs = graphs

    def _post_beside_resident(self, recalls: Any, piece: int) -> int | None:
        """While capturing, after piece `piece` (which ends with its layer's selection): the layer's window between its
        recall's publish and its device wait, as parallel branches of the graph, each forked from the capturing stream:

            publish stream   the layer's doorbell publish (if it plans a recall and `recalls`, a RecallGraph, is given),
                             then the next layer's recall ahead, once the prediction branch planned it
            predict stream   `OffloadConfig.ahead`: the next layer's predicted selection and plan (`_prefetch`)
            riders' stream   the riders' store and selection (forked in `_begin`, beside the batch's own), then
                             their attention (`_riders`)
            capturing        the batch's attention over its selected blocks already resident

        None of them reads what another writes (the publishes read plans, the attentions no slot a recall writes), so
        none waits for another's kernels or the publishes' PCIe fences. The capturing stream joins the layer's own
        publish and the riders before returning (the device wait and the attention to the recalled blocks come next);
        a whole step joins the recall ahead where it is waited for, in the next layer's `_begin`, so the prediction
        runs under the rest of this layer, and a split step joins it here, its piece's graph ending. The last piece
        (after the last layer) has no window: nothing forks or joins there, as a step captured piece by piece
        (`_capture_split`) must not join a branch stream whose last work was captured into another piece's graph.
        -> the post's index in `recalls` (None: no post)."""
        if piece >= len(self._recalls):
            return None
        planned = recalls is not None and self._recalls[piece][1] is not None
        ahead = recalls is not None and self._aheads[piece] is not None
        main, index = torch.cuda.current_stream(), None
        branches = self._shared["branches"]                 # given with `recalls` (`_pieces`)
        if planned:
            publish = branches.publish
            publish.wait_stream(main)
            layer, (ids, dst, count) = self._recalls[piece]                   # type: ignore[misc]
            with torch.cuda.stream(publish):
                index = recalls.post(host_ids=ids, device_slots=dst, count=count, tag=layer, wait=False)
                published = publish.record_event()
        if ahead:
            self._prefetch(piece, recalls)             # on the predict stream, its publish on the publish stream
        if branches is None or len(self._kinds) == 1:
            self._resident(piece)
        else:                                       # the riders' selection is on their stream already (`_begin`)
            with torch.cuda.stream(branches.riders):
                self._riders(piece, select=False)
            self._attend_resident(piece)
            main.wait_stream(branches.riders)
        if ahead and self.split:            # a piece's graph joins every branch it forked (see `_prefetch`)
            main.wait_stream(branches.publish)
        elif planned:
            main.wait_event(published)
        return index

    def _branches(self) -> _Branches:
        """The streams this step is captured on and branches to (`_Branches`), made before its first capture that posts
        (not inside one)."""
        if self._branch_streams is None:
            dev = self.model.device
            def high() -> torch.cuda.Stream:
                return torch.cuda.Stream(dev, priority=CHAIN_PRIORITY)
            self._branch_streams = _Branches(capture=high(), publish=high(), predict=torch.cuda.Stream(dev),
                                             riders=high())
        return self._branch_streams

    def _recall(self, piece: int, *, resident: bool = True) -> None:
        """Piece `piece`'s recall from the host (`_SparseBatch.recall_around_resident`): while it flies, the next
        layer's recall ahead posted, then (`resident`) the work that reads no slot it writes (`_resident`)."""
        if piece < len(self._recalls):
            layer, args = self._recalls[piece]

            def in_flight() -> None:
                self._prefetch(piece, None)
                if resident:
                    self._resident(piece)
            self._shared["batch"].recall_around_resident(layer, self._shared["own"][0], args, in_flight=in_flight)

    def _prefetch(self, piece: int, recalls: Any) -> None:
        """`OffloadConfig.ahead`, after piece `piece`'s recall: the recall of the next layer's predicted blocks
        (`OffloadBatch.prefetch`), from the stream that piece's `_begin` kept, posted through `recalls` (a
        RecallGraph being captured; None: the recaller, now). Its device wait is left for that layer's `_begin`,
        before its own selection (or, pieces captured apart, for `_wait_ahead` before its piece)."""
        plan = self._aheads[piece] if piece < len(self._aheads) else None
        if plan is None:
            return
        layer, stream, positions = plan
        batch = self._shared["batch"]
        head = None if batch.head is None else batch.head[layer]
        tag = layer | AHEAD_TAG
        if recalls is None:
            ids, dst, count = batch.prefetch(layer, self.model.selection_query(stream, positions, layer, head))
            self._shared["waits"][layer] = self.offloader.recaller.post(ids, dst, count, tag=tag).wait_device
            return
        branches = self._shared["branches"]
        branches.predict.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(branches.predict):
            q = self.model.selection_query(stream, positions, layer, head)
            ids, dst, count = batch.prefetch(layer, q)
        self._live.append(q)      # captured, kept with the graph (eagerly, per replay, it would pile up here)
        branches.publish.wait_stream(branches.predict)          # after the layer's own publish: seqs in post order
        with torch.cuda.stream(branches.publish):
            index = recalls.post(host_ids=ids, device_slots=dst, count=count, tag=tag, wait=False)

        def wait() -> None:     # whole steps join the branches where the recall is waited for; split ones
            if not self.split:  # joined them at their piece's end (`_post_beside_resident`)
                torch.cuda.current_stream().wait_stream(branches.publish)
            recalls.wait_device(index)
        self._shared["waits"][layer] = wait

    def _wait_ahead(self, piece: int) -> None:
        """Before piece `piece` runs as a graph of its own: the device wait of its layer's recall ahead, if posted."""
        if piece < len(self._recalls):
            wait = self._shared["waits"].pop(self._recalls[piece][0], None)
            if wait is not None:
                wait()

    def _resident(self, piece: int) -> None:
        """The layer whose recall piece `piece` posted, between that recall's publish and its device wait: the
        batch's attention over its selected blocks already resident and the riders' whole attention, as none of it
        reads a slot the recall writes."""
        self._attend_resident(piece)
        self._riders(piece)

    def _attend_resident(self, piece: int) -> None:
        """The batch's attention over the selected blocks of piece `piece`'s layer already resident
        (`_SparseBatch.attend_resident`)."""
        if piece < len(self._recalls):
            layer, shared = self._recalls[piece][0], self._shared
            shared["batch"].attend_resident(layer, shared["own"][0])

    def _riders(self, piece: int, *, select: bool = True) -> None:
        """The riders' store and selection (unless `select` is False: done already) and attention to their own cache
        in piece `piece`'s layer, into their rows of the step's attention output (nothing to recall: their blocks
        stay on the GPU)."""
        if piece < len(self._recalls) and len(self._kinds) > 1:
            layer, shared, riders = self._recalls[piece][0], self._shared, self._kinds[1]
            if select:
                self._select_riders(layer)
            riders.batch.finish(layer, *shared["riders"], out=shared["attn"][riders.rows])

    def _select_riders(self, layer: int) -> None:
        """The riders' store and selection in `layer`."""
        self._kinds[1].batch.prepare(layer, *self._shared["riders"])

    def _pieces(self, branches: _Branches | None = None) -> list[Callable[[], None]]:
        """The step's pieces as closures; running them in order (with the recalls between) is the step. `branches`:
        captured with doorbell recalls, each layer's window as branches (`_post_beside_resident`)."""
        model, off = self.model, self.offloader
        dense, layers = off.dense, model.config.num_layers
        bs = self.kv.block_size
        shared: dict[str, Any] = {}
        self._recalls = []
        self._aheads = []
        self._live = [shared]
        self._shared = shared

        kinds = self._kinds
        riding = len(kinds) > 1
        ahead = off.offload.ahead
        shared["waits"] = {}          # layer -> the device wait of its recall ahead, posted during the layer before
        shared["branches"] = branches

        def first() -> None:
            pos = self.positions
            slots = self.block_tables.long().gather(1, (pos // bs)[:, None])[:, 0] * bs + pos % bs
            state = model.begin(self.input_ids, pos, slots, DecodeAttention(self.block_tables, self.context_lens),
                                self.kv)
            if not riding:
                self.batch.start(state)
                for layer in range(dense):
                    model.layer_step(state, layer)
            else:
                for kind in kinds:
                    kind.start(state)
                for layer in range(dense):
                    q, k, v = model.layer_begin(state, layer)
                    attn = torch.empty_like(q)                  # each kind of row attends into its rows of it
                    for kind in kinds:
                        kind.attend_paged(layer, q, k, v, model.scale, attn)
                    model.layer_end(state, layer, attn)
            shared.update(state=state, batch=self.batch)
            _begin(dense)

        def _begin(layer: int) -> None:
            state: BatchState = shared["state"]
            q, k, v = model.layer_begin(state, layer)
            own = (q, k, v) if not riding else tuple(x[kinds[0].rows] for x in (q, k, v))
            shared["own"] = own
            if riding:                              # each kind of row attends into its rows of one output
                rows = kinds[1].rows
                shared["attn"], shared["riders"] = torch.empty_like(q), tuple(x[rows] for x in (q, k, v))
                if branches is not None:            # their selection beside the batch's (joined after its window)
                    branches.riders.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(branches.riders):
                        self._select_riders(layer)
            wait = shared["waits"].pop(layer, None)        # this layer's recall ahead: landed before it selects
            if wait is not None:
                wait()
            args = shared["batch"].prepare(layer, *own)
            self._live.append(args)
            self._recalls.append((layer, args))
            mine = kinds[0].rows                 # the next layer's recall ahead, from the stream entering this one
            self._aheads.append((layer + 1, state.hidden[mine], state.positions[mine])
                                if ahead and layer + 1 < layers else None)

        def _finish(layer: int) -> None:
            state: BatchState = shared["state"]
            if not riding:
                attn = shared["batch"].finish(layer, *shared["own"])
            else:                                               # the riders' rows written by `_resident`
                attn = shared["attn"]
                shared["batch"].finish(layer, *shared["own"], out=attn[kinds[0].rows])
            model.layer_end(state, layer, attn)

        def middle(layer: int) -> Callable[[], None]:
            def piece() -> None:
                _finish(layer - 1)
                _begin(layer)
            return piece

        def last() -> None:
            _finish(layers - 1)
            self.logits = model.end(shared["state"])

        return [first] + [middle(layer) for layer in range(dense + 1, layers)] + [last]
