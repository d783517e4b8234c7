"""Many producer threads claim seqs from the ring's counter while one reader drains it."""

from __future__ import annotations

import threading

import numpy as np

from pulseio.testing import ManualDoorbell

PRODUCERS, PER_PRODUCER, CAPACITY = 8, 1250, 64


def test_many_producers_10k_publishes_each_delivered_once_intact() -> None:
    bell = ManualDoorbell(capacity=CAPACITY, max_blocks=8, spin_iterations=2000)
    claimed = [0]
    lock = threading.Lock()

    def produce(p: int) -> None:
        for i in range(PER_PRODUCER):
            while True:  # stay inside the ring: the capacity rule the Runtime enforces by admission
                with lock:
                    if claimed[0] - (bell.next_seq - 1) < CAPACITY:
                        claimed[0] += 1
                        break
            tag = p * 1_000_000 + i
            n = i % 8 + 1
            bell.publish(np.full(n, tag, dtype=np.int64), np.arange(n), tag=tag)

    seen: list[int] = []
    tags: set[int] = set()

    def consume() -> None:
        while len(seen) < PRODUCERS * PER_PRODUCER:
            for rung in bell.wait_rung(timeout=5.0):
                assert rung.error is None, rung.error
                assert rung.host_ids.tolist() == [rung.tag] * (rung.tag % 1_000_000 % 8 + 1)
                seen.append(rung.seq)
                tags.add(rung.tag)

    reader = threading.Thread(target=consume)
    reader.start()
    producers = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    for t in producers:
        t.start()
    for t in producers:
        t.join()
    reader.join(timeout=60)
    assert seen == list(range(1, PRODUCERS * PER_PRODUCER + 1))
    assert len(tags) == PRODUCERS * PER_PRODUCER
    assert bell.statistics().lost == 0
