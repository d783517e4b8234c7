"""`pulseio.frozen_heap` and `pulseio.GCPauses`: what is alive on entry is out of collection until the block ends;
every collection inside the counter is counted by generation, none after."""

from __future__ import annotations

import gc
import weakref

import pulseio


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    """An unreachable reference cycle, only collectable by the garbage collector; -> a weak reference to it."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_the_heap_alive_on_entry_is_frozen_until_the_block_ends() -> None:
    kept = [_Node() for _ in range(1000)]
    garbage = _cycle()
    assert gc.get_freeze_count() == 0
    with pulseio.frozen_heap():
        assert garbage() is None, "entering collects first: no garbage is frozen in"
        assert gc.get_freeze_count() >= len(kept)
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in tracked for o in kept), "a collection walks none of what was frozen"
        later = _Node()
        assert id(later) in {id(o) for o in gc.get_objects()}, "what the block allocates is collected as usual"
        inside = _cycle()
        gc.collect()
        assert inside() is None
    assert gc.get_freeze_count() == 0
    tracked = {id(o) for o in gc.get_objects()}
    assert all(id(o) in tracked for o in kept)


def test_every_collection_is_counted_by_generation_while_entered() -> None:
    with pulseio.GCPauses() as pauses:
        before = pauses.statistics()
        assert before == pulseio.GCPauseStatistics((0, 0, 0), 0.0, 0.0)
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
        seen = pauses.statistics()
    gc.collect(1)
    assert pauses.statistics() == seen, "nothing counted after the block"
    assert seen.collections[2] == 2 and seen.collections[0] >= 1    # (the allocator may trigger more of gen 0/1)
    assert seen.paused_s >= seen.longest_s > 0
    assert pauses._callback not in gc.callbacks
