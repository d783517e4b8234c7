"""The resident copier's task ring on the host: its layout, posting, waiting, and the doorbell fast lane.

The GPU half is `pulseio/_cuda/resident_kernel.py`, whose module docstring has the protocol; the
layout constants live here because both halves need them and this side must import without CUDA.

`post` publishes a task word and promises it, then reads whether the kernel has offered to stop:
the store of the promise and the load of the stop word are separated by a full fence, which is
what makes the Dekker handshake with the kernel sound (x86 may otherwise let the load pass the
store). `wait_at_least` spins on a word the GPU writes, GIL released.

`forward` is the doorbell's fast lane: in one compiled call (GIL released) it reads requests from
the doorbell ring, validates them exactly as `make_plan` does, copies their ids into free task
slots and posts them. A request reaches the copy kernel a few microseconds after the poller sees
it, before any Python object exists for it; the poller builds those afterwards, off the critical
path. It stops at the first request it cannot take (not marked fast, invalid, too large, no free
slot), which the regular read then handles.
"""

from __future__ import annotations

from .atomics import NATIVE, fence_seq_cst, load_acquire, store_release
from .layout import OUT_COUNT, OUT_OFFSET, OUT_RAISED, OUT_STATE, OUT_STATUS, OUT_TASK, READ_OK, STATUS_OK
from .ring import read_one
from .validate import OK

CTRL_PROMISED, CTRL_STOPPED, CTRL_CLOSE = 0, 1, 2
CTRL_WORDS = 16  # its own 128-byte line
ENTRY_TASK, ENTRY_RAISE_AT, ENTRY_RAISE_TO, ENTRY_LANDED_NS = 0, 1, 2, 3
ENTRY_WORDS = 4
COUNT_BITS = 15
MAX_TASK_BLOCKS = (1 << COUNT_BITS) - 1
H2D, D2H = 0, 1


def pack_entry(seq, count, direction):
    """One word, so the kernel's leader learns a task with a single PCIe read: seq | direction | count."""
    return (seq << (COUNT_BITS + 1)) | (direction << COUNT_BITS) | count


def _post(entry_addr, word, promised_addr, seq, stopped_addr):
    """Publish `word` at entry_addr (0: none, a stream will write it), promise `seq`; returns the stop word."""
    if entry_addr != 0:
        store_release(entry_addr, word)
    store_release(promised_addr, seq)
    fence_seq_cst()
    return load_acquire(stopped_addr)


def _wait_at_least(addr, value, iterations):
    """Spin up to `iterations` loads until the int64 at addr is >= value; 1 if it is, else 0."""
    for _ in range(iterations):
        if load_acquire(addr) >= value:
            return 1
    return 0


def _forward(base, words, capacity, slot_words, max_blocks, next_seq, fast, num_host, num_slots,
             task_ids, entries, entries_addr, done, promised_addr, stopped_addr, task_seq, raise_at,
             out, ids_out, slots_out):
    """Forward doorbell requests next_seq, next_seq + 1, ... to the task ring while each can go.

    fast: [capacity] int64, fast[(seq - 1) % capacity] == seq marks request seq as allowed. task_ids:
    [slots, 2 * cap] int64; entries: [slots, ENTRY_WORDS] int64 at entries_addr; done: [slots] int64.
    task_seq: the last task posted. raise_at: a device word each task raises to its request's seq
    (0: none). out, ids_out, slots_out: as for `ring.read`, plus the task seq in OUT_TASK.
    Returns (requests forwarded, the stop word read after promising; -1 if none was forwarded).
    """
    slots, cap = task_ids.shape[0], task_ids.shape[1] // 2
    k, offset, seq, task = 0, 0, next_seq, task_seq
    while k < capacity and fast[(seq - 1) % capacity] == seq:
        m = read_one(base, words, capacity, slot_words, max_blocks, seq, out, k, ids_out, slots_out, offset)
        n = out[k, OUT_COUNT]
        if m < 0 or out[k, OUT_STATE] != READ_OK or out[k, OUT_STATUS] != STATUS_OK or not 0 < n <= cap:
            break
        ids, dst = ids_out[offset : offset + n], slots_out[offset : offset + n]
        tslot = task % slots  # the slot of task + 1
        if done[tslot] < task + 1 - slots or check_ids(ids, dst, num_host, num_slots, False)[0] != OK:
            break
        task_ids[tslot, :n] = ids
        task_ids[tslot, cap : cap + n] = dst
        entries[tslot, ENTRY_RAISE_AT] = raise_at
        entries[tslot, ENTRY_RAISE_TO] = seq
        task += 1
        store_release(entries_addr + 8 * (ENTRY_WORDS * tslot + ENTRY_TASK), pack_entry(task, n, H2D))
        out[k, OUT_TASK] = task
        out[k, OUT_RAISED] = 1 if raise_at != 0 else 0
        out[k, OUT_OFFSET] = offset
        offset += n
        k += 1
        seq += 1
    if k == 0:
        return 0, -1
    store_release(promised_addr, task)
    fence_seq_cst()
    return k, load_acquire(stopped_addr)


if NATIVE:
    from numba import njit

    from .validate import check_ids

    _jit = njit(nogil=True, cache=True)
    pack_entry = _jit(pack_entry)
    post = _jit(_post)
    wait_at_least = _jit(_wait_at_least)
    forward = _jit(_forward)
else:  # pragma: no cover - exercised where numba is absent: no fast lane
    post, wait_at_least, forward = _post, _wait_at_least, None
