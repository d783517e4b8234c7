"""DmaEngine on the host backend: every strategy both ways, bit for bit; errors lose nothing."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import pulseio
from pulseio import AutoPolicy, Direction, DmaConfig, Strategy, TransferState

STRATEGIES = [Strategy.PER_BLOCK, Strategy.GATHER_DMA, Strategy.ZERO_COPY, Strategy.RESIDENT, Strategy.BATCHED]
POISON = 0xA5


@pytest.fixture
def pools():
    backend = pulseio.HostBackend()
    host = pulseio.HostPool(backend, 512, 256)
    device = pulseio.DevicePool(backend, 128, 256)
    host.blocks.copy_(torch.randint(0, 256, host.blocks.shape, dtype=torch.uint8))
    device.slots.copy_(torch.randint(0, 256, device.slots.shape, dtype=torch.uint8))
    return host, device


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_recall_then_offload_round_trips_bit_exact(pools, strategy: Strategy) -> None:
    host, device = pools
    rng = np.random.default_rng(1)
    with pulseio.DmaEngine(host, device, DmaConfig(staging_bytes=10 * 256)) as engine:  # 10-block pieces
        for count in (1, 37, 128):
            ids = rng.choice(host.num_blocks, count, replace=False)
            slots = rng.choice(device.num_slots, count, replace=False)
            untouched = np.setdiff1d(np.arange(device.num_slots), slots)
            before = device.slots[untouched].clone()
            device.slots[slots] = POISON
            t = engine.recall(host_ids=ids, device_slots=slots, strategy=strategy, tag=("recall", count))
            assert t.wait(timeout=10)
            assert t.state is TransferState.DONE and t.strategy is strategy and t.nbytes == count * 256
            assert torch.equal(device.slots[slots], host.blocks[ids])
            assert torch.equal(device.slots[untouched], before)

            back = rng.choice(host.num_blocks, count, replace=False)
            host.blocks[back] = POISON
            assert engine.offload(device_slots=slots, host_ids=back, strategy=strategy).wait(timeout=10)
            assert torch.equal(host.blocks[back], device.slots[slots])


def test_a_rejected_request_leaves_every_destination_untouched(pools) -> None:
    host, device = pools
    before = device.slots.clone()
    with pulseio.DmaEngine(host, device) as engine:
        with pytest.raises(pulseio.InvalidRequestError, match="out of range"):
            engine.recall(host_ids=[1, 2, 9999], device_slots=[0, 1, 2])
        with pytest.raises(pulseio.InvalidRequestError, match="repeat a destination"):
            engine.recall(host_ids=[1, 2, 3], device_slots=[0, 1, 1])
        assert engine.statistics().submitted == 0
    assert torch.equal(device.slots, before)


def test_pools_must_match(pools) -> None:
    host, _ = pools
    other = pulseio.DevicePool(host.backend, 8, 512)
    with pytest.raises(pulseio.InvalidRequestError, match=r"host blocks \(256 B\) and device slots \(512 B\)"):
        pulseio.DmaEngine(host, other)


def test_a_posted_task_is_a_resident_task(pools) -> None:
    host, device = pools
    with pulseio.DmaEngine(host, device) as engine:
        plan = engine._plan(Direction.H2D, [1], [1])
        with pytest.raises(pulseio.InvalidRequestError, match=r"^posted_task=3 is a RESIDENT task, the strategy"):
            engine._submit(plan, strategy=Strategy.ZERO_COPY, tag=None, stream_ordered=False, posted_task=3)
        assert engine.statistics().submitted == 0


def test_queued_transfers_merge_and_statistics_add_up(pools) -> None:
    host, device = pools
    gate = threading.Event()
    with pulseio.DmaEngine(host, device, DmaConfig(merge_blocks=64)) as engine:
        blocker = engine.recall(host_ids=[0], device_slots=[0], strategy=Strategy.GATHER_DMA)
        blocker.add_issued_callback(lambda _: gate.wait(5))  # hold the worker so the next ones queue up
        small = [engine.recall(host_ids=[8 * i + j for j in range(8)], device_slots=[8 * i + j for j in range(8)],
                               strategy=Strategy.GATHER_DMA) for i in range(1, 9)]
        gate.set()
        for t in small:
            assert t.wait(timeout=10)
        stats = engine.statistics()
        assert stats.submitted == stats.completed == 9 and stats.failed == 0 and stats.in_flight == 0
        assert stats.bytes_moved == 65 * 256
        assert stats.issues < 9, "queued transfers of one route should have been merged"
    assert torch.equal(device.slots[8:72], host.blocks[8:72])


def test_callbacks_run_once_and_late_callbacks_run_at_once(pools) -> None:
    host, device = pools
    seen: list[int] = []
    with pulseio.DmaEngine(host, device) as engine:
        t = engine.recall(host_ids=[5], device_slots=[5])
        t.add_done_callback(lambda tr: seen.append(tr.seq))
        t.wait(timeout=10)
        t.add_done_callback(lambda tr: seen.append(-tr.seq))
    assert seen == [t.seq, -t.seq]
    assert t.latency_s is not None and t.latency_s >= 0


def test_past_max_inflight_nowait_raises_and_the_waiting_form_waits(pools) -> None:
    host, device = pools
    gate = threading.Event()
    engine = pulseio.DmaEngine(host, device, DmaConfig(max_inflight=2))
    first = engine.recall(host_ids=[0], device_slots=[0])
    first.add_issued_callback(lambda _: gate.wait(5))
    engine.recall(host_ids=[1], device_slots=[1])
    with pytest.raises(pulseio.WouldBlock, match=r"2 transfers in flight, the limit is DmaConfig.max_inflight=2"):
        engine.recall_nowait(host_ids=[2], device_slots=[2])
    with pytest.raises(pulseio.WaitTimeout, match=r"^no room for a transfer within 0.05 s: 2 transfers in flight"):
        engine.offload(device_slots=[2], host_ids=[2], timeout=0.05)
    threading.Timer(0.05, gate.set).start()
    assert engine.recall(host_ids=[2], device_slots=[2], timeout=10).wait(timeout=10)  # waits for room
    engine.close()
    assert first.done()
    with pytest.raises(pulseio.ClosedError):
        engine.recall(host_ids=[3], device_slots=[3])


def test_a_failing_route_fails_only_its_transfers(pools, monkeypatch) -> None:
    host, device = pools
    with pulseio.DmaEngine(host, device) as engine:
        real_issue = engine._routes.issue

        def flaky(strategy, plans, after, emit, raise_on_landed=None, posted_task=None):
            if any(1 in p.host_ids for p in plans):
                raise RuntimeError("copy engine on fire")
            return real_issue(strategy, plans, after, emit, raise_on_landed, posted_task)

        monkeypatch.setattr(engine._routes, "issue", flaky)
        bad = engine.recall(host_ids=[1], device_slots=[1], tag="bad")
        with pytest.raises(pulseio.TransferError, match=r"tag='bad' failed: copy engine on fire"):
            bad.wait(timeout=10)
        assert bad.state is TransferState.FAILED
        good = engine.recall(host_ids=[2], device_slots=[2], tag="good")  # the engine keeps serving
        assert good.wait(timeout=10) and torch.equal(device.slots[2], host.blocks[2])
        assert engine.statistics().failed == 1


def test_a_planned_recall_submits_again_and_again_and_bad_ids_fail_when_planned(pools) -> None:
    host, device = pools
    with pulseio.DmaEngine(host, device) as engine:
        plan = engine.plan_recall(host_ids=np.arange(10, 20), device_slots=np.arange(5, 15))
        for round_ in range(3):
            host.blocks[10:20] = round_ + 1
            assert engine.submit(plan, strategy=Strategy.BATCHED).wait(timeout=10)
            assert torch.equal(device.slots[5:15], host.blocks[10:20]), round_
        with pytest.raises(pulseio.InvalidRequestError):
            engine.plan_recall(host_ids=[host.num_blocks], device_slots=[0])
        assert engine.statistics().submitted == 3


def test_a_failed_issue_ends_a_device_wait_at_once_with_its_cause(pools, monkeypatch) -> None:
    """Nobody has waited for the transfer or stepped the engine: the device wait must not hang on an issue
    that raised (it once waited forever for an issue that would never come)."""
    host, device = pools
    with pulseio.DmaEngine(host, device) as engine:
        def broken(*args, **kwargs):
            raise RuntimeError("cuMemcpyBatchAsync: invalid value")

        monkeypatch.setattr(engine._routes, "issue", broken)
        bad = engine.recall(host_ids=[1], device_slots=[1], tag="bad", strategy=Strategy.BATCHED)
        outcome: list[BaseException | None] = []

        def device_wait() -> None:
            try:
                bad.device_wait()
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - the outcome is the assertion
                outcome.append(exc)

        waiter = threading.Thread(target=device_wait, daemon=True)
        waiter.start()
        waiter.join(timeout=10)
        assert outcome, "device_wait hung on a transfer whose issue raised"
        assert isinstance(outcome[0], pulseio.TransferError) and "invalid value" in str(outcome[0])
        with pytest.raises(pulseio.TransferError, match="invalid value"):
            bad.wait(timeout=10)
        assert bad.state is TransferState.FAILED and engine.statistics().failed == 1


def test_auto_policy_picks_the_measured_best() -> None:
    def rec(strategy, count, gbps, kind="recall"):
        return {"kind": kind, "strategy": strategy, "direction": "h2d", "block_bytes": 8192,
                "num_blocks": count, "gbps": gbps}

    records = [rec("zero_copy", 64, 5.0), rec("gather_dma", 64, 1.0), rec("zero_copy", 4096, 40.0),
               rec("gather_dma", 4096, 50.0), rec("single_copy", 1, 9.0, kind="peak")]
    policy = AutoPolicy.from_records(records)
    assert policy.choose(Direction.H2D, 8192, 50) is Strategy.ZERO_COPY
    assert policy.choose(Direction.H2D, 8192, 3000) is Strategy.GATHER_DMA
    assert policy.choose(Direction.H2D, 65536, 3000) is Strategy.GATHER_DMA  # nearest measured block size
    assert policy.choose(Direction.D2H, 8192, 10) is Strategy.ZERO_COPY  # no D2H points: the fallback


def test_config_and_pool_errors_state_the_rule() -> None:
    with pytest.raises(ValueError, match=r"staging_buffers must be >= 2 so gather and DMA overlap, got 1"):
        DmaConfig(staging_buffers=1)
    with pytest.raises(ValueError, match=r"DmaConfig.zero_copy_ctas must be a positive int, got 0"):
        DmaConfig(zero_copy_ctas=0)
    with pytest.raises(pulseio.InvalidRequestError, match=r"block_bytes must be a positive multiple of 16, got 100"):
        pulseio.HostPool(pulseio.HostBackend(), 4, 100)
    with pytest.raises(pulseio.PoolTooSmallError, match=r"needs .* GiB, the machine has .* GiB available"):
        pulseio.HostPool(pulseio.HostBackend(), 1 << 40, 1 << 20)


def test_pool_views_check_the_block_shape() -> None:
    pool = pulseio.HostPool(pulseio.HostBackend(), 4, 64)
    assert pool.view(torch.bfloat16, 2, 16).shape == (4, 2, 16)
    with pytest.raises(pulseio.InvalidRequestError, match=r"takes 128 bytes, blocks here have 64"):
        pool.view(torch.float32, 32)


def test_a_submit_racing_close_is_refused_and_counted_not_lost(pools) -> None:
    """close() may begin between a submit's closed check and its hand-off: the transfer must then fail, not
    sit in a queue nobody reads (here the issuer is closed first, as a racing close would)."""
    host, device = pools
    engine = pulseio.DmaEngine(host, device)
    engine._issuer.close()
    with pytest.raises(pulseio.ClosedError, match=r"^this DmaEngine is closed$"):
        engine.recall(host_ids=[1], device_slots=[1], strategy=Strategy.GATHER_DMA)
    stats = engine.statistics()
    assert (stats.submitted, stats.failed, stats.in_flight) == (1, 1, 0)
    engine.close()


def test_a_host_pools_device_view_aliases_the_pool(pools) -> None:
    host, _ = pools
    view = host.device_view(torch.int32, 8, 8)                      # [512, 8, 8] int32 over 256 B blocks
    values = torch.arange(3 * 64, dtype=torch.int32).view(3, 8, 8)
    view.index_copy_(0, torch.tensor([5, 0, 511]), values)
    assert view.device == host.backend.device
    assert torch.equal(host.view(torch.int32, 8, 8)[[5, 0, 511]], values)
    with pytest.raises(pulseio.InvalidRequestError, match="takes 128 bytes, blocks here have 256"):
        host.device_view(torch.int32, 4, 8)
