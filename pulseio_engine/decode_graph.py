"""Decode-step CUDA graphs, one per batch-size bucket, over static input buffers.

Why: a 40-layer decode step is ~500 small kernel launches; at batch 64 the GPU finishes many of
them faster than Python can enqueue them. A captured graph replays the whole step with one launch.

What a graph reads: `input_ids`, `positions` [Bmax] int64 and `block_tables` [Bmax, M] int32, all
static device buffers; slots and context lengths are derived inside the graph, so a step uploads
only those three. Rows past the live batch are padding: token 0 at position 0 in the reserved
padding block 0, so they read and write nothing that belongs to a sequence. What it writes:
`logits` [Bmax, V] fp32 and `next_tokens` [Bmax] int64 (greedy). Capturing runs the step twice
eagerly first (on padding rows only), which also compiles the attention kernel.
"""

from __future__ import annotations

import warnings

import torch

from .kv.block_table import PAD_BLOCK
from .kv.cache import KVCache
from .model.batch_state import DecodeAttention
from .model.llama import CausalLM


def decode_buckets(max_batch: int) -> list[int]:
    """Batch sizes graphs are captured for: 1, 2, 4, 8, then multiples of 8 up to 64, then of 16."""
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, min(max_batch, 64) + 1, 8)) \
        + list(range(80, max_batch + 1, 16))
    if not sizes or sizes[-1] < max_batch:
        sizes.append(max_batch)
    return sorted(set(sizes))


class DecodeGraphs:
    def __init__(self, model: CausalLM, kv: KVCache, *, max_batch: int, max_blocks_per_seq: int,
                 use_graphs: bool) -> None:
        self.model = model
        self.kv = kv
        self.buckets = decode_buckets(max_batch)
        self.use_graphs = use_graphs and model.device.type == "cuda"
        dev, vocab = model.device, model.config.vocab_size
        bmax = self.buckets[-1]
        self.input_ids = torch.zeros(bmax, dtype=torch.int64, device=dev)                  # [Bmax]
        self.positions = torch.zeros(bmax, dtype=torch.int64, device=dev)                  # [Bmax]
        self.block_tables = torch.full((bmax, max_blocks_per_seq), PAD_BLOCK, dtype=torch.int32,
                                       device=dev)                                         # [Bmax, M]
        self.logits = torch.zeros(bmax, vocab, dtype=torch.float32, device=dev)           # [Bmax, V]
        self.next_tokens = torch.zeros(bmax, dtype=torch.int64, device=dev)               # [Bmax]
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._ready: set[int] = set()
        self._pool: torch.cuda._POOL_HANDLE | None = None

    def bucket_for(self, batch: int) -> int:
        for size in self.buckets:
            if size >= batch:
                return size
        raise ValueError(f"decode batch of {batch} exceeds the largest bucket {self.buckets[-1]}")

    def ensure_captured(self, bucket: int) -> None:
        """Warm up (and on CUDA capture) the bucket's step once. Clobbers the static inputs: call
        before filling them."""
        if bucket in self._ready:
            return
        self._pad(0, bucket)
        if not self.use_graphs:
            self.warm_up(bucket)
            self._ready.add(bucket)
            return
        side = torch.cuda.Stream(self.model.device)
        side.wait_stream(torch.cuda.current_stream(self.model.device))
        with torch.cuda.stream(side):
            self.warm_up(bucket)
            self._body(bucket)
        torch.cuda.current_stream(self.model.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._body(bucket)
        self._pool = graph.pool() if self._pool is None else self._pool
        self._graphs[bucket] = graph
        self._ready.add(bucket)

    def warm_up(self, bucket: int) -> None:
        """Run the step once eagerly on padding rows: compiles kernels (Triton, torch.compile).

        If torch.compile's toolchain fails here, decode falls back to eager halves and the model
        keeps the error (`model.compile_error`, reported by the benchmark): a slower engine that
        says why beats no engine on a machine whose compiler setup we cannot see."""
        if not self.model.compiled:
            self._body(bucket)
            return
        try:
            self._body(bucket)
        except Exception as exc:  # noqa: BLE001 - compiler failures have no common base class
            self.model.disable_compile(f"{type(exc).__name__}: {exc}"[:2000])
            warnings.warn(f"torch.compile of the decode path failed; running it eagerly: {exc}", stacklevel=2)
            self._body(bucket)

    def run_nowait(self, bucket: int) -> None:
        """One decode step over the first `bucket` rows of the static inputs; never syncs."""
        graph = self._graphs.get(bucket)
        if graph is not None:
            graph.replay()
        else:
            self._body(bucket)

    def advance_nowait(self, bucket: int) -> None:
        """Feed each row's greedy token back and move it one position on (benchmark loop)."""
        self.input_ids[:bucket].copy_(self.next_tokens[:bucket])
        self.positions[:bucket].add_(1)

    def _pad(self, start: int, stop: int) -> None:
        self.input_ids[start:stop].zero_()
        self.positions[start:stop].zero_()
        self.block_tables[start:stop].fill_(PAD_BLOCK)

    def _body(self, bucket: int) -> None:
        ids, pos, tables = self.input_ids[:bucket], self.positions[:bucket], self.block_tables[:bucket]
        bs = self.kv.block_size
        context_lens = (pos + 1).to(torch.int32)                                            # [B]
        slots = tables.gather(1, (pos // bs).unsqueeze(1)).squeeze(1).to(torch.int64) * bs + pos % bs
        state = self.model.begin(ids, pos, slots, DecodeAttention(tables, context_lens), self.kv)
        logits = self.model.forward(state)                                                  # [B, V]
        self.logits[:bucket].copy_(logits)
        self.next_tokens[:bucket].copy_(logits.argmax(dim=-1))
