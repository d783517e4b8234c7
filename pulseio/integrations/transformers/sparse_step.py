"""The device work of one offloaded layer in one decode step, in two fixed-shape halves around the recall:

    before()    Quest bounds of q against the layer's digests over all NB block columns (those past the
                context masked), sink + local + top-k, HotSet.plan -> (host ids, device slots, count)
    [eager]     Runtime.post_recall(count=) and device_wait: a publish kernel, a copier, a wait kernel
    after()     the new token into its block's hot slot, into the host pool (through the pool's device view)
                and into its block's digest; the selected blocks gathered in position order into one buffer
                [2, B, Hkv, K x bs, D] that every layer shares (the attention reads its prefix)

The new token reaches the host pool and the digests after the selection: the block it is written to is the
last one, always selected (local), so its digest decides nothing this step, and its hot slot gets the token
after the recall landed. Every later recall is published after this step's `after`, in stream order.

Why two halves and fixed shapes: around transformers' eager model code a decode step is bound by the host's
kernel launches, and the ~110 small ops a sparse layer adds would cost more than the dense layer they
replace. So the context length is a device scalar (`StepInputs.num_blocks`, filled once a step, like the
query and the new token), nothing in a half depends on a host value, and on a GPU each half is captured into
a CUDA graph at a layer's second decode step: one launch instead of dozens. Its first step runs eagerly; so
does everything off CUDA (the code CI tests is the code a graph captures), and everything after a capture
that failed (logged once, with the error). Capturing synchronizes the device (torch.cuda.graph does, before
each capture): the one host sync of the decode path, on the second step only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .cache_base import KVGeometry
from .hot_set import HotSet, RecallPlan
from .selection import block_scores, select_blocks
from .sparse_layout import SparseLayout

log = logging.getLogger(__name__)


@dataclass
class StepInputs:
    """Static tensors a step's halves read, filled before each layer (shared by the layers: stream order).

    q: [B, Hq, D] the layer's query; k, v: [B, Hkv, D] the new token's key and value; num_blocks, block: []
    int64, blocks in the context and the new token's block; offset: [1] int64, the token's offset in its block
    (one-dimensional: torch reads a 0-dim integer tensor used as an index on the host, a sync)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    num_blocks: torch.Tensor
    block: torch.Tensor
    offset: torch.Tensor

    @classmethod
    def allocate(cls, g: KVGeometry) -> StepInputs:
        def empty(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=g.dtype, device=g.device)

        def index(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int64, device=g.device)

        return cls(q=empty(g.batch_size, g.num_heads, g.head_dim), k=empty(g.batch_size, g.num_kv_heads, g.head_dim),
                   v=empty(g.batch_size, g.num_kv_heads, g.head_dim), num_blocks=index(), block=index(),
                   offset=index(1))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.q, self.k, self.v, self.num_blocks, self.block, self.offset)


@dataclass(frozen=True)
class LayerTensors:
    """What the halves of one offloaded layer read and write besides the step's inputs."""

    dmax: torch.Tensor  # [B, S, NB, D] the layer's digests
    dmin: torch.Tensor
    hot: HotSet
    head: int | None  # SoloHead's selecting KV head, None for Quest


@dataclass(frozen=True)
class Pools:
    """The pools as units [n, 2, hpu, bs, D]: `host` the host pool's device view (writes), `device` the hot
    slots; `gathered` [2, B, Hkv, K x bs, D], where a layer's selected blocks are gathered."""

    host: torch.Tensor
    device: torch.Tensor
    gathered: torch.Tensor

    @classmethod
    def of(cls, host: torch.Tensor, device: torch.Tensor, g: KVGeometry, lay: SparseLayout) -> Pools:
        gathered = torch.empty((2, g.batch_size, g.num_kv_heads, lay.budget * lay.block_size, g.head_dim),
                               dtype=g.dtype, device=g.device)
        return cls(host, device, gathered)


class LayerStep:
    """The two halves of one offloaded layer (see the module doc), each graphed on a GPU."""

    def __init__(self, layer: LayerTensors, inputs: StepInputs, pools: Pools, *, budget: int, sink: int,
                 local: int, graphs: Graphs | None) -> None:
        self.layer, self.inputs, self.pools = layer, inputs, pools
        self.budget, self.sink, self.local = budget, sink, local
        self.before = _Graphed(self._before, graphs)
        self.after = _Graphed(self._after, graphs)

    def _before(self) -> RecallPlan:
        """The selection and the recall it needs (the hot set's residency updated as if it had landed)."""
        lay, x = self.layer, self.inputs
        scores = block_scores(x.q, x.k.shape[1], lay.head, lay.dmax, lay.dmin)             # [B, S, NB]
        selected = select_blocks(scores, self.budget, sink=self.sink, local=self.local,
                                 num_blocks=x.num_blocks)                                  # [B, S, K]
        return lay.hot.plan(selected.view(-1, self.budget))

    def _after(self, plan: RecallPlan) -> None:
        """After the recall landed: the new token into its hot slot, the host pool and its digest; then the
        selected blocks gathered."""
        hot, x, pools = self.layer.hot, self.inputs, self.pools
        rows = hot.unit0.shape[0]
        b, hkv, d = x.k.shape
        hpu, bs = pools.device.shape[2], pools.device.shape[3]
        kv = torch.stack([x.k, x.v], 1).view(b, 2, rows // b, hpu, d).transpose(1, 2).reshape(rows, 2, hpu, d)
        block = x.block.view(1, 1).expand(rows, 1)
        pools.device[hot.slot0[:, 0] + hot.where.gather(1, block)[:, 0], :, :, x.offset] = kv    # [R] x [1]
        pools.host[hot.unit0[:, 0] + x.block, :, :, x.offset] = kv
        self._fold_digest()
        units = pools.device.index_select(0, plan.slots.view(-1))                          # [R * K, 2, hpu, bs, D]
        s = rows // b
        pools.gathered.view(2, b, s, hpu, self.budget, bs, d).copy_(
            units.view(b, s, self.budget, 2, hpu, bs, d).permute(3, 0, 1, 4, 2, 5, 6))

    def _fold_digest(self) -> None:
        """The new key into its block's digest: the key itself at the block's first token, else max / min."""
        lay, x = self.layer, self.inputs
        k = x.k if lay.head is None else x.k[:, lay.head:lay.head + 1]                       # [B, S, D]
        at = x.block.view(1)
        for digest, fold in ((lay.dmax, torch.maximum), (lay.dmin, torch.minimum)):
            old = digest.index_select(2, at)[:, :, 0]                                        # [B, S, D]
            digest.index_copy_(2, at, torch.where(x.offset == 0, k, fold(old, k))[:, :, None])


@dataclass
class Graphs:
    """CUDA graph capture shared by a cache's layers: one memory pool (the layers replay in the order they
    were captured, which is what sharing a pool needs), and what the captures took from the allocator."""

    device: torch.device
    pool: Any = None
    captured: int = 0  # halves replayed from a graph
    bytes: int = 0  # allocator growth during the captures (the graphs' pool)
    failed: str | None = None  # why capture was given up, if it was

    def __post_init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()


class _Graphed:
    """fn(*args) eagerly at its first call; then captured into a CUDA graph and replayed: its outputs are the
    capture's tensors, rewritten in place by each replay, and its tensor arguments must be the ones it was
    captured with (the graph reads those addresses). Eager without `graphs`, or once a capture failed."""

    def __init__(self, fn: Callable[..., Any], graphs: Graphs | None) -> None:
        self.fn, self.graphs = fn, graphs
        self.graph: Any = None
        self.args: tuple[Any, ...] = ()
        self.out: Any = None
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        graphs = self.graphs
        self.calls += 1
        if graphs is None or graphs.failed is not None or self.calls == 1:
            return self.fn(*args)
        if self.graph is None and not self._capture(graphs, args):
            return self.fn(*args)
        if len(args) != len(self.args) or any(a is not b for a, b in zip(args, self.args)):
            raise RuntimeError("a graphed decode half was called with other tensors than it was captured with")
        self.graph.replay()
        return self.out

    def _capture(self, graphs: Graphs, args: tuple[Any, ...]) -> bool:
        before = torch.cuda.memory_allocated(graphs.device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=graphs.pool, capture_error_mode="thread_local"):
                out = self.fn(*args)
        except RuntimeError as exc:  # a capture that fails leaves the eager path, which is what CI tests
            graphs.failed = f"{type(exc).__name__}: {exc}"
            log.warning("pulseio sparse cache: CUDA graph capture failed, the decode step stays eager: %s", exc)
            return False
        self.graph, self.args, self.out = graph, args, out
        graphs.captured += 1
        graphs.bytes += torch.cuda.memory_allocated(graphs.device) - before
        return True
