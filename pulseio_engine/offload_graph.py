"""One decode step of a fixed batch of offload requests as CUDA-graph pieces cut at the recalls.

Why: an eager offloaded layer is some 80 small kernel launches (store, select, plan, compact,
attention) besides the model's own, so at 40 layers the host, not the GPU, sets the step time. A
recall cannot sit inside a graph (a replay would publish a stale request; pulseio refuses
`device_wait` under capture), so the step is cut there:

    piece 0      embed, the dense layers, the first offloaded layer up to its compacted recall
    recall       eager: `Recaller.recall` (post_recall + device wait, or the sync baseline)
    piece i      the previous layer's attention and MLP, the next layer up to its recall
    ...
    last piece   the last layer's attention and MLP, final norm, logits; residency written back

Between pieces the host only posts the recall: a few tens of microseconds per layer. Pieces are
captured once per batch (the same requests in the same order) into one memory pool; each reads the
tensors the one before wrote, kept alive by this object. A step uploads token ids, positions, block
tables and context lengths into static buffers; slots are derived inside piece 0. The first step
of a batch runs the pieces eagerly (it warms compilation up), then they are captured.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .kv.cache import KVCache
from .model.batch_state import BatchState, DecodeAttention
from .model.llama import CausalLM


class OffloadStepGraph:
    """The captured pieces of one offload batch's decode step (see the module doc)."""

    def __init__(self, model: CausalLM, kv: KVCache, offloader: object, request_ids: tuple[int, ...],
                 max_blocks: int, *, capture: bool = True) -> None:
        """`capture=False` runs the pieces eagerly every step (a CPU, or a check of the pieces)."""
        dev, b = model.device, len(request_ids)
        self.capture = capture
        self.model, self.kv, self.offloader, self.request_ids = model, kv, offloader, request_ids
        self.input_ids = torch.zeros(b, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(b, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros((b, max_blocks), dtype=torch.int32, device=dev)
        self.context_lens = torch.ones(b, dtype=torch.int32, device=dev)
        self.logits: torch.Tensor | None = None
        self._graphs: list[torch.cuda.CUDAGraph] = []
        self._recalls: list[tuple[int, tuple[torch.Tensor, ...] | None]] = []   # (layer, compacted recall)
        self._live: list[object] = []                                            # what the pieces share

    def upload(self, ids: np.ndarray, positions: np.ndarray, tables: np.ndarray) -> None:
        """This step's inputs: [B] token ids and positions, [B, max_blocks] block tables (host arrays)."""
        self.input_ids.copy_(torch.from_numpy(ids), non_blocking=True)
        self.positions.copy_(torch.from_numpy(positions), non_blocking=True)
        self.block_tables.copy_(torch.from_numpy(tables), non_blocking=True)
        self.context_lens.copy_(torch.from_numpy((positions + 1).astype(np.int32)), non_blocking=True)

    def run(self) -> torch.Tensor:
        """One decode step -> logits [B, V] fp32 (a static buffer: read it before the next step)."""
        if not self._graphs:
            self._run_eagerly()
            logits = self.logits          # this step's; capturing points self.logits at the graph's buffer,
            if self.capture:              # which holds nothing until the first replay
                self._capture()
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
        pieces = self._pieces()
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
                self.offloader.recaller.recall(*args, tag=layer)      # type: ignore[attr-defined]

    def _pieces(self) -> list[Callable[[], None]]:
        """The step's pieces as closures; running them in order (with the recalls between) is the step."""
        model, off = self.model, self.offloader
        dense, layers = off.dense, model.config.num_layers             # type: ignore[attr-defined]
        bs = self.kv.block_size
        shared: dict[str, object] = {}
        self._recalls = []
        self._live = [shared]

        def first() -> None:
            pos = self.positions
            slots = self.block_tables.long().gather(1, (pos // bs)[:, None])[:, 0] * bs + pos % bs
            state = model.begin(self.input_ids, pos, slots, DecodeAttention(self.block_tables, self.context_lens),
                                self.kv)
            batch = off.begin(self.request_ids, state)                 # type: ignore[attr-defined]
            for layer in range(dense):
                model.layer_step(state, layer)
            shared.update(state=state, batch=batch)
            _begin(dense)

        def _begin(layer: int) -> None:
            state: BatchState = shared["state"]                      # type: ignore[assignment]
            q, k, v = model.layer_begin(state, layer)
            shared["qkv"] = (q, k, v)
            args = shared["batch"].prepare(layer, q, k, v)             # type: ignore[attr-defined]
            self._live.append(args)
            self._recalls.append((layer, args))

        def _finish(layer: int) -> None:
            state: BatchState = shared["state"]                      # type: ignore[assignment]
            attn = shared["batch"].finish(layer, *shared["qkv"])      # type: ignore[attr-defined]
            model.layer_end(state, layer, attn)

        def middle(layer: int) -> Callable[[], None]:
            def piece() -> None:
                _finish(layer - 1)
                _begin(layer)
            return piece

        def last() -> None:
            _finish(layers - 1)
            self.logits = model.end(shared["state"])                 # type: ignore[arg-type]
            shared["batch"].write_back()                              # type: ignore[attr-defined]

        return [first] + [middle(layer) for layer in range(dense + 1, layers)] + [last]
