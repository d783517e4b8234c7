"""Runtime on the CPU backend: the same ring, poller, workers, errors, shutdown and asyncio paths as on a GPU."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
import torch

import pulseio
from pulseio import ClosedError, RuntimeConfig, Strategy, TransferError, WouldBlock
from pulseio.testing import DelayedBackend

SMALL = RuntimeConfig(device="cpu", host_blocks=256, device_slots=64, block_bytes=64, ring_slots=8,
                      max_blocks_per_request=16, spin_iterations=2000)


def _runtime(**changes: object) -> pulseio.Runtime:
    rt = pulseio.open_runtime(dataclasses.replace(SMALL, **changes))
    rt.host_pool.blocks[:] = torch.arange(256, dtype=torch.uint8)[:, None]  # block b is all b
    return rt


@pytest.mark.parametrize(("field", "value", "message"), [
    ("ring_slots", 1, r"^RuntimeConfig.ring_slots must be an int >= 2, got 1$"),
    ("io_workers", 0, r"^RuntimeConfig.io_workers must be an int >= 1, got 0$"),
    ("block_bytes", 40, r"^RuntimeConfig.block_bytes must be a multiple of 16, got 40$"),
    ("strategy", "auto", r"^RuntimeConfig.strategy must be a pulseio.Strategy, got 'auto'$"),
    ("poll_sleep_s", (1e-3, 1e-4), r"^RuntimeConfig.poll_sleep_s must be \(first, longest\)"),
    ("close_timeout_s", 0, r"^RuntimeConfig.close_timeout_s must be > 0 seconds, got 0$"),
    ("device_wait_timeout_s", -1, r"^RuntimeConfig.device_wait_timeout_s must be > 0 seconds, got -1$"),
    ("max_outstanding", 4, r"^RuntimeConfig.max_outstanding=4 must be >= ring_slots=8"),
])
def test_config_rules(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(SMALL, **{field: value})


def test_post_recall_lands_the_blocks_and_reports_statistics() -> None:
    with _runtime() as rt:
        done = rt.post_recall(host_ids=np.array([5, 7, 9]), device_slots=np.array([0, 1, 2]), tag=11)
        assert done.wait(timeout=10) and done.tag == 11 and done.seq == 1
        assert rt.device_pool.slots[:3, 0].tolist() == [5, 7, 9]
        done.device_wait()  # host backend: returns once landed
        stats = rt.statistics()
    assert (stats.submitted, stats.completed, stats.failed, stats.in_flight) == (1, 1, 0, 0)
    assert stats.bytes_moved == 3 * 64 and stats.doorbell.wakeups >= 1
    assert stats.post_to_landed.count == 1 and stats.post_to_landed.p50_us > 0


@pytest.mark.parametrize(
    "strategy", [Strategy.PER_BLOCK, Strategy.GATHER_DMA, Strategy.ZERO_COPY, Strategy.RESIDENT, Strategy.BATCHED]
)
def test_every_strategy_serves_posted_recalls(strategy: Strategy) -> None:
    with _runtime(strategy=strategy) as rt:
        done = rt.post_recall(host_ids=np.array([3, 4, 200]), device_slots=np.array([10, 11, 12]), count=2)
        assert done.wait(timeout=10) and done.num_blocks == 2
        assert rt.device_pool.slots[10:13, 0].tolist()[:2] == [3, 4]


@pytest.mark.parametrize("strategy", [Strategy.AUTO, Strategy.RESIDENT])  # RESIDENT: the fast lane
def test_errors_travel_to_their_own_waiter_and_the_runtime_keeps_serving(strategy: Strategy) -> None:
    with _runtime(strategy=strategy) as rt:
        bad_id = rt.post_recall(host_ids=np.array([1, 999]), device_slots=np.array([0, 1]), tag=21)
        dup = rt.post_recall(host_ids=np.array([1, 2]), device_slots=np.array([4, 4]), tag=22)
        bad_count = rt.post_recall(host_ids=np.arange(4), device_slots=np.arange(4), count=torch.tensor([99]), tag=23)
        good = rt.post_recall(host_ids=np.array([8]), device_slots=np.array([9]), tag=24)
        with pytest.raises(TransferError, match=r"^doorbell request seq=1 tag=21: host_ids\[1\] = 999 is out of range"):
            bad_id.wait(timeout=10)
        with pytest.raises(TransferError, match=r"^doorbell request seq=2 tag=22: device_slots must not repeat"):
            dup.wait(timeout=10)
        with pytest.raises(TransferError, match=r"^doorbell request seq=3 tag=23 asked for 99 blocks"):
            bad_count.wait(timeout=10)
        assert good.wait(timeout=10) and rt.device_pool.slots[9, 0] == 8
        assert rt.statistics().failed == 3


def test_post_rules_raise_on_the_submitting_thread() -> None:
    with _runtime() as rt:
        with pytest.raises(pulseio.InvalidRequestError, match=r"^count=5 must be within 0..2"):
            rt.post_recall(host_ids=np.arange(2), device_slots=np.arange(2), count=5)
        with pytest.raises(TypeError, match=r"^tag must be an int"):
            rt.post_recall(host_ids=np.arange(2), device_slots=np.arange(2), tag="x")  # type: ignore[arg-type]


def test_a_post_waits_while_the_mirror_row_it_would_write_is_still_read_by_a_given_up_copy() -> None:
    class _Reader:  # a resident copier reading doorbell ids from a device mirror (GPU only): row 0 held
        def mirror_row_busy(self, request: int) -> int:
            return 42 if (request - 1) % 8 == 0 else 0

    with _runtime(max_outstanding=8) as rt:
        for i in range(8):
            assert rt.post_recall(host_ids=np.array([i]), device_slots=np.array([i])).wait(timeout=10)
        rt._mirror_reader = _Reader()  # what a CUDA runtime with an ids mirror holds
        with pytest.raises(WouldBlock, match=r"^request seq=1 was given up before it landed and its copy \(resident "
                                             r"task 42\) may still read its ids in the device mirror row that request "
                                             r"seq=9 would overwrite"):
            rt.post_recall_nowait(host_ids=np.array([1]), device_slots=np.array([1]))
        rt._mirror_reader = None
        assert rt.post_recall(host_ids=np.array([1]), device_slots=np.array([1])).wait(timeout=10)


def test_full_ring_raises_would_block_and_close_fails_the_unpublished() -> None:
    rt = _runtime(close_timeout_s=0.05)
    expected = rt.expect_published(8)  # nobody publishes them: the ring is full
    with pytest.raises(WouldBlock, match=r"^8 requests are posted and not yet read by the poller"):
        rt.post_recall_nowait(host_ids=np.arange(1), device_slots=np.arange(1))
    with pytest.raises(pulseio.WaitTimeout, match=r"^no room to post within 0.01 s: 8 requests are posted"):
        rt.post_recall(host_ids=np.arange(1), device_slots=np.arange(1), timeout=0.01)
    rt.doorbell.publish(np.array([3]), np.array([5]), tag=77)  # a kernel of ours publishes seq 1
    assert expected[0].wait(timeout=10) and expected[0].tag == 77
    rt.wait_ring_space(1, timeout=10)  # the poller read seq 1: room for one more
    rt.close()
    with pytest.raises(ClosedError):
        expected[1].wait(timeout=1)


def test_close_fails_requests_never_published() -> None:
    rt = _runtime(close_timeout_s=0.05)
    (never,) = rt.expect_published(1)
    rt.close()
    with pytest.raises(ClosedError, match="closed before this request was published"):
        never.wait(timeout=1)
    with pytest.raises(ClosedError, match=r"^this Runtime is closed$"):
        rt.post_recall(host_ids=np.arange(1), device_slots=np.arange(1))
    rt.close()  # idempotent


def test_timeout_leaves_the_request_running() -> None:
    backend = DelayedBackend(max_delay_s=0.2, seed=1)
    backend.delay = lambda: 0.2  # type: ignore[method-assign]
    cfg = dataclasses.replace(SMALL, block_bytes=64)
    with pulseio.open_runtime(cfg, backend=backend) as rt:
        rt.host_pool.blocks[:] = 3
        done = rt.post_recall(host_ids=np.array([1]), device_slots=np.array([2]))
        with pytest.raises(pulseio.WaitTimeout):
            done.wait(timeout=0.01)
        assert not done.done()
        assert done.wait(timeout=10) is done and rt.device_pool.slots[2, 0] == 3


def test_direct_recall_shares_the_completion_path() -> None:
    with _runtime() as rt:
        done = rt.recall(host_ids=[10, 11], device_slots=[0, 1], tag="direct")
        assert done.wait(timeout=10) and rt.device_pool.slots[:2, 0].tolist() == [10, 11]
        assert done.seq == 0 and rt.statistics().completed == 1


def test_await_in_asyncio_and_uvloop() -> None:
    async def main(rt: pulseio.Runtime) -> list[int]:
        loop_name = type(asyncio.get_running_loop()).__module__
        posted = [rt.post_recall(host_ids=np.array([i]), device_slots=np.array([i]), tag=i) for i in range(6)]
        bad = rt.post_recall(host_ids=np.array([10_000]), device_slots=np.array([7]), tag=99)
        results = await asyncio.gather(*posted)
        with pytest.raises(TransferError, match="tag=99"):
            await bad
        assert all(r.done() for r in results)
        return [loop_name, *(int(rt.device_pool.slots[i, 0]) for i in range(6))]

    with _runtime() as rt:
        names = pulseio.run_async(main(rt))
        assert names[0].startswith("uvloop") and names[1:] == list(range(6))
        assert asyncio.run(main(rt))[1:] == list(range(6))
        assert rt.statistics().loop_wakeups >= 2


def test_async_with_and_cancelled_await_keeps_the_request() -> None:
    async def main() -> None:
        backend = DelayedBackend(max_delay_s=0.1)
        backend.delay = lambda: 0.1  # type: ignore[method-assign]
        async with pulseio.open_runtime(SMALL, backend=backend) as rt:
            done = rt.post_recall(host_ids=np.array([1]), device_slots=np.array([2]))
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(done, timeout=0.01)
            assert not done.done()
            assert (await done) is done

    asyncio.run(main())


def test_the_fast_lane_posts_resident_requests_before_the_poller_builds_anything() -> None:
    """With RESIDENT and one worker, requests go from the ring to the resident copier's task ring in one
    compiled call (task_ring.forward); a bad request stops the lane and takes the regular path, and every
    request still completes in order with the right bytes."""
    with _runtime(strategy=Strategy.RESIDENT, ring_slots=16) as rt:
        copier = rt.workers[0].resident
        done = [rt.post_recall(host_ids=np.array([i, i + 100]), device_slots=np.array([2 * i, 2 * i + 1]), tag=i)
                for i in range(1, 9)]
        bad = rt.post_recall(host_ids=np.array([1, 9999]), device_slots=np.array([0, 1]), tag=9)
        after = rt.post_recall(host_ids=np.array([250]), device_slots=np.array([63]), tag=10)
        assert all(d.wait(timeout=10) for d in done) and after.wait(timeout=10)
        with pytest.raises(TransferError, match=r"^doorbell request seq=9 tag=9: host_ids\[1\] = 9999 is out of range"):
            bad.wait(timeout=10)
        assert copier.forwarded == 9  # every good one went through the lane; the bad one never does
        for i in range(1, 9):
            assert rt.device_pool.slots[2 * i, 0] == i and rt.device_pool.slots[2 * i + 1, 0] == i + 100
        assert rt.device_pool.slots[63, 0] == 250
        stats = rt.statistics()
        assert (stats.completed, stats.failed) == (9, 1) and stats.dma[0].by_strategy == {Strategy.RESIDENT: 9}


def test_resident_requests_carry_the_copiers_stamps_on_the_producers_clock() -> None:
    """A RESIDENT request's taken_ns / landed_ns are the copier's stamps (began the copy / landed); with
    published_ns (the producer's, same clock) they give publish -> taken -> landed as the device sees it,
    which the statistics summarize. Other routes have none."""
    with _runtime(strategy=Strategy.RESIDENT) as rt:
        done = [rt.post_recall(host_ids=np.array([i]), device_slots=np.array([i]), tag=i) for i in range(1, 6)]
        assert all(d.wait(timeout=10) for d in done)
        for d in done:
            assert None not in (d.published_ns, d.taken_ns, d.landed_ns)
            assert d.published_ns <= d.taken_ns <= d.landed_ns
            assert d.early_landed_ns is None, "the host's copier has no ids mirror: no request lands early"
        stats = rt.statistics()
        assert stats.publish_to_landed.count == stats.publish_to_taken.count == stats.copy_per_mib.count == 5
        assert stats.publish_to_early_landed.count == 0
        assert (stats.stamped_requests, stats.landed_early) == (5, 0)
        assert 0 <= stats.publish_to_taken.p50_us <= stats.publish_to_landed.p50_us
        per_mib = sorted((d.landed_ns - d.taken_ns) * 2**20 / d.nbytes / 1e3 for d in done)   # us a MiB, each
        assert stats.copy_per_mib.p50_us == pytest.approx(per_mib[2], abs=1e-3)
        assert stats.stamped_bytes == sum(d.nbytes for d in done) == 5 * rt.config.block_bytes
        spans = sum(d.landed_ns - d.published_ns for d in done) / 1e9
        assert stats.stamped_publish_to_landed_s == pytest.approx(spans) and spans > 0
        assert stats.publish_to_landed_gbps == pytest.approx(stats.stamped_bytes / spans / 1e9)
    with _runtime(strategy=Strategy.GATHER_DMA) as rt:
        other = rt.post_recall(host_ids=np.array([1]), device_slots=np.array([1]))
        assert other.wait(timeout=10) and other.landed_ns is None and other.taken_ns is None
        stats = rt.statistics()
        assert stats.publish_to_landed.count == stats.publish_to_taken.count == stats.copy_per_mib.count == 0
        assert (stats.stamped_bytes, stats.publish_to_landed_gbps) == (0, None)


def test_statistics_count_the_requests_that_landed_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """Of the stamped RESIDENT requests, those whose task carries an early-landing stamp are counted apart, and
    their publish -> landed early summarized: the share tells whether the ids mirror's path is the one taken."""
    from pulseio._resident import TaskEvent

    monkeypatch.setattr(TaskEvent, "early_landed_ns", lambda self: self.landed_ns() if self.seq % 3 == 0 else None)
    with _runtime(strategy=Strategy.RESIDENT) as rt:
        done = [rt.post_recall(host_ids=np.array([i]), device_slots=np.array([i]), tag=i) for i in range(1, 8)]
        assert all(d.wait(timeout=10) for d in done)
        early = [d for d in done if d.early_landed_ns is not None]
        assert [d.seq % 3 for d in early] == [0, 0] and len(done) == 7
        stats = rt.statistics()
        assert (stats.stamped_requests, stats.landed_early) == (7, 2)
        assert stats.publish_to_early_landed.count == 2
        spans = sorted((d.early_landed_ns - d.published_ns) / 1e3 for d in early)
        assert stats.publish_to_early_landed.p50_us == pytest.approx(sum(spans) / 2, abs=1e-3)


def test_recall_graph_needs_a_cuda_device() -> None:
    """Graph capture needs a GPU: on the host backend the refusal names why, before anything is captured."""
    with pulseio.open_runtime(pulseio.RuntimeConfig(device="cpu", host_blocks=8, device_slots=8,
                                                    block_bytes=64)) as rt:
        with pytest.raises(pulseio.ConfigError, match="needs a CUDA device: the host backend has no graphs"):
            rt.recall_graph()


def test_a_runtime_too_large_for_the_ids_mirror_says_so_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Past the mirror's bytes the resident copier reads ids over PCIe, a slower path: warned once per runtime, so a
    user with no logging set up sees it; within them the mirror holds a row per outstanding request, silently."""
    from pulseio.runtime import IDS_MIRROR_MAX_BYTES, _ids_mirror_rows

    class _Copier:
        reads_ids_mirror = True

    small = RuntimeConfig(max_outstanding=64, max_blocks_per_request=256)
    rows = IDS_MIRROR_MAX_BYTES // (2 * 8 * 4096) + 1                   # one row past the bytes at 4096 blocks
    large = RuntimeConfig(max_outstanding=rows, max_blocks_per_request=4096)
    with caplog.at_level("INFO", logger="pulseio"):
        assert _ids_mirror_rows(small, _Copier()) == 64 and not caplog.records
        assert _ids_mirror_rows(large, _Copier()) == 0
    (record,) = caplog.records
    assert record.levelname == "WARNING" and "no device mirror of doorbell ids" in record.getMessage()
