"""Doorbell: a ring of request slots in host memory that a GPU kernel (or a CPU thread) writes and
one poller reads, with no CUDA call and no lock between them.

Some facts about host-mapped memory, and the protocol they lead to
-------------------------------------------------------------------
* On the CUDA backend the ring is plain cacheable pinned memory, registered with the driver and
  device-mapped: a kernel stores to it through its UVA address, the stores cross PCIe as posted
  writes and land in the CPU's coherent memory, where a polling core sees them (write-combined
  memory would be cheaper to write but uncached to read: wrong for something the CPU spins on).
* The GPU may make its stores visible to the CPU in any order. `threadfence_system()` orders a
  thread's earlier stores before its later ones *as seen by the CPU*; a block barrier then makes
  every thread's payload part of what thread 0 orders before its final store.
* So a producer (kernel or CPU thread) publishes request `seq` in slot `(seq - 1) % capacity` by:
  store -seq into the slot's seq word (busy); fence; store count, tag, timestamp, ids, destination
  slots; fence; store seq. The reader loads seq (acquire), reads the payload, fences, and loads
  seq again: equal means the payload it copied is that request's (a seqlock).
* Sequence numbers are monotone and never reset: 1, 2, 3, ... from a counter the producer
  increments atomically (on the GPU a device-memory word, so the publish kernel takes no
  host-passed value and can be captured in a CUDA graph). A slot's seq word tells the reader
  which request it holds: less than expected means not yet published; equal, ready; greater, the
  producer wrapped around the ring past the reader ("lapped") and the expected request is lost.
* Capacity rule: at most `capacity` requests may be published and not yet read. `Runtime` keeps
  it by admission (it counts the publishes it launches and refuses one that could lap, raising
  WouldBlock), so in a runtime a lap never happens; a raw producer that breaks the rule gets each
  overwritten request reported as lost (READ_LOST / READ_TORN), never a silent mix of payloads.
* Only one thread reads a Doorbell. Any number may publish.
* The reader never holds the GIL while it waits: it spins a bounded number of iterations inside
  a numba `nogil` function (atomic loads, which the compiler cannot hoist out of the loop), then
  sleeps with exponential backoff, and takes every request published since its last look in one
  call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._native.layout import (
    HEADER_WORDS,
    OUT_COLUMNS,
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
    SEQ,
    STATUS_BAD_COUNT,
    slot_words,
)
from .backend import HostMemory
from .errors import ClosedError, ConfigError, WaitTimeout, WouldBlock

_HEADER_BYTES = 128  # word 0: the CPU producers' counter; the rest reserved (own cache line)


@dataclass(frozen=True)
class RingLayout:
    """capacity slots, each holding up to max_blocks (block id, destination slot) pairs."""

    capacity: int
    max_blocks: int

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, int) or self.capacity < 2:
            raise ConfigError(f"a doorbell ring needs capacity >= 2 slots, got {self.capacity!r}")
        if not isinstance(self.max_blocks, int) or self.max_blocks < 1:
            raise ConfigError(f"a doorbell slot needs max_blocks >= 1, got {self.max_blocks!r}")

    @property
    def slot_words(self) -> int:
        return slot_words(self.max_blocks)

    @property
    def blocks_per_slot(self) -> int:
        """What a slot really holds: max_blocks rounded up to fill the slot's 128-byte lines (the
        publish kernel derives it from the row width, so reader and writers agree on it)."""
        return (self.slot_words - HEADER_WORDS) // 2

    @property
    def nbytes(self) -> int:
        return _HEADER_BYTES + self.capacity * self.slot_words * 8


@dataclass(frozen=True)
class Rung:
    """One request read from the ring. host_ids, device_slots: [count] int64 numpy (copies)."""

    seq: int
    tag: int
    host_ids: np.ndarray
    device_slots: np.ndarray
    published_ns: int  # the producer's timestamp as its publish began (%globaltimer on the GPU)
    seen_ns: int  # time.perf_counter_ns() when the reader saw it (the fast lane) or copied it
    error: str | None  # why the request cannot be served (lost to a lap, bad count); None if fine
    task: int = 0  # the resident copier task a fast-lane reader already posted it as; 0 if none
    raised: bool = False  # that task sets the request's wait word itself when it lands


# A compiled reader: (base, words, capacity, slot_words, max_blocks, next_seq, out, ids_out, slots_out) -> rows
# read, in the format of `_native.ring.read` (which is one).
Reader = Callable[..., int]
# A fast lane: a reader taking one more argument, `spin`: it first spins up to that many loads (>= 1) for
# request next_seq, returning -1 if it was not published; else the rows it took (0: it refused that request).
Lane = Callable[..., int]


@dataclass(frozen=True)
class DoorbellStatistics:
    """Counters of a Doorbell ring since it opened (a snapshot)."""

    capacity: int
    next_seq: int  # the next seq the reader expects
    delivered: int  # requests read intact
    lost: int  # requests overwritten (lapped) before or while being read
    wakeups: int  # waits that ended with requests to read
    spurious_wakeups: int  # waits that ended (timeout) with none
    batches: int  # reads that returned requests; delivered / batches is the mean batch size


def _padded(ids: np.ndarray, n: int) -> np.ndarray:
    out = np.full(n, -1, dtype=np.int64)
    out[: min(n, ids.size)] = ids[:n]
    return out


class Doorbell:
    """The request ring over `memory` (host memory of `layout.nbytes` bytes, device-mapped on CUDA)."""

    def __init__(self, memory: HostMemory, layout: RingLayout, *, spin_iterations: int = 20_000,
                 sleep_s: tuple[float, float] = (20e-6, 1e-3)) -> None:
        from ._native import ring  # numba compiles lazily; importing it touches no device

        ring.warm_up()
        self._ring = ring
        self.layout = layout
        self._memory: HostMemory | None = memory
        words = memory.tensor[: layout.nbytes].numpy().view(np.int64)
        words[:] = 0
        self.header = words[: _HEADER_BYTES // 8]  # [16] int64, host
        self.words = words[_HEADER_BYTES // 8 :]  # [capacity * slot_words] int64, host
        self.base = self.words.ctypes.data
        self.device_ptr = memory.device_ptr + _HEADER_BYTES  # slot 0 as the GPU addresses it
        self._spin = spin_iterations if ring.NATIVE else 1
        self._sleep = sleep_s
        self._next = 1
        self._out = np.zeros((layout.capacity, OUT_COLUMNS), dtype=np.int64)
        self._ids = np.zeros(layout.capacity * layout.blocks_per_slot, dtype=np.int64)
        self._slots = np.zeros_like(self._ids)
        self._counts = dict(delivered=0, lost=0, wakeups=0, spurious=0, batches=0)
        self._read_lock = threading.Lock()  # documents (and enforces) the single reader

    # -- producing (the CPU stand-in for the publish kernel) ---------------------------------

    def publish(self, host_ids: np.ndarray, device_slots: np.ndarray, *, tag: int = 0,
                count: int | None = None, stamp_ns: int | None = None) -> int:
        """Claim the next seq from the ring's counter and publish a request; returns its seq.

        host_ids, device_slots: [>= count] int64, host. Thread-safe, GIL released while writing.
        """
        seq = int(self._ring.claim(self.header.ctypes.data))
        self.publish_at(seq, host_ids, device_slots, tag=tag, count=count, stamp_ns=stamp_ns)
        return seq

    def publish_at(self, seq: int, host_ids: np.ndarray, device_slots: np.ndarray, *, tag: int = 0,
                   count: int | None = None, stamp_ns: int | None = None) -> None:
        """Publish request `seq` (its number chosen by the caller: testing, or a GPU-mirroring producer)."""
        self._check_open()
        ids = np.ascontiguousarray(host_ids, dtype=np.int64)
        slots = np.ascontiguousarray(device_slots, dtype=np.int64)
        n = int(ids.size if count is None else count)
        if 0 <= n <= self.layout.blocks_per_slot and (n > ids.size or n > slots.size):
            ids, slots = _padded(ids, n), _padded(slots, n)  # -1: what a kernel reading past the end gets wrong
        stamp = time.perf_counter_ns() if stamp_ns is None else stamp_ns
        self._ring.write_slot(self.base, self.words, self.layout.capacity, self.layout.slot_words,
                              self.layout.blocks_per_slot, seq, ids, slots, n, int(tag), stamp)

    # -- reading (one thread) ------------------------------------------------------------------

    def poll_nowait(self) -> list[Rung]:
        """Every request published since the last read, in seq order. Raises WouldBlock if none."""
        rungs = self._read()
        if not rungs:
            raise WouldBlock(f"no request published at seq {self._next} yet")
        return rungs

    def wait_rung(self, timeout: float | None = None, *, lane: Lane | None = None) -> list[Rung]:
        """Wait until a request is published, then read them all; raises WaitTimeout after `timeout` s.

        Spins `spin_iterations` atomic loads with the GIL released, then sleeps with backoff.
        lane: a compiled reader that does the spinning and takes the leading requests it can serve
        itself the moment they are published (their Rung.task is set); the regular read takes the rest
        (the resident copier's fast lane).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        sleep = self._sleep[0]
        while True:
            self._check_open()
            if lane is not None:
                rungs = self._read_through(lane, self._spin)
            elif self._ring.spin(self.base, self.layout.capacity, self.layout.slot_words, self._next, self._spin):
                rungs = self._read()
            else:
                rungs = []
            if rungs:
                self._counts["wakeups"] += 1
                return rungs
            if deadline is not None and time.monotonic() >= deadline:
                self._counts["spurious"] += 1
                raise WaitTimeout(f"no request published at seq {self._next} within {timeout} s")
            time.sleep(sleep)
            sleep = min(2 * sleep, self._sleep[1])

    def _read_through(self, lane: Lane, spin: int) -> list[Rung]:
        """Everything published, the lane taking all it can (its first call spinning up to `spin` loads for
        the next request): a request it refuses is read alone and the lane goes on after it (reading the
        rest the regular way would race with requests still arriving)."""
        rungs: list[Rung] = []
        while True:
            k, taken = self._read_counted(lane, spin)
            if k < 0:  # nothing published (one arriving now is the lane's on the next call, not read_head's)
                return rungs
            if k == 0:  # the lane refused the next request
                taken = self._read(self._ring.read_head)
            if not taken:
                return rungs
            rungs += taken
            spin = 1

    def _read(self, reader: Reader | None = None, spin: int | None = None) -> list[Rung]:
        """Read with `reader` (default: all published); spin: passed to a lane."""
        return self._read_counted(reader, spin)[1]

    def _read_counted(self, reader: Reader | None = None, spin: int | None = None) -> tuple[int, list[Rung]]:
        """`_read`, with the reader's count: a lane returns -1 if nothing was published, 0 if it refused the
        next request."""
        with self._read_lock:
            self._check_open()
            args = (self.base, self.words, self.layout.capacity, self.layout.slot_words, self.layout.blocks_per_slot,
                    self._next, self._out, self._ids, self._slots)
            if spin is None:
                k = int((reader or self._ring.read)(*args))
            else:
                assert reader is not None, "a spin is passed to a lane only"
                k = int(reader(*args, spin))
            if k <= 0:
                return k, []
            seen = time.perf_counter_ns()
            rungs = [self._rung(row, seen) for row in self._out[:k].tolist()]
            self._next += k
            lost = int(np.count_nonzero(self._out[:k, OUT_STATE] != READ_OK))
            self._counts["lost"] += lost
            self._counts["delivered"] += k - lost
            self._counts["batches"] += 1
            return k, rungs

    def _rung(self, row: list[int], seen_ns: int) -> Rung:
        seq, state, n, at = row[OUT_SEQ], row[OUT_STATE], row[OUT_COUNT], row[OUT_OFFSET]
        error = None
        if state != READ_OK:
            how = "before" if state == READ_LOST else "while"
            error = (f"doorbell request seq={seq} was overwritten {how} the poller read it: more than "
                     f"capacity={self.layout.capacity} requests were published ahead of the reader; "
                     "keep fewer in flight or make the ring larger")
            n = 0
        elif row[OUT_STATUS] == STATUS_BAD_COUNT:
            error = (f"doorbell request seq={seq} tag={row[OUT_TAG]} asked for {n} blocks; a request "
                     f"holds 0..{self.layout.blocks_per_slot} (max_blocks_per_request)")
            n = 0
        return Rung(seq=seq, tag=row[OUT_TAG] if state == READ_OK else -1,
                    host_ids=self._ids[at : at + n].copy(), device_slots=self._slots[at : at + n].copy(),
                    published_ns=row[OUT_STAMP], seen_ns=row[OUT_SEEN] or seen_ns, error=error, task=row[OUT_TASK],
                    raised=bool(row[OUT_RAISED]))

    def slot_state(self, seq: int) -> str:
        """What request seq's slot holds now, in words (for errors about a request that never arrived);
        reads one word, no lock: a snapshot."""
        if self._memory is None:
            return "closed"
        held = int(self.words[((seq - 1) % self.layout.capacity) * self.layout.slot_words + SEQ])
        if held == seq:
            state = "published"
        elif held == -seq:
            state = "being published (the publish kernel started and has not finished)"
        elif abs(held) < seq:
            state = f"not published (the slot still holds seq {abs(held)})"
        else:
            state = f"overwritten by seq {abs(held)}"
        return f"doorbell slot of seq {seq}: {state}; the poller reads seq {self._next} next"

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        return self._next

    def statistics(self) -> DoorbellStatistics:
        c = self._counts
        return DoorbellStatistics(capacity=self.layout.capacity, next_seq=self._next, delivered=c["delivered"],
                                  lost=c["lost"], wakeups=c["wakeups"], spurious_wakeups=c["spurious"],
                                  batches=c["batches"])

    def _check_open(self) -> None:
        if self._memory is None:
            raise ClosedError("this Doorbell is closed")

    def close(self) -> None:
        """Release the ring memory. Only once no producer can still write it (the Runtime ensures that)."""
        with self._read_lock:
            if self._memory is not None:
                self._memory.close()
                self._memory = None
