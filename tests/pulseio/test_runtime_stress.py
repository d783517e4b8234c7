"""10k recalls posted from many threads, served by several I/O workers that finish in random order."""

from __future__ import annotations

import threading

import numpy as np
import torch

import pulseio
from pulseio import RuntimeConfig
from pulseio.testing import DelayedBackend

PRODUCERS, PER_PRODUCER = 4, 2500


def test_10k_posts_from_many_threads_complete_with_their_own_data() -> None:
    cfg = RuntimeConfig(device="cpu", host_blocks=4096, device_slots=PRODUCERS * PER_PRODUCER, block_bytes=16,
                        ring_slots=256, max_blocks_per_request=4, io_workers=4, spin_iterations=2000)
    backend = DelayedBackend(max_delay_s=200e-6, seed=7)
    with pulseio.open_runtime(cfg, backend=backend) as rt:
        rt.host_pool.view(torch.int32, 4)[:, 0] = torch.arange(4096, dtype=torch.int32)
        posted: list[list[pulseio.Completion]] = [[] for _ in range(PRODUCERS)]
        order: list[int] = []
        order_lock = threading.Lock()
        chosen = np.full(PRODUCERS * PER_PRODUCER, -1, dtype=np.int64)  # the block each slot must receive

        def produce(p: int) -> None:
            rng = np.random.default_rng(p)
            for i in range(PER_PRODUCER):
                slot = p * PER_PRODUCER + i
                block = rng.integers(0, 4096, size=1)
                chosen[slot] = block[0]
                c = rt.post_recall(host_ids=block, device_slots=np.array([slot]), tag=slot)
                c.add_done_callback(lambda c: (order_lock.acquire(), order.append(c.seq), order_lock.release()))
                posted[p].append(c)

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        everything = [c for cs in posted for c in cs]
        assert all(c.wait(timeout=60) for c in everything)
        landed = rt.device_pool.view(torch.int32, 4)[:, 0].numpy().copy()
        stats = rt.statistics()
        words_set = all(rt._words.reached(seq) for seq in range(1, PRODUCERS * PER_PRODUCER + 1))
    total = PRODUCERS * PER_PRODUCER
    assert sorted(c.seq for c in everything) == list(range(1, total + 1))
    assert sorted(order) == list(range(1, total + 1)) and order != sorted(order), "completions came in order"
    counts = (stats.submitted, stats.completed, stats.failed, stats.in_flight, stats.doorbell.lost)
    assert counts == (total, total, 0, 0, 0)
    assert words_set  # every request's wait word was set
    np.testing.assert_array_equal(landed, chosen)  # every slot received the block its producer chose
