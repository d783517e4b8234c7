"""The watchdog (`pulseio._watchdog`): an item not landed by its deadline is expired, a landed one forgotten, and a
look takes items from the front only (what landed since the last look), never every item armed."""

from __future__ import annotations

import threading
import time
from contextlib import closing

from pulseio._watchdog import Watchdog


class Items:
    """Items by key: `landed` says which have landed, `expired` which the watchdog gave up on; `looks` counts the
    landed() calls."""

    def __init__(self) -> None:
        self.landed: set[int] = set()
        self.expired: list[int] = []
        self.looks = 0
        self.lock = threading.Lock()

    def is_landed(self, item: int) -> bool:
        with self.lock:
            self.looks += 1
            return item in self.landed

    def expire(self, item: int) -> None:
        with self.lock:
            self.expired.append(item)


class QuietWatchdog(Watchdog):
    """A watchdog whose own thread never looks: the test calls `_look` itself."""

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                self._cond.wait()


def _quiet(items: Items, timeout_s: float) -> closing[Watchdog]:
    """A `QuietWatchdog` over `items`, closed on leaving the block."""
    return closing(QuietWatchdog(landed=items.is_landed, expire=items.expire, timeout_s=timeout_s))


def test_a_look_forgets_the_landed_front_and_stops_at_the_first_item_neither_landed_nor_due() -> None:
    items = Items()
    with _quiet(items, timeout_s=60.0) as dog:
        dog.arm_all([(k, k) for k in range(1, 1001)])
        items.landed |= {1, 2, 3, 5}
        dog._look(time.monotonic())
        assert items.looks == 4, "1, 2, 3 landed and were forgotten; 4 has not and is not due: the look stops there"
        assert list(dog._armed) == list(range(4, 1001)) and items.expired == []
        items.landed.add(4)
        dog._look(time.monotonic())
        assert list(dog._armed)[0] == 6, "4 and 5 (which landed before) go, 6 stops the look"
        assert dog.expired == 0


def test_an_item_not_landed_by_its_deadline_is_expired_and_the_ones_behind_it_looked_at_in_turn() -> None:
    items = Items()
    with _quiet(items, timeout_s=0.05) as dog:
        dog.arm_all([(1, 1), (2, 2), (3, 3)])
        items.landed.add(2)
        dog._look(time.monotonic())
        assert items.expired == [] and list(dog._armed) == [1, 2, 3], "nothing due yet, 1 not landed"
        dog._look(time.monotonic() + 1.0)
        assert items.expired == [1, 3] and dog.expired == 2 and not dog._armed, "1 and 3 due, 2 landed"


def test_an_item_armed_again_moves_to_the_end_with_its_new_deadline() -> None:
    items = Items()
    with _quiet(items, timeout_s=10.0) as dog:
        dog.arm_all([(1, 1), (2, 2)])
        first = dog._armed[1][0]
        time.sleep(0.01)
        dog.arm(1, 1)
        assert list(dog._armed) == [2, 1] and dog._armed[1][0] > first
        dog._look(first + 1e-3)                 # 2 is due then (first: its deadline); 1, armed again later, is not
        assert items.expired == [2] and list(dog._armed) == [1]


def test_its_own_thread_expires_an_item_that_never_lands() -> None:
    items = Items()
    with closing(Watchdog(landed=items.is_landed, expire=items.expire, timeout_s=0.02, poll_s=1e-3)) as dog:
        dog.arm_all([(7, 7), (8, 8)])
        items.landed.add(8)
        deadline = time.monotonic() + 5.0
        while dog.expired == 0 and time.monotonic() < deadline:
            time.sleep(1e-3)
        assert items.expired == [7] and dog.expired == 1
        while dog._armed and time.monotonic() < deadline:
            time.sleep(1e-3)
        assert not dog._armed, "8 landed and was forgotten"
