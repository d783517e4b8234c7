"""The runtime on a real GPU: GPU-chosen ids reach the poller through the ring, the consumer stream
waits on the device (the wait kernel), and the submitting thread never syncs."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

import pulseio
from pulseio import RuntimeConfig, Strategy, TransferError

pytestmark = pytest.mark.gpu

BLOCK = 8 << 10
CFG = RuntimeConfig(device="cuda", host_blocks=4096, device_slots=1024, block_bytes=BLOCK, ring_slots=64,
                    max_blocks_per_request=1024)


@pytest.fixture(scope="module")
def rt():
    runtime = pulseio.open_runtime(CFG)
    runtime.host_pool.blocks.copy_(torch.randint(0, 256, runtime.host_pool.blocks.shape, dtype=torch.uint8))
    yield runtime
    runtime.close()


def _consume(rt: pulseio.Runtime, done: pulseio.Completion, slots: torch.Tensor, stream: torch.cuda.Stream):
    """On `stream`: wait for the recall on the device, then copy the slots out (what a model would read)."""
    done.device_wait(stream)
    with torch.cuda.stream(stream):
        return rt.device_pool.slots.index_select(0, slots)


@pytest.mark.parametrize(
    "strategy", [Strategy.RESIDENT, Strategy.ZERO_COPY, Strategy.GATHER_DMA, Strategy.BATCHED, Strategy.PER_BLOCK]
)
def test_gpu_chosen_ids_land_bit_exact(rt: pulseio.Runtime, strategy: Strategy) -> None:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ids = torch.randperm(CFG.host_blocks, device="cuda")[:300]  # [300] int64, cuda: "selected" blocks
        slots = torch.randperm(CFG.device_slots, device="cuda")[:300]
        rt.device_pool.slots.index_fill_(0, slots, 0xA5)
    done = rt.post_recall(host_ids=ids, device_slots=slots, stream=stream, strategy=strategy, tag=5)
    out = _consume(rt, done, slots, stream)
    stream.synchronize()
    assert done.wait(timeout=10) and done.num_blocks == 300
    expected = rt.host_pool.blocks[ids.cpu()]
    assert torch.equal(out.cpu(), expected)


@pytest.mark.parametrize("strategy", [Strategy.AUTO, Strategy.RESIDENT])  # RESIDENT: the poller's fast lane
def test_device_count_and_invalid_id_fail_only_their_request(rt: pulseio.Runtime, strategy: Strategy) -> None:
    ids = torch.tensor([1, 2, CFG.host_blocks + 7, 3], device="cuda")
    slots = torch.arange(4, device="cuda")
    count = torch.tensor([2], device="cuda")  # decided on the GPU: only the first two ids
    short = rt.post_recall(host_ids=ids, device_slots=slots, count=count, tag=1, strategy=strategy)
    bad = rt.post_recall(host_ids=ids, device_slots=slots, tag=2, strategy=strategy)
    after = rt.post_recall(host_ids=ids[:2], device_slots=slots[2:4], tag=3, strategy=strategy)
    assert short.wait(timeout=10) and short.num_blocks == 2
    with pytest.raises(TransferError, match=r"^doorbell request seq=\d+ tag=2: host_ids\[2\] = 4103 is out of range"):
        bad.wait(timeout=10)
    assert after.wait(timeout=10)
    torch.cuda.synchronize()
    assert torch.equal(rt.device_pool.slots[2:4].cpu(), rt.host_pool.blocks[1:3])


@pytest.mark.parametrize("strategy", [Strategy.AUTO, Strategy.RESIDENT])
def test_select_ring_recall_consume_loop_never_syncs_the_submitting_thread(rt: pulseio.Runtime,
                                                                           strategy: Strategy) -> None:
    stream = torch.cuda.Stream()
    steps, k = 16, 64
    slots = [torch.arange(i * k, (i + 1) * k, device="cuda") for i in range(steps)]
    scores = torch.rand(steps, CFG.host_blocks, device="cuda")
    # the consumer's own kernels once first: under lazy module loading a kernel's first launch waits for the
    # device (here: the sleep below), which is the caller's sync, not pulseio's
    torch.topk(scores[0], k)
    rt.device_pool.slots.index_select(0, slots[0])
    torch.cuda.synchronize()
    outs, posted = [], []
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(200_000_000)  # ~100 ms of GPU time: any host sync below would wait it out
            start = time.perf_counter()
            for i in range(steps):
                ids = torch.topk(scores[i], k).indices  # [k] int64, cuda: the selection kernel
                done = rt.post_recall(host_ids=ids, device_slots=slots[i], stream=stream, tag=i, strategy=strategy)
                done.device_wait(stream)  # enqueued long before the copy is issued
                outs.append((ids, rt.device_pool.slots.index_select(0, slots[i])))
                posted.append(done)
            loop_s = time.perf_counter() - start
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert not any(d.done() for d in posted[:1]), "the GPU was still sleeping: nothing could have landed"
    assert loop_s < 0.05, f"the submitting loop took {loop_s * 1e3:.1f} ms: something waited for the GPU"
    assert all(d.wait(timeout=30) for d in posted)
    stream.synchronize()
    for ids, out in outs:
        assert torch.equal(out.cpu(), rt.host_pool.blocks[ids.cpu()])


def test_publish_captured_in_a_cuda_graph(rt: pulseio.Runtime) -> None:
    stream = torch.cuda.Stream()
    ids = torch.tensor([11, 12, 13], device="cuda")
    slots = torch.tensor([900, 901, 902], device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        first = rt.post_recall(host_ids=ids, device_slots=slots, stream=stream, tag=0)  # the ticket of the first replay
    completions = [first]
    for replay in range(3):
        if replay:
            completions += rt.expect_published(1)
        with torch.cuda.stream(stream):
            if replay:
                ids.add_(1)  # the captured kernel reads the ids buffer afresh on every replay
            graph.replay()
        stream.synchronize()
        assert completions[-1].wait(timeout=10)
        assert torch.equal(rt.device_pool.slots[900:903].cpu(), rt.host_pool.blocks[ids.cpu()])


def test_statistics_and_close_release_everything() -> None:
    with pulseio.open_runtime(dataclasses.replace(CFG, close_timeout_s=0.5)) as rt:
        ids = torch.arange(8, device="cuda")
        done = [rt.post_recall(host_ids=ids, device_slots=ids, tag=i) for i in range(10)]
        assert all(d.wait(timeout=10) for d in done)
        stats = rt.statistics()
        assert (stats.completed, stats.failed, stats.doorbell.lost) == (10, 0, 0)
        assert stats.post_to_seen.count == 10 and np.isfinite(stats.post_to_landed.p50_us)
        (never,) = rt.expect_published(1)
        waiter = torch.cuda.Stream()
        never.device_wait(waiter)  # would hang the stream forever without the close-time release
    waiter.synchronize()
    with pytest.raises(pulseio.ClosedError):
        never.wait(timeout=1)


def test_device_wait_is_refused_inside_a_graph_capture_before_it_enqueues_anything(rt: pulseio.Runtime) -> None:
    """Captured, the wait and its copier generation would replay for a request long gone. Refused before
    either is enqueued (an event of the capture waited on by the copier's stream would pull that stream
    into the capture, and ending it would fail), the capture goes on and the request lands. The publish is
    kept back ~1 s by a sleep on its stream, so the request is still pending when the capture asks."""
    publish = torch.cuda.Stream()
    ids, slots = torch.arange(4, device="cuda"), torch.arange(8, 12, device="cuda")
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    x = torch.ones(4, device="cuda")
    with torch.cuda.stream(side):
        torch.mul(x, 2)  # the multiply's first launch loads its module, waiting for the device: not behind the sleep
    torch.cuda.synchronize()
    with torch.cuda.stream(publish):
        torch.cuda._sleep(2_000_000_000)   # clock cycles: ~1 s
    done = rt.post_recall(host_ids=ids, device_slots=slots, stream=publish, strategy=Strategy.RESIDENT)
    assert not done.done()
    with torch.cuda.stream(side):
        graph.capture_begin()   # not torch.cuda.graph(): that synchronizes the device first
        y = x * 2
        with pytest.raises(pulseio.InvalidRequestError, match="capturing a CUDA graph"):
            done.device_wait(side)
        graph.capture_end()
    graph.replay()
    assert done.wait(timeout=10)
    torch.cuda.synchronize()
    assert torch.equal(y.cpu(), torch.full((4,), 2.0))
    assert torch.equal(rt.device_pool.slots[8:12].cpu(), rt.host_pool.blocks[:4])


def test_reused_mirror_rows_and_requests_off_the_fast_lane_leave_every_slot_bit_exact() -> None:
    """The resident copier copies requests early, as they are published (`resident_kernel.py`). With four
    ids-mirror rows, reused every fourth request, requests the fast lane takes, requests that go another
    route and requests the poller refuses (an id out of range) write overlapping slots one after another:
    after each finished request its slots hold its blocks, never a late early copy of an earlier one."""
    cfg = dataclasses.replace(CFG, ring_slots=4, max_outstanding=4)
    rng = np.random.default_rng(11)
    with pulseio.open_runtime(cfg) as rt:
        assert rt._mirror_reader is not None and rt._mirror_reader.mirror_rows == 4
        rt.host_pool.blocks.copy_(torch.randint(0, 256, rt.host_pool.blocks.shape, dtype=torch.uint8))
        stream = torch.cuda.Stream()
        refused = 0
        for i in range(300):
            n = int(rng.integers(1, 97))
            ids = torch.from_numpy(rng.choice(cfg.host_blocks, n, replace=False)).cuda()
            slots = torch.from_numpy(rng.choice(96, n, replace=False)).cuda()  # 96 slots, shared by all
            kind = rng.choice(["lane", "other", "refused"], p=[0.6, 0.25, 0.15])
            if kind == "refused":
                ids[int(rng.integers(n))] = cfg.host_blocks + 1
            strategy = Strategy.ZERO_COPY if kind == "other" else Strategy.RESIDENT
            done = rt.post_recall(host_ids=ids, device_slots=slots, stream=stream, strategy=strategy, tag=i)
            if kind == "refused":  # device_wait raises if the poller has refused it already, else the wait does
                with pytest.raises(TransferError, match="is out of range"):
                    _consume(rt, done, slots, stream)
                    stream.synchronize()
                    done.wait(timeout=10)
                refused += 1
                continue
            out = _consume(rt, done, slots, stream)
            stream.synchronize()
            assert done.wait(timeout=10)
            assert torch.equal(out.cpu(), rt.host_pool.blocks[ids.cpu()]), f"request {i} ({kind})"
        assert refused > 0


def test_copy_streams_are_none_of_torchs_pool_streams(rt: pulseio.Runtime) -> None:
    """torch hands out each priority's 32 pool streams round-robin; a copy stream taken from a pool would be what
    every 32nd later request of its priority gets, and work there would queue behind the resident kernel."""
    routes = rt.workers[0]._routes
    own = {routes.stream.cuda_stream, rt.workers[0].resident.stream.cuda_stream}
    assert len(own) == 2
    pool = {torch.cuda.Stream(priority=p).cuda_stream for p in (0, -1, -2, -3) for _ in range(33)}  # torch's 4
    assert own.isdisjoint(pool)
    ids = torch.arange(64, device="cuda")
    done = rt.post_recall(host_ids=ids, device_slots=ids, strategy=Strategy.RESIDENT, tag=9)
    assert done.wait(timeout=10)
    assert torch.equal(rt.device_pool.slots[:64].cpu(), rt.host_pool.blocks[:64])
