"""The CUDA backend, on a real GPU: every strategy, both directions, bit for bit, poisoned destinations."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import pulseio
from pulseio import DmaConfig, Strategy

pytestmark = pytest.mark.gpu

STRATEGIES = [Strategy.PER_BLOCK, Strategy.GATHER_DMA, Strategy.ZERO_COPY, Strategy.RESIDENT, Strategy.BATCHED]


@pytest.fixture(scope="module")
def backend():
    return pulseio.open_backend("cuda")


def _pools(backend, block_bytes: int, num_blocks: int = 4096, num_slots: int = 1024):
    host = pulseio.HostPool(backend, num_blocks, block_bytes)
    host.blocks.copy_(torch.randint(0, 256, host.blocks.shape, dtype=torch.uint8))
    device = pulseio.DevicePool(backend, num_slots, block_bytes)
    device.slots.copy_(torch.randint(0, 256, device.slots.shape, dtype=torch.uint8, device=device.slots.device))
    return host, device


@pytest.mark.parametrize("block_bytes", [8 << 10, 64 << 10, 4096 + 16])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_recall_and_offload_are_bit_exact(backend, strategy: Strategy, block_bytes: int) -> None:
    host, device = _pools(backend, block_bytes)
    rng = np.random.default_rng(block_bytes)
    # staging of 100 blocks: a 700-block transfer is split into pipelined pieces
    config = DmaConfig(staging_bytes=100 * block_bytes, merge_blocks=256)
    try:
        with pulseio.DmaEngine(host, device, config) as engine:
            for count in (1, 63, 700):
                ids = rng.choice(host.num_blocks, count, replace=False)
                slots = rng.choice(device.num_slots, count, replace=False)
                slots_t = torch.from_numpy(slots).cuda()
                device.slots.index_fill_(0, slots_t, 0xA5)
                others = torch.ones(device.num_slots, dtype=torch.bool, device="cuda")
                others[slots_t] = False
                before = device.slots[others].clone()
                engine.recall(host_ids=ids, device_slots=slots, strategy=strategy).wait(timeout=30)
                assert torch.equal(device.slots[slots_t].cpu(), host.blocks[torch.from_numpy(ids)])
                assert torch.equal(device.slots[others], before), "a slot outside the request was written"

                back = rng.choice(host.num_blocks, count, replace=False)
                host.blocks[torch.from_numpy(back)] = 0x5A
                engine.offload(device_slots=slots, host_ids=back, strategy=strategy).wait(timeout=30)
                assert torch.equal(host.blocks[torch.from_numpy(back)], device.slots[slots_t].cpu())
    finally:
        host.close()


def test_many_small_recalls_merge_and_stay_exact(backend) -> None:
    host, device = _pools(backend, 8 << 10)
    rng = np.random.default_rng(3)
    try:
        with pulseio.DmaEngine(host, device, DmaConfig(merge_blocks=4096)) as engine:
            slots = rng.permutation(device.num_slots)
            ids = rng.choice(host.num_blocks, device.num_slots, replace=False)
            transfers = [
                engine.recall(host_ids=ids[i : i + 16], device_slots=slots[i : i + 16], strategy=strategy,
                              stream_ordered=False)
                for i in range(0, device.num_slots, 16)
                for strategy in [Strategy.ZERO_COPY]
            ]
            for t in transfers:
                assert t.wait(timeout=30)
            assert torch.equal(device.slots[torch.from_numpy(slots).cuda()].cpu(), host.blocks[torch.from_numpy(ids)])
            assert engine.statistics().issues <= len(transfers)
    finally:
        host.close()


def test_offload_waits_for_work_on_the_current_stream(backend) -> None:
    """stream_ordered offload reads slots only after the producer kernel on the caller's stream."""
    host, device = _pools(backend, 64 << 10, num_blocks=256, num_slots=64)
    try:
        with pulseio.DmaEngine(host, device) as engine:
            for strategy in STRATEGIES:
                host.blocks[:8].fill_(0)
                torch.cuda._sleep(20_000_000)  # a long kernel ahead of the write, on the current stream
                device.slots[:8].fill_(7)
                engine.offload(device_slots=np.arange(8), host_ids=np.arange(8), strategy=strategy).wait(timeout=30)
                assert bool((host.blocks[:8] == 7).all()), strategy
    finally:
        host.close()


@pytest.mark.parametrize("strategy", [Strategy.GATHER_DMA, Strategy.RESIDENT])
def test_device_wait_orders_the_consumer_stream(backend, strategy: Strategy) -> None:
    host, device = _pools(backend, 8 << 10)
    try:
        with pulseio.DmaEngine(host, device) as engine:
            ids, slots = np.arange(100, 164), np.arange(64)
            device.slots[:64].fill_(0)
            t = engine.recall(host_ids=ids, device_slots=slots, strategy=strategy)
            t.device_wait()
            total = device.slots[:64].to(torch.int64).sum()  # runs on the consumer stream after the wait
            assert int(total) == int(host.blocks[100:164].to(torch.int64).sum())
    finally:
        host.close()


def test_device_pool_larger_than_the_gpu_is_refused(backend) -> None:
    free, _ = torch.cuda.mem_get_info()
    with pytest.raises(pulseio.PoolTooSmallError, match=r"needs .* GiB of GPU memory, .* GiB free"):
        pulseio.DevicePool(backend, (free // (1 << 20)) + 1024, 1 << 20)


def test_resident_kernel_stops_when_idle_and_restarts_on_the_next_post(backend) -> None:
    """Bursts apart by more than resident_idle_us each relaunch the kernel; 40 tasks in flight at once
    (more than its 16 ring slots) wait for slots; every byte lands, and a consumer stream sees it."""
    host, device = _pools(backend, 8 << 10)
    rng = np.random.default_rng(11)
    try:
        with pulseio.DmaEngine(host, device, DmaConfig(resident_idle_us=50)) as engine:
            copier = engine._routes._resident
            launches = copier.launches
            for _ in range(3):
                time.sleep(0.01)  # > idle: the kernel has exited
                ids = rng.choice(host.num_blocks, 64, replace=False)
                engine.recall(host_ids=ids, device_slots=np.arange(64), strategy=Strategy.RESIDENT,
                              stream_ordered=False).wait(timeout=30)
                assert torch.equal(device.slots[:64].cpu(), host.blocks[torch.from_numpy(ids)])
            assert copier.launches >= launches + 3
            slots = rng.permutation(device.num_slots)[:640]
            ids = rng.choice(host.num_blocks, 640, replace=False)
            device.slots.index_fill_(0, torch.from_numpy(slots).cuda(), 0xA5)
            transfers = [engine.recall(host_ids=ids[i : i + 16], device_slots=slots[i : i + 16],
                                       strategy=Strategy.RESIDENT,
                                       stream_ordered=False) for i in range(0, 640, 16)]
            transfers[-1].device_wait()
            landed = device.slots[torch.from_numpy(slots).cuda()].cpu()  # consumer stream, after the wait
            assert torch.equal(landed, host.blocks[torch.from_numpy(ids)])
            for t in transfers:
                assert t.wait(timeout=30)
    finally:
        host.close()


def test_kernels_write_the_host_pool_through_its_device_view(backend) -> None:
    host, _ = _pools(backend, 4096, num_blocks=64, num_slots=4)
    view = host.device_view(torch.bfloat16, 2, 1024)                  # [64, 2, 1024] bf16, on the GPU
    assert view.is_cuda and view.data_ptr() == host.device_ptr
    values = torch.randn(3, 2, 1024, device="cuda").bfloat16()
    view.index_copy_(0, torch.tensor([7, 0, 63], device="cuda"), values)
    torch.cuda.synchronize()
    assert torch.equal(host.view(torch.bfloat16, 2, 1024)[[7, 0, 63]], values.cpu())
    host.close()
