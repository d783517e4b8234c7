"""What an engine does after `device_wait`: the consumer patterns the runtime must survive without hanging.

Each pattern runs on `stream` after the wait and returns the gathered slots ([k, block_bytes] uint8, on the
device) so the caller can check them bit for bit. Several of them make a driver call that waits for the
whole device (a first launch, a Triton compile and load, an allocator free, a device synchronize, a pinned
allocation, a graph capture): with a device wait that depended on a later driver call, those deadlocked.
Used by the GPU tests (`tests/pulseio/test_device_wait_patterns_gpu.py`) and the soak benchmark.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

Pattern = Callable[[Any, torch.Tensor, torch.Tensor, torch.cuda.Stream], torch.Tensor]


def _gather(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    return pool.index_select(0, slots)  # [k, block_bytes] uint8


def item(done: Any, pool: torch.Tensor, slots: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    """A later kernel reads the slots, and the step's result goes to the host with `.item()`."""
    with torch.cuda.stream(stream):
        out = _gather(pool, slots)
        total = out.to(torch.int64).sum()
    total.item()
    return out


def pinned_poll(done: Any, pool: torch.Tensor, slots: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    """The result goes to pinned memory and the host polls an event: no blocking driver call at all."""
    with torch.cuda.stream(stream):
        out = _gather(pool, slots)
        host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        host.copy_(out, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
    while not event.query():
        time.sleep(50e-6)
    return out


def wait_then_item(done: Any, pool: torch.Tensor, slots: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    """A later kernel is enqueued, then the host waits for the completion, then `.item()`."""
    with torch.cuda.stream(stream):
        out = _gather(pool, slots)
        total = out.to(torch.int64).sum()
    if done is not None:  # None: a warm-up run
        done.wait(30)
    total.item()
    return out


def cpu(done: Any, pool: torch.Tensor, slots: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    with torch.cuda.stream(stream):
        out = _gather(pool, slots)
    out.cpu()
    return out


def synchronize(done: Any, pool: torch.Tensor, slots: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    with torch.cuda.stream(stream):
        out = _gather(pool, slots)
    torch.cuda.synchronize()
    return out


def empty_cache(done: Any, pool: torch.Tensor, slots: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    """The allocator frees its cache (cudaFree waits for the whole device) behind the wait."""
    with torch.cuda.stream(stream):
        out = _gather(pool, slots)
        scratch = torch.empty(64 << 20, dtype=torch.uint8, device=pool.device)
        scratch.fill_(1)
    del scratch
    torch.cuda.empty_cache()
    return out


def alloc_growth(done: Any, pool: torch.Tensor, slots: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    """The allocator grows (a fresh cudaMalloc of an odd size) behind the wait."""
    with torch.cuda.stream(stream):
        out = _gather(pool, slots)
        grown = torch.zeros((257 << 20) + int(time.perf_counter_ns() % 4096), dtype=torch.uint8, device=pool.device)
        grown[: out.numel()].copy_(out.view(-1))
    return out


def pinned_alloc(done: Any, pool: torch.Tensor, slots: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    """A new pinned allocation (cudaHostAlloc) behind the wait."""
    with torch.cuda.stream(stream):
        out = _gather(pool, slots)
    staging = torch.empty((33 << 20) + int(time.perf_counter_ns() % 4096), dtype=torch.uint8, pin_memory=True)
    staging[:1] = 0
    return out


def graph(done: Any, pool: torch.Tensor, slots: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    """A CUDA graph of the consumer is captured behind the wait and replayed on the consumer stream."""
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(pool.device)
    side.wait_stream(stream)
    with torch.cuda.graph(g, stream=side):
        out = _gather(pool, slots)
    stream.wait_stream(side)
    with torch.cuda.stream(stream):
        g.replay()
    stream.synchronize()
    return out


def triton_sum(done: Any, pool: torch.Tensor, slots: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    """A Triton kernel, compiled and loaded on its first use behind the wait, reads the slots."""
    from ._triton_consumer import gather_rows

    with torch.cuda.stream(stream):
        out = gather_rows(pool, slots)
    stream.synchronize()
    return out


def selection(done: Any, pool: torch.Tensor, slots: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    """A sparse selection's kernels (top-k, a stable argsort) score the slots, with no host sync: on their
    first launch some wait for every running kernel, on the host (lazy module loading) or on the GPU (top-k
    under eager loading), while the host goes on to post the next request."""
    with torch.cuda.stream(stream):
        out = _gather(pool, slots)
        scores = out[:, :64].to(torch.float32).sum(1)
        torch.topk(scores, min(4, len(scores)))
        torch.argsort(scores, stable=True)
    return out


PATTERNS: dict[str, Pattern] = {
    "item": item, "pinned_poll": pinned_poll, "wait_then_item": wait_then_item, "cpu": cpu,
    "synchronize": synchronize, "empty_cache": empty_cache, "alloc_growth": alloc_growth,
    "pinned_alloc": pinned_alloc, "graph": graph, "triton": triton_sum, "selection": selection,
}
