"""The device work of one offloaded layer in one decode step, in two fixed-shape halves around the recall:

    before()    Quest bounds of q against the layer's digests over all NB block columns (those past the
                context masked), sink + local + top-k, HotSet.plan -> (host ids, device slots, count)
    [eager]     Runtime.post_recall(count=) and device_wait: a publish kernel, a copier, a wait kernel
    after()     the new token into its block's hot slot; the selected blocks gathered in position order into
                one buffer [2, B, Hkv, K x bs, D] that every layer shares (the attention reads its prefix)

Why two halves and fixed shapes: around transformers' eager model code a decode step is bound by the host's
kernel launches, and the ~70 small ops of a sparse layer would cost more than the dense layer they replace.
So the context length is a device scalar (`StepInputs.num_blocks`, filled once a step, like the query and the
new token), nothing in a half depends on a host value, and on a GPU each half is captured into a CUDA graph
at a layer's second decode step: one launch instead of ~35. Its first step runs eagerly; so does everything
off CUDA (the code CI tests is the code a graph captures), and everything after a capture that failed
(logged once, with the error).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .hot_set import HotSet, RecallPlan
from .selection import block_scores, select_blocks

log = logging.getLogger(__name__)


@dataclass
class StepInputs:
    """Static tensors a step's halves read, filled before each layer (shared by the layers: stream order).

    q: [B, Hq, D] the layer's query; kv: [R, 2, hpu, D] the new token's K and V per row; num_blocks, block,
    offset: [] int64, blocks in the context, and the new token's block and offset in it."""

    q: torch.Tensor
    kv: torch.Tensor
    num_blocks: torch.Tensor
    block: torch.Tensor
    offset: torch.Tensor


@dataclass(frozen=True)
class LayerTensors:
    """What the halves of one offloaded layer read and write besides the step's inputs."""

    dmax: torch.Tensor  # [B, S, NB, D] the layer's digests
    dmin: torch.Tensor
    hot: HotSet
    head: int | None  # SoloHead's selecting KV head, None for Quest


class LayerStep:
    """The two halves of one offloaded layer (see the module doc), each graphed on a GPU."""

    def __init__(self, layer: LayerTensors, inputs: StepInputs, pool: torch.Tensor, gathered: torch.Tensor, *,
                 budget: int, sink: int, local: int, graphs: Graphs | None) -> None:
        """pool: [slots, 2, hpu, bs, D] the device pool's units; gathered: [2, B, Hkv, K * bs, D]."""
        self.layer, self.inputs, self.pool, self.gathered = layer, inputs, pool, gathered
        self.budget, self.sink, self.local = budget, sink, local
        self.before = _Graphed(self._before, graphs)
        self.after = _Graphed(self._after, graphs)

    def _before(self) -> RecallPlan:
        """The selection and the recall it needs (the hot set's residency updated as if it had landed)."""
        lay, x = self.layer, self.inputs
        scores = block_scores(x.q, self.gathered.shape[2], lay.head, lay.dmax, lay.dmin)  # [B, S, NB]
        selected = select_blocks(scores, self.budget, sink=self.sink, local=self.local,
                                 num_blocks=x.num_blocks)                                  # [B, S, K]
        return lay.hot.plan(selected.view(-1, self.budget))

    def _after(self, plan: RecallPlan) -> None:
        """After the recall landed: the new token into its hot slot, then the selected blocks gathered."""
        hot, x = self.layer.hot, self.inputs
        slots = hot.slot0[:, 0] + hot.where.gather(1, x.block.view(1, 1).expand(hot.slot0.shape[0], 1))[:, 0]
        self.pool[slots, :, :, x.offset] = x.kv                                           # [R, 2, hpu, D]
        units = self.pool.index_select(0, plan.slots.view(-1))                             # [R * K, 2, hpu, bs, D]
        _, b, _, _, d = self.gathered.shape
        _, hpu, bs, _ = units.shape[1:]
        s = plan.slots.shape[0] // b
        self.gathered.view(2, b, s, hpu, self.budget, bs, d).copy_(
            units.view(b, s, self.budget, 2, hpu, bs, d).permute(3, 0, 1, 4, 2, 5, 6))


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
