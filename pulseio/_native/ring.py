"""The doorbell protocol on the CPU: claim a sequence number, write a slot, wait for and read slots.

Every function takes the ring as `words` ([capacity * slot_words] int64, host) plus `base`, the
address of words[0], for the atomic accesses. Compiled with `njit(nogil=True, cache=True)` when
numba is present, so a spinning poller does not hold the GIL; see `pulseio/doorbell.py` for the
ordering argument.
"""

from __future__ import annotations

from .atomics import NATIVE, fence_acquire, fence_release, fetch_add, load_acquire, store_release
from .layout import (
    COUNT,
    HEADER_WORDS,
    OUT_COUNT,
    OUT_OFFSET,
    OUT_RAISED,
    OUT_SEEN,
    OUT_SEQ,
    OUT_STAMP,
    OUT_STATE,
    OUT_STATUS,
    OUT_TAG,
    OUT_TASK,
    READ_LOST,
    READ_OK,
    READ_TORN,
    SEQ,
    STAMP,
    STATUS,
    STATUS_BAD_COUNT,
    STATUS_OK,
    TAG,
)


def _claim(counter_addr):
    """The next sequence number (1, 2, ...) from the counter at counter_addr."""
    return fetch_add(counter_addr, 1) + 1


def _write_slot(base, words, capacity, slot_words, max_blocks, seq, ids, slots, n, tag, stamp):
    """Publish request `seq`: mark the slot busy, write the payload, then release-store seq."""
    start = ((seq - 1) % capacity) * slot_words
    store_release(base + 8 * (start + SEQ), -seq)
    fence_release()  # the busy mark is visible before any payload word changes
    status = STATUS_OK
    m = n
    if n < 0 or n > max_blocks:
        status = STATUS_BAD_COUNT
        m = 0
    ids_at = start + HEADER_WORDS
    words[ids_at : ids_at + m] = ids[:m]
    words[ids_at + max_blocks : ids_at + max_blocks + m] = slots[:m]
    words[start + COUNT] = n
    words[start + TAG] = tag
    words[start + STAMP] = stamp
    words[start + STATUS] = status
    store_release(base + 8 * (start + SEQ), seq)
    return seq


def _spin(base, capacity, slot_words, next_seq, iterations):
    """Spin up to `iterations` loads until slot(next_seq) holds seq >= next_seq; 1 if it does, else 0."""
    addr = base + 8 * (((next_seq - 1) % capacity) * slot_words + SEQ)
    for _ in range(iterations):
        if load_acquire(addr) >= next_seq:
            return 1
    return 0


def _read_one(base, words, capacity, slot_words, max_blocks, seq, out, k, ids_out, slots_out, offset):
    """Read request seq into row k of out, its ids to ids_out[offset:] / slots_out[offset:].
    Returns -1 if seq is not yet published (row k untouched), else the number of ids copied."""
    start = ((seq - 1) % capacity) * slot_words
    seen = load_acquire(base + 8 * (start + SEQ))
    if -seq <= seen < seq:  # not yet published, or being published now
        return -1
    out[k, OUT_SEQ] = seq
    out[k, OUT_OFFSET] = offset
    out[k, OUT_COUNT] = 0
    out[k, OUT_TASK] = 0
    out[k, OUT_RAISED] = 0
    out[k, OUT_SEEN] = 0
    if seen != seq:  # a later request (or its busy mark) holds the slot: seq was lost
        out[k, OUT_STATE] = READ_LOST
        return 0
    n = words[start + COUNT]
    m = n if 0 <= n <= max_blocks else 0
    ids_at = start + HEADER_WORDS
    ids_out[offset : offset + m] = words[ids_at : ids_at + m]
    slots_out[offset : offset + m] = words[ids_at + max_blocks : ids_at + max_blocks + m]
    out[k, OUT_COUNT] = n
    out[k, OUT_TAG] = words[start + TAG]
    out[k, OUT_STAMP] = words[start + STAMP]
    status = words[start + STATUS]
    out[k, OUT_STATUS] = status if m == n else STATUS_BAD_COUNT
    fence_acquire()  # the payload reads above complete before the re-check below
    again = load_acquire(base + 8 * (start + SEQ))
    out[k, OUT_STATE] = READ_OK if again == seq else READ_TORN
    return m


def _read_head(base, words, capacity, slot_words, max_blocks, next_seq, out, ids_out, slots_out):
    """`read` of request next_seq alone (0 or 1 rows): what a fast lane refused, leaving it the rest."""
    m = read_one(base, words, capacity, slot_words, max_blocks, next_seq, out, 0, ids_out, slots_out, 0)
    return 0 if m < 0 else 1


def _read(base, words, capacity, slot_words, max_blocks, next_seq, out, ids_out, slots_out):
    """Read every request published from next_seq on, in order, up to `capacity` of them.

    out: [capacity, OUT_COLUMNS] int64; ids_out, slots_out: [capacity * max_blocks] int64.
    Row k describes seq next_seq + k; its ids are ids_out[offset : offset + count]. Returns rows written.
    """
    k = 0
    offset = 0
    while k < capacity:
        m = read_one(base, words, capacity, slot_words, max_blocks, next_seq + k, out, k, ids_out, slots_out, offset)
        if m < 0:
            break
        offset += m
        k += 1
    return k


if NATIVE:
    from numba import njit

    _jit = njit(nogil=True, cache=True)
    read_one = _jit(_read_one)
    claim = _jit(_claim)
    write_slot = _jit(_write_slot)
    spin = _jit(_spin)
    read = _jit(_read)
    read_head = _jit(_read_head)
else:  # pragma: no cover - exercised where numba is absent
    claim, write_slot, spin, read, read_one, read_head = _claim, _write_slot, _spin, _read, _read_one, _read_head



def warm_up() -> None:
    """Compile (or load from numba's cache) every function now, on a scratch ring, not on first use."""
    import numpy as np

    from .layout import OUT_COLUMNS, slot_words

    words, counter = np.zeros(2 * slot_words(1), dtype=np.int64), np.zeros(1, dtype=np.int64)
    ids = np.zeros(1, dtype=np.int64)
    out, ids_out, slots_out = np.zeros((2, OUT_COLUMNS), dtype=np.int64), np.zeros(2, np.int64), np.zeros(2, np.int64)
    seq = claim(counter.ctypes.data)
    write_slot(words.ctypes.data, words, 2, slot_words(1), 1, seq, ids, ids, 1, 0, 0)
    spin(words.ctypes.data, 2, slot_words(1), 1, 1)
    read(words.ctypes.data, words, 2, slot_words(1), 1, 1, out, ids_out, slots_out)
    read_head(words.ctypes.data, words, 2, slot_words(1), 1, 2, out, ids_out, slots_out)  # the fast lane's leftover


__all__ = ["NATIVE", "claim", "write_slot", "spin", "read", "read_one", "read_head", "warm_up"]
