"""pytest-benchmark suite of the transfer paths, for regression tracking.

CI runs each once as a plain test (`--benchmark-disable` in pyproject): every round still checks
its bytes. On a machine worth timing: `python -m pytest tests/pulseio/test_transfer_benchmarks.py
--benchmark-enable --benchmark-group-by=param:count` (add `-m gpu` for the GPU rows). Compare
strategies within a group: `per_block` is the in-process reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pulseio
from pulseio import DmaConfig, Strategy

STRATEGIES = [Strategy.PER_BLOCK, Strategy.GATHER_DMA, Strategy.ZERO_COPY, Strategy.RESIDENT, Strategy.BATCHED]


def _setup(device: str, block_bytes: int, count: int):
    backend = pulseio.open_backend(device)
    host = pulseio.HostPool(backend, max(16 * count, 1024), block_bytes)
    host.blocks.copy_(torch.randint(0, 256, host.blocks.shape, dtype=torch.uint8))
    pool = pulseio.DevicePool(backend, count, block_bytes)
    rng = np.random.default_rng(count)
    ids = [rng.choice(host.num_blocks, count, replace=False) for _ in range(8)]
    slots = np.arange(count)
    return host, pool, ids, slots


def _run(benchmark, device: str, strategy: Strategy, count: int, block_bytes: int) -> None:
    host, pool, ids, slots = _setup(device, block_bytes, count)
    rounds = iter(range(1 << 30))
    try:
        with pulseio.DmaEngine(host, pool, DmaConfig(merge_blocks=count)) as dma:
            def recall() -> None:
                i = next(rounds) % len(ids)
                dma.recall(host_ids=ids[i], device_slots=slots, strategy=strategy, stream_ordered=False).wait()

            benchmark(recall)
            i = (next(rounds) - 1) % len(ids)
            landed = pool.slots.cpu()
            assert torch.equal(landed, host.blocks[torch.from_numpy(ids[i])])
            benchmark.extra_info["bytes"] = count * block_bytes
    finally:
        host.close()


@pytest.mark.parametrize("count", [64, 512])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.value)
def test_recall_host_backend(benchmark, strategy: Strategy, count: int) -> None:
    _run(benchmark, "cpu", strategy, count, 8192)


@pytest.mark.gpu
@pytest.mark.parametrize("block_bytes", [8192, 65536])
@pytest.mark.parametrize("count", [64, 512, 4096])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.value)
def test_recall_cuda(benchmark, strategy: Strategy, count: int, block_bytes: int) -> None:
    _run(benchmark, "cuda", strategy, count, block_bytes)
