"""One decode step of a fixed batch of offload requests as CUDA graphs, with the recalls captured inside.

Why: an eager offloaded layer is some twenty kernel launches (norms, projections, store, score, select and
plan, attention, MLP) and a recall, so at 40 layers the host, not the GPU, would set the step time. The
step is written as pieces, each ending where a layer's recall is posted:

    piece 0      embed, the dense layers, the first offloaded layer up to its planned recall
    piece i      the previous layer's attention and MLP, the next layer up to its planned recall
    last piece   the last layer's attention and MLP, final norm, logits

How the recalls run between pieces decides how the step is captured:

- no recall (all-on-GPU) or doorbell recalls: the whole step is ONE graph. A doorbell recall is captured
  with its device wait (`pulseio.RecallGraph`: the publish takes its seq on the device, the wait reads it),
  so a replay publishes fresh requests; before each replay the host arms the graph's requests (their
  Completions, one copier generation, the watchdog): a few hundred microseconds a step, nothing per layer.
- sync recalls (the ArkVale-like baseline, ids to the host): one graph per piece, and the recall runs
  eagerly between replays, as the baseline must.

Pieces are captured once per batch (the same requests in the same order) into one memory pool; each reads
the tensors the one before wrote, kept alive by this object. A step uploads token ids, positions, block
tables and context lengths into static buffers (or `advance_nowait` moves them on on the device); slots
are derived inside piece 0. The first step of a batch runs the pieces eagerly (it warms compilation
up), then they are captured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .kv.cache import KVCache
from .model.batch_state import BatchState, DecodeAttention
from .model.llama import CausalLM


class OffloadStepGraph:
    """The captured step of one offload batch (see the module doc)."""

    def __init__(self, model: CausalLM, kv: KVCache, offloader: Any, request_ids: tuple[int, ...],
                 max_blocks: int, *, capture: bool = True) -> None:
        """`capture=False` runs the pieces eagerly every step (a CPU, or a check of the pieces)."""
        dev, b = model.device, len(request_ids)
        self.capture = capture
        self.model, self.kv, self.offloader, self.request_ids = model, kv, offloader, request_ids
        self.batch = offloader.begin(request_ids)     # the batch's state, stacked once; the graph updates it
        self.input_ids = torch.zeros(b, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(b, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros((b, max_blocks), dtype=torch.int32, device=dev)
        self.context_lens = torch.ones(b, dtype=torch.int32, device=dev)
        self.logits: torch.Tensor | None = None
        self._graphs: list[torch.cuda.CUDAGraph] = []
        self._recall_graph: Any = None          # pulseio.RecallGraph when the recalls are captured
        self._recalls: list[tuple[int, tuple[torch.Tensor, ...] | None]] = []   # (layer, compacted recall)
        self._live: list[object] = []                                            # what the pieces share

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
        """Feed each row's greedy token back and move it one position on, on the device (benchmark loop;
        the block tables must already cover the next position)."""
        assert self.logits is not None, "run a step first"
        self.input_ids.copy_(self.logits.argmax(dim=-1))
        self.positions.add_(1)
        self.context_lens.add_(1)

    def run(self) -> torch.Tensor:
        """One decode step -> logits [B, V] fp32 (a static buffer: read it before the next step). Never
        syncs the host once captured, except what a sync recall does."""
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
                graph.replay()
                self._recall(piece)
            logits = self.logits
        assert logits is not None
        return logits

    def _run_eagerly(self) -> None:
        pieces = self._pieces()
        for i, piece in enumerate(pieces):
            piece()
            self._recall(i)

    def _capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        recaller = self.offloader.recaller
        pieces = self._pieces()
        if recaller is None or recaller.captures:
            recalls = None if recaller is None else recaller.recall_graph()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                for i, piece in enumerate(pieces):
                    piece()
                    if recalls is not None and i < len(self._recalls):
                        layer, (ids, dst, count) = self._recalls[i]       # type: ignore[misc]
                        recalls.post(host_ids=ids, device_slots=dst, count=count, tag=layer)
            self._graphs, self._recall_graph = [graph], recalls
            return
        graphs = []
        for piece in pieces:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                piece()
            graphs.append(graph)
        self._graphs = graphs

    def _recall(self, piece: int) -> None:
        if piece < len(self._recalls):
            layer, args = self._recalls[piece]
            if args is not None:
                self.offloader.recaller.recall(*args, tag=layer)

    def _pieces(self) -> list[Callable[[], None]]:
        """The step's pieces as closures; running them in order (with the recalls between) is the step."""
        model, off = self.model, self.offloader
        dense, layers = off.dense, model.config.num_layers
        bs = self.kv.block_size
        shared: dict[str, Any] = {}
        self._recalls = []
        self._live = [shared]

        def first() -> None:
            pos = self.positions
            slots = self.block_tables.long().gather(1, (pos // bs)[:, None])[:, 0] * bs + pos % bs
            state = model.begin(self.input_ids, pos, slots, DecodeAttention(self.block_tables, self.context_lens),
                                self.kv)
            self.batch.start(state)
            for layer in range(dense):
                model.layer_step(state, layer)
            shared.update(state=state, batch=self.batch)
            _begin(dense)

        def _begin(layer: int) -> None:
            state: BatchState = shared["state"]
            q, k, v = model.layer_begin(state, layer)
            shared["qkv"] = (q, k, v)
            args = shared["batch"].prepare(layer, q, k, v)
            self._live.append(args)
            self._recalls.append((layer, args))

        def _finish(layer: int) -> None:
            state: BatchState = shared["state"]
            attn = shared["batch"].finish(layer, *shared["qkv"])
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
