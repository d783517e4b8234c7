"""The resident copier's task ring on the host: its layout, posting, waiting, and the doorbell fast lane.

The GPU half is `pulseio/_cuda/resident_kernel.py`, whose module docstring has the protocol; the
layout constants live here because both halves need them and this side must import without CUDA.

`post` writes a task (ids, raise target, task word) and promises it, then reads whether the kernel
has offered to stop: the store of the promise and the load of the stop word are separated by a full
fence, which is what makes the Dekker handshake with the kernel sound (x86 may otherwise let the
load pass the store). `wait_at_least` spins on a word the GPU writes, GIL released.

Posters hold the ring's lock, a ticket lock in the control line (`lock` / `unlock`), so that
compiled code can take it with no Python in between; the last task posted (CTRL_SEQ) lives there too.

`forward` is the doorbell's fast lane: in one compiled call (GIL released) it spins until the next
request is published, then reads requests from the doorbell ring, validates them exactly as
`make_plan` does, copies their ids into free task slots (or names the row of the publisher's device
mirror that holds them) and posts them. A request reaches the copy
kernel a few hundred nanoseconds after the poller sees it, before any Python runs for it; the poller
builds its objects afterwards, off the critical path. It stops at the first request it cannot take
(not marked fast, invalid, too large, no free slot), which the regular read then handles.
"""

from __future__ import annotations

import time

from .atomics import NATIVE, fence_seq_cst, fetch_add, load_acquire, store_release
from .clock import monotonic_ns
from .layout import OUT_COUNT, OUT_OFFSET, OUT_RAISED, OUT_SEEN, OUT_STATE, OUT_STATUS, OUT_TASK, READ_OK, STATUS_OK
from .ring import read_one, spin
from .validate import OK

CTRL_PROMISED, CTRL_STOPPED, CTRL_CLOSE = 0, 1, 2  # shared with the kernel
CTRL_TICKET, CTRL_SERVING, CTRL_SEQ = 3, 4, 5  # host only: the posters' ticket lock, the last task posted
CTRL_LAUNCHED = 6  # host: the last server generation launched; an earlier one stops as soon as it may (kernel doc)
CTRL_WORDS = 16  # its own 128-byte line
ENTRY_TASK, ENTRY_RAISE_AT, ENTRY_RAISE_TO, ENTRY_LANDED_NS, ENTRY_TAKEN_NS, ENTRY_EARLY_NS = 0, 1, 2, 3, 4, 5
ENTRY_WORDS = 6
COUNT_BITS = 15
MAX_TASK_BLOCKS = (1 << COUNT_BITS) - 1
MIRROR_BIT = COUNT_BITS + 1  # the task's ids are in the publisher's device mirror, row ROW (a doorbell request)
ROW_SHIFT, ROW_BITS = MIRROR_BIT + 1, 12
MAX_MIRROR_ROWS = 1 << ROW_BITS
SEQ_SHIFT = ROW_SHIFT + ROW_BITS
SEQ_MASK = (1 << (63 - SEQ_SHIFT)) - 1  # the task word keeps its seq modulo 2**34: enough to tell a slot's laps
H2D, D2H = 0, 1


def pack_entry(seq, count, direction, row=-1):
    """One word, so the kernel's leader learns a task with a single PCIe read: seq (modulo 2**34) | mirror
    row | mirrored | direction | count. row >= 0: the ids are in row `row` of the device mirror, not in
    the task's slot."""
    mirrored = (1 << MIRROR_BIT) | (row << ROW_SHIFT) if row >= 0 else 0
    return ((seq & SEQ_MASK) << SEQ_SHIFT) | mirrored | (direction << COUNT_BITS) | count


def entry_holds(word, seq):
    """Whether a task word is task seq's (and not an earlier lap's in the same slot)."""
    return word >> SEQ_SHIFT == seq & SEQ_MASK


def _write_task(task_ids, entries, entries_addr, seq, host_ids, slots, direction, raise_at, raise_to, publish,
                row=-1):
    """Write task seq into its slot: ids (unless row >= 0: they are in that row of the device mirror),
    raise target, then (if publish; else a stream writes it later) the task word, released after them."""
    nslots, cap = task_ids.shape[0], task_ids.shape[1] // 2
    slot = (seq - 1) % nslots
    m = host_ids.shape[0]
    if row < 0:
        task_ids[slot, :m] = host_ids
        task_ids[slot, cap : cap + m] = slots
    entries[slot, ENTRY_RAISE_AT] = raise_at
    entries[slot, ENTRY_RAISE_TO] = raise_to
    entries[slot, ENTRY_EARLY_NS] = 0  # the server stamps it only for a request that landed early
    if publish:
        store_release(entries_addr + 8 * (ENTRY_WORDS * slot + ENTRY_TASK), pack_entry(seq, m, direction, row))


def _promise(ctrl, seq):
    """Record seq as the last task posted and promise it; returns the stop word, read behind a full fence."""
    store_release(ctrl + 8 * CTRL_SEQ, seq)
    store_release(ctrl + 8 * CTRL_PROMISED, seq)
    fence_seq_cst()
    return load_acquire(ctrl + 8 * CTRL_STOPPED)


def _post(ctrl, task_ids, entries, entries_addr, done, host_ids, slots, direction, raise_at, raise_to, publish,
          row=-1):
    """Post one task under the posters' lock (`write_task`, `promise`; row >= 0: the task names that row of
    the device mirror instead of carrying ids). Returns (seq, stop word read behind the promise), or (0, seq)
    if the task's slot still holds task seq - slots, not landed yet (nothing was written)."""
    nslots = task_ids.shape[0]
    lock(ctrl)
    seq = load_acquire(ctrl + 8 * CTRL_SEQ) + 1
    if done[(seq - 1) % nslots] < seq - nslots:
        unlock(ctrl)
        return 0, seq
    write_task(task_ids, entries, entries_addr, seq, host_ids, slots, direction, raise_at, raise_to, publish, row)
    stopped = promise(ctrl, seq)
    unlock(ctrl)
    return seq, stopped


def _wait_at_least(addr, value, iterations):
    """Spin up to `iterations` loads until the int64 at addr is >= value; 1 if it is, else 0."""
    for _ in range(iterations):
        if load_acquire(addr) >= value:
            return 1
    return 0


def _lock(ctrl):
    """Take the posters' ticket lock in the control line at ctrl (spinning, GIL released)."""
    ticket = fetch_add(ctrl + 8 * CTRL_TICKET, 1)
    while load_acquire(ctrl + 8 * CTRL_SERVING) != ticket:
        pass


def _unlock(ctrl):
    store_release(ctrl + 8 * CTRL_SERVING, load_acquire(ctrl + 8 * CTRL_SERVING) + 1)


def _forward(spin_loads, base, words, capacity, slot_words, max_blocks, next_seq, fast, num_host, num_slots,
             task_ids, entries, entries_addr, done, ctrl, raise_base, raise_slots, mirror_rows, row_task, out,
             ids_out, slots_out):
    """Spin up to spin_loads (>= 1) loads for doorbell request next_seq, then forward requests next_seq,
    next_seq + 1, ... to the task ring while each can go, under the posters' lock.

    fast: [capacity] int64, fast[(seq - 1) % capacity] == seq marks request seq as allowed; the lane
    clears the mark of each request it takes (so a holder of the posters' lock who finds the mark
    still set knows the lane has not taken it). task_ids: [slots, 2 * cap] int64; entries: [slots,
    ENTRY_WORDS] int64 at entries_addr; done: [slots] int64; ctrl: the control line's address.
    raise_base, raise_slots: the request's wait word, raise_base + 8 * ((seq - 1) % raise_slots), which
    its task sets to seq once landed (raise_base 0: none). mirror_rows > 0: the publish kernel also wrote
    request seq's ids into row (seq - 1) % mirror_rows of a device mirror, which the task then names
    instead of copying them (the copier reads them from device memory, not over PCIe), and row_task[row]
    records the task (a row must not be written again before that task has landed: `mirror_row_busy`).
    out, ids_out, slots_out: as for `ring.read`,
    plus OUT_TASK, OUT_RAISED and OUT_SEEN.
    Returns (requests forwarded, or -1 if next_seq was not published; the stop word read after
    promising, -1 if none was forwarded).
    """
    if not spin(base, capacity, slot_words, next_seq, spin_loads):
        return -1, -1
    seen = monotonic_ns()
    slots, cap = task_ids.shape[0], task_ids.shape[1] // 2
    k, offset, seq = 0, 0, next_seq
    lock(ctrl)
    task = load_acquire(ctrl + 8 * CTRL_SEQ)
    while k < capacity and fast[(seq - 1) % capacity] == seq:
        m = read_one(base, words, capacity, slot_words, max_blocks, seq, out, k, ids_out, slots_out, offset)
        n = out[k, OUT_COUNT]
        if m < 0 or out[k, OUT_STATE] != READ_OK or out[k, OUT_STATUS] != STATUS_OK or not 0 < n <= cap:
            break
        ids, dst = ids_out[offset : offset + n], slots_out[offset : offset + n]
        tslot = task % slots  # the slot of task + 1
        if done[tslot] < task + 1 - slots or check_ids(ids, dst, num_host, num_slots, False)[0] != OK:
            break
        task += 1
        raise_at = raise_base + 8 * ((seq - 1) % raise_slots) if raise_base != 0 else 0
        row = (seq - 1) % mirror_rows if mirror_rows > 0 else -1
        if row >= 0:
            row_task[row] = task
        write_task(task_ids, entries, entries_addr, task, ids, dst, H2D, raise_at, seq, True, row)
        fast[(seq - 1) % capacity] = 0
        out[k, OUT_TASK] = task
        out[k, OUT_RAISED] = 1 if raise_at != 0 else 0
        out[k, OUT_SEEN] = seen
        out[k, OUT_OFFSET] = offset
        offset += n
        k += 1
        seq += 1
    stopped = promise(ctrl, task) if k > 0 else -1
    unlock(ctrl)
    return k, stopped


if NATIVE:
    from numba import njit

    from .validate import check_ids

    _jit = njit(nogil=True, cache=True)
    pack_entry = _jit(pack_entry)
    entry_holds = _jit(entry_holds)
    lock = _jit(_lock)
    unlock = _jit(_unlock)
    write_task = _jit(_write_task)
    promise = _jit(_promise)
    post = _jit(_post)
    wait_at_least = _jit(_wait_at_least)
    forward = _jit(_forward)
else:  # pragma: no cover - exercised where numba is absent: no fast lane, a lock that yields the GIL
    post, wait_at_least, unlock, forward = _post, _wait_at_least, _unlock, None
    write_task, promise = _write_task, _promise

    def lock(ctrl: int) -> None:
        ticket = fetch_add(ctrl + 8 * CTRL_TICKET, 1)
        while load_acquire(ctrl + 8 * CTRL_SERVING) != ticket:
            time.sleep(0)


def warm_up() -> None:
    """Compile (or load from numba's cache) what the posters, the waiters, the host copier and the fast lane
    call, on a scratch ring, with the argument types they pass: a first call compiles for seconds, holding
    the GIL, and on the poller's thread that is seconds for which no request reaches a copier."""
    import numpy as np

    from .layout import OUT_COLUMNS, slot_words

    ctrl, done = np.zeros(CTRL_WORDS, np.int64), np.zeros(2, np.int64)
    entries, task_ids = np.zeros((2, ENTRY_WORDS), np.int64), np.zeros((2, 4), np.int64)
    ids, none = np.zeros(1, np.int64), np.zeros(0, np.int64)
    seq, _ = post(ctrl.ctypes.data, task_ids, entries, entries.ctypes.data, done, ids, ids, H2D, 0, 0, True, -1)
    entry_holds(int(pack_entry(seq, 1, H2D)), seq)
    wait_at_least(done.ctypes.data, 0, 1)
    lock(ctrl.ctypes.data)
    unlock(ctrl.ctypes.data)
    if forward is not None:   # nothing is published in `words`: it spins one load and returns
        words, out = np.zeros(2 * slot_words(1), np.int64), np.zeros((2, OUT_COLUMNS), np.int64)
        forward(1, words.ctypes.data, words, 2, slot_words(1), 1, 1, np.zeros(2, np.int64), 1, 1, task_ids, entries,
                entries.ctypes.data, done, ctrl.ctypes.data, 0, 1, 0, none, out, np.zeros(2, np.int64),
                np.zeros(2, np.int64))
