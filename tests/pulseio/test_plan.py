"""TransferPlan validation (the rule, the value, nothing queued) and coalescing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pulseio import Direction, InvalidRequestError, PoolTooSmallError
from pulseio.plan import make_plan, merge_plans, pieces, split_runs


def _plan(host, slots, direction=Direction.H2D, *, blocks=100, num_slots=50):
    return make_plan(direction, host, slots, num_host_blocks=blocks, num_device_slots=num_slots, block_bytes=64)


def test_ids_become_int64_arrays_from_lists_numpy_and_torch() -> None:
    for host in ([3, 1, 2], np.array([3, 1, 2], dtype=np.int16), torch.tensor([3, 1, 2], dtype=torch.int32)):
        plan = _plan(host, [0, 1, 2])
        assert plan.host_ids.dtype == np.int64
        assert plan.host_ids.tolist() == [3, 1, 2]
        assert plan.nbytes == 3 * 64


def test_out_of_range_id_names_position_value_and_pool() -> None:
    rule = r"^host_ids\[1\] = 100 is out of range: the host pool has ids 0\.\.99$"
    with pytest.raises(InvalidRequestError, match=rule):
        _plan([5, 100], [0, 1])
    rule = r"device_slots\[0\] = -1 is out of range.*\(2 ids out of range in all\)"
    with pytest.raises(InvalidRequestError, match=rule):
        _plan([5, 6], [-1, 50])


def test_duplicate_destination_is_refused_with_both_positions() -> None:
    with pytest.raises(InvalidRequestError, match=r"device_slots\[1\] and device_slots\[3\] are both 7"):
        _plan([1, 2, 3, 4], [0, 7, 8, 7])
    # offload: the host blocks are the destination, device slots may repeat
    with pytest.raises(InvalidRequestError, match=r"host_ids\[0\] and host_ids\[2\] are both 9"):
        _plan([9, 2, 9], [0, 1, 2], Direction.D2H)
    assert _plan([9, 2, 8], [0, 0, 2], Direction.D2H).num_blocks == 3
    assert _plan([4, 4], [0, 1]).num_blocks == 2  # recalling one block into two slots is fine


def test_mismatched_lengths_dtypes_devices_and_shapes() -> None:
    with pytest.raises(InvalidRequestError, match=r"same length, got 2 and 3"):
        _plan([1, 2], [1, 2, 3])
    with pytest.raises(TypeError, match=r"host_ids must have an integer dtype, got float32"):
        _plan(np.array([1.0, 2.0], dtype=np.float32), [1, 2])
    with pytest.raises(TypeError, match=r"integer dtype, got bool"):
        _plan(np.array([True]), [1])
    with pytest.raises(InvalidRequestError, match=r"one-dimensional, got shape \(1, 2\)"):
        _plan([[1, 2]], [1, 2])
    with pytest.raises(InvalidRequestError, match=r"device_slots must be on the host, got a tensor on meta"):
        _plan([1], torch.zeros(1, dtype=torch.int64, device="meta"))


def test_recall_larger_than_the_device_pool_is_refused() -> None:
    rule = r"a recall of 60 blocks needs as many device slots, the device pool has 50"
    with pytest.raises(PoolTooSmallError, match=rule):
        _plan(np.arange(60), np.arange(60))


def test_runs_coalesce_pairs_consecutive_on_both_sides() -> None:
    plan = _plan([10, 11, 12, 40, 20, 21], [0, 1, 2, 9, 5, 7])
    host, slot, length = plan.runs
    got = sorted(zip(host.tolist(), slot.tolist(), length.tolist()))
    assert got == [(10, 0, 3), (20, 5, 1), (21, 7, 1), (40, 9, 1)]
    assert int(length.sum()) == plan.num_blocks


@pytest.mark.parametrize("segment", [1, 3, 7, 16, 1000])
def test_split_runs_never_span_a_segment_and_keep_every_pair(segment: int) -> None:
    """The host pool is pinned in segments; the copy engine refuses one DMA over two (seen on the H200)."""
    host = np.concatenate([np.arange(s, s + n) for s, n in ((0, 5), (14, 20), (61, 1), (70, 29))])
    slots = np.arange(host.size) + 3
    plan = _plan(host, slots, num_slots=200)
    start, slot, length = split_runs(*plan.runs, segment)
    assert (length >= 1).all()
    assert (start // segment == (start + length - 1) // segment).all()  # inside one segment each
    pairs = sorted((int(h), int(d)) for a, b, n in zip(start, slot, length) for h, d in zip(range(a, a + n),
                                                                                              range(b, b + n)))
    assert pairs == sorted(zip(host.tolist(), slots.tolist()))
    if segment >= 1000:
        assert length.size == plan.runs[2].size  # nothing to cut: the runs as they were


def test_a_plan_cuts_its_runs_at_segments_once() -> None:
    plan = _plan(np.arange(10, 40), np.arange(30), num_slots=200)
    cut = plan.runs_within(16)
    assert [a.tolist() for a in cut] == [a.tolist() for a in split_runs(*plan.runs, 16)] == [[10, 16, 32],
                                                                                              [0, 6, 22], [6, 16, 8]]
    assert plan.runs_within(16) is cut                                   # submitted again: not cut again
    assert plan.runs_within(1000)[2].tolist() == [30]                    # another pool's segments: cut anew


def test_host_pool_segments_are_whole_blocks() -> None:
    from pulseio.memory import segment_bytes

    assert segment_bytes(65536) == 1 << 30
    assert segment_bytes(3 * 4096) % (3 * 4096) == 0 and segment_bytes(3 * 4096) <= 1 << 30
    assert segment_bytes(3 << 30) == 3 << 30  # a block larger than the target is one segment
    with pytest.raises(ValueError, match="unit_bytes"):
        segment_bytes(0)


def test_merge_and_pieces_keep_every_pair_once() -> None:
    a, b = _plan([1, 2, 3], [0, 1, 2]), _plan([7, 8], [3, 4])
    merged = merge_plans([a, b])
    assert merged.host_ids.tolist() == [1, 2, 3, 7, 8]
    parts = pieces(merged, 2)
    assert [len(h) for h, _ in parts] == [2, 2, 1]
    assert np.concatenate([s for _, s in parts]).tolist() == [0, 1, 2, 3, 4]


def test_compiled_validation_agrees_with_a_plain_reference() -> None:
    from pulseio._native import validate

    if not validate.NATIVE:
        import pytest as _pytest

        _pytest.skip("numba is not installed: plan.py validates with numpy only")
    rng = np.random.default_rng(11)
    for trial in range(300):
        n = int(rng.integers(1, 40))
        host = rng.integers(-2, 34, n)
        slots = rng.integers(-2, 22, n)
        unique_host = bool(trial % 2)
        dst = host if unique_host else slots
        in_range = (host >= 0).all() and (host < 32).all() and (slots >= 0).all() and (slots < 20).all()
        expected_ok = in_range and len(set(dst.tolist())) == n
        code, pos = validate.check_ids(host, slots, 32, 20, unique_host)
        assert (code == validate.OK) == expected_ok, (host, slots, unique_host)
        if code == validate.REPEAT:
            assert dst[pos] in dst[:pos]
