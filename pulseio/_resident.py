"""The RESIDENT route's task ring, host half: posting tasks, the doorbell's fast lane, waiting for them.

A resident copier is a copy loop that stays up and takes tasks from a ring in host memory (layout
and protocol: `pulseio/_native/task_ring.py`, `pulseio/_cuda/resident_kernel.py`). `TaskRing` owns
that ring and everything the host does with it; what serves it is a subclass:
`pulseio._cuda.resident.ResidentCopier` (a GPU kernel) or `HostResidentCopier` below (a thread, the
CPU backend's stand-in, so the route and the doorbell's fast lane run in CI).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ._native import task_ring as tr
from .backend import HostMemory, Pending
from .errors import ConfigError, PulseInternalError
from .plan import Direction, TransferPlan, pieces

_LINE = 16  # int64 words per 128-byte line
_SPIN = 1_000_000  # loads per GIL-free spin (~1 ms) before a waiter checks that the server is up


def _lines(words: int) -> int:
    return -(-words // _LINE) * _LINE


class TaskRing:
    """Tasks 1, 2, 3, ... posted into `slots` ring slots of up to `cap` blocks each. Thread-safe.

    Memory, int64 words: control line | entries [slots, ENTRY_WORDS] | done [slots] | ids [slots, 2 * cap].
    A post waits for the task `slots` before it to land (its slot), so at most `slots` are in flight.
    """

    reads_ids_mirror = False  # whether its server can read task ids from a device mirror (`read_ids_from`)

    def __init__(self, alloc_host: Callable[..., HostMemory], *, slots: int, cap: int) -> None:
        if not 1 <= cap <= tr.MAX_TASK_BLOCKS:
            raise ConfigError(f"a resident task holds 1..{tr.MAX_TASK_BLOCKS} blocks, got cap={cap}")
        tr.warm_up()  # compiled now, not by the poller's first request
        self.slots, self.cap = slots, cap
        entries_at = _LINE
        done_at = entries_at + _lines(tr.ENTRY_WORDS * slots)
        self._ids_at = done_at + _lines(slots)
        self._memory: HostMemory | None = alloc_host(8 * (self._ids_at + slots * 2 * cap), label="resident ring")
        words = self._memory.tensor.numpy().view(np.int64)
        words[:] = 0
        self._ctrl, self._done = words[:_LINE], words[done_at : done_at + slots]
        self._entries = words[entries_at : entries_at + tr.ENTRY_WORDS * slots].reshape(slots, tr.ENTRY_WORDS)
        self._ids = words[self._ids_at :].reshape(slots, 2 * cap)
        base = self._memory.tensor.data_ptr()  # host addresses: the host side's atomics use these
        self._entries_host, self._done_host = base + 8 * entries_at, base + 8 * done_at
        self._ctrl_host = base  # the control line: the routes' issuer and the fast lane post under its tr.lock
        self.forwarded = 0  # tasks the doorbell's fast lane posted
        self.mirror_rows = 0  # rows of a device mirror of doorbell ids the server reads (`read_ids_from`)
        self._row_task = np.zeros(0, np.int64)  # [mirror_rows]: the last task that named each row

    # -- posting -------------------------------------------------------------------------------------

    def post(self, direction: int, host_ids: np.ndarray, slots: np.ndarray, ordered_on: Any = None,
             raise_on_landed: tuple[int, int] | None = None, row: int = -1) -> TaskEvent:
        """Post one task: host_ids, slots: [m <= cap] int64, host. ordered_on: a CUDA stream handle; the task
        becomes visible to the server only when that stream reaches this point (None: at once).
        raise_on_landed: (address of an int64 the device can write, value): the server stores value there
        once the task has landed. row >= 0: the task names that row of the ids mirror (`fence_row`)."""
        raise_at, raise_to = raise_on_landed or (0, 0)
        while True:
            seq, stopped = tr.post(self._ctrl_host, self._ids, self._entries, self._entries_host, self._done,
                                   host_ids, slots, direction, raise_at, raise_to, ordered_on is None, row)
            if seq:
                break
            self.wait_sync(stopped - self.slots)  # the slot's previous task has not landed yet
        if ordered_on is not None:
            entry_at = self._entries_host + 8 * (tr.ENTRY_WORDS * ((seq - 1) % self.slots) + tr.ENTRY_TASK)
            self._post_on_stream(ordered_on, entry_at, int(tr.pack_entry(seq, len(host_ids), direction)))
        self._posted(stopped)
        return TaskEvent(self, seq)

    def post_plan(self, plan: TransferPlan, emit: Callable[[Pending], None], *, ordered_on: Any = None,
                  raise_on_landed: tuple[int, int] | None = None, posted_task: int | None = None) -> None:
        """A route's issue: post `plan` as tasks of at most `cap` blocks, each emitted as it is posted.
        Tasks land in order, so only the last raises the caller's word. posted_task: the doorbell's fast
        lane already posted the plan as that task: only emit it."""
        if posted_task is not None:
            emit(Pending(self.event(posted_task)))
            return
        direction = tr.H2D if plan.direction is Direction.H2D else tr.D2H
        if plan.num_blocks <= self.cap:  # the common case: one task
            emit(Pending(self.post(direction, plan.host_ids, plan.device_slots, ordered_on, raise_on_landed)))
            return
        parts = pieces(plan, self.cap)
        for k, (host_ids, slots) in enumerate(parts):
            raise_to = raise_on_landed if k == len(parts) - 1 else None
            emit(Pending(self.post(direction, host_ids, slots, ordered_on, raise_to)))

    def forwarder(self, fast: np.ndarray, num_host: int, num_slots: int, raise_base: int,
                  raise_slots: int) -> Callable[..., int] | None:
        """A doorbell fast lane (`Doorbell.wait_rung(lane=)`): spins for the next request, then posts the
        leading requests marked in `fast` as tasks, in one compiled call (`task_ring.forward`); each task
        sets its request's wait word (raise_base + 8 * ((seq - 1) % raise_slots); raise_base 0: none) to
        seq once landed. With an ids mirror (`mirror_rows`, whose rows are the wait words' slots) a task
        names its request's row instead of carrying its ids. Returns -1 if nothing was published, else the
        requests taken. None where numba is missing (the lane is compiled code)."""
        if tr.forward is None:
            return None
        raise_slots = max(raise_slots, 1)
        mirror_rows = self.mirror_rows
        if mirror_rows and (mirror_rows != raise_slots or raise_base == 0):
            raise PulseInternalError(f"an ids mirror of {mirror_rows} rows needs the wait words' {raise_slots} slots")

        def forward(base: int, words: np.ndarray, capacity: int, slot_words: int, max_blocks: int, next_seq: int,
                    out: np.ndarray, ids_out: np.ndarray, slots_out: np.ndarray, spin: int) -> int:
            k, stopped = tr.forward(spin, base, words, capacity, slot_words, max_blocks, next_seq, fast, num_host,
                                    num_slots, self._ids, self._entries, self._entries_host, self._done,
                                    self._ctrl_host, raise_base, raise_slots, mirror_rows, self._row_task, out,
                                    ids_out, slots_out)
            if k > 0:
                self.forwarded += k
                self._posted(stopped)
            return k

        return forward

    def unmark(self, fast: np.ndarray, seq: int) -> bool:
        """Under the posters' lock: if the fast lane has not taken request seq, clear its mark so it never
        will (it then goes the regular way, where the poller can still refuse it). True if cleared."""
        tr.lock(self._ctrl_host)
        try:
            index = (seq - 1) % len(fast)
            if fast[index] != seq:
                return False
            fast[index] = 0
            return True
        finally:
            tr.unlock(self._ctrl_host)

    # -- device waits ---------------------------------------------------------------------------------

    def serve_for(self, stream: Any, word_at: int, value: int) -> None:
        """A stream is about to wait on the device until the int64 at `word_at` reaches value, which a task
        of this ring will store once landed: make sure a server takes that task without a driver call
        after this one. Here that is waking the server (`_ensure_serving`); a GPU kernel launches for it."""
        self._ensure_serving()

    def describe(self) -> str:
        """The ring's state in one line, for errors about a task that did not land."""
        ctrl = self._ctrl
        return (f"task ring: last task posted {int(ctrl[tr.CTRL_SEQ])}, promised {int(ctrl[tr.CTRL_PROMISED])}, "
                f"landed up to {int(self._done.max())}, server generation that last offered to stop "
                f"{int(ctrl[tr.CTRL_STOPPED])}")

    def event(self, seq: int) -> TaskEvent:
        return TaskEvent(self, seq)

    # -- completion ----------------------------------------------------------------------------------

    def landed(self, seq: int) -> bool:
        return bool(self._done[(seq - 1) % self.slots] >= seq)

    def mirror_row_busy(self, request: int) -> int:
        """The task still to land that reads the ids-mirror row doorbell request `request` would write
        (`read_ids_from`), or 0 if the row is free. A finished request's task has landed, except one given
        up before it landed (the watchdog): its copy may still run, and must find its own ids there."""
        if not self.mirror_rows:
            return 0
        task = int(self._row_task[(request - 1) % self.mirror_rows])
        return 0 if task == 0 or self.landed(task) else task

    def fence_row(self, request: int) -> None:
        """Doorbell request `request` will not reach the copier as a task naming its ids-mirror row (the fast
        lane did not take it): post a task of no blocks that names the row. A server that copies requests
        early, as they are published (`resident_kernel.py`), copies none of this one after serving that
        task, and the row is written again only once it has landed (`mirror_row_busy`)."""
        if not self.mirror_rows:
            return
        row = (request - 1) % self.mirror_rows
        empty = np.zeros(0, np.int64)
        self._row_task[row] = self.post(tr.H2D, empty, empty, row=row).seq

    def landed_ns(self, seq: int) -> int | None:
        """The server's clock when task seq landed (%globaltimer on a GPU), while its slot still holds it."""
        return self._stamp(seq, tr.ENTRY_LANDED_NS)

    def taken_ns(self, seq: int) -> int | None:
        """The server's clock when it began task seq's copy, once landed and while its slot still holds it."""
        return self._stamp(seq, tr.ENTRY_TAKEN_NS)

    def early_landed_ns(self, seq: int) -> int | None:
        """The server's clock when task seq's request had landed early, every copy CTA having copied its part
        from the ids mirror before the task came (`resident_kernel`), once the task landed and while its slot
        still holds it; None for a task that landed by itself."""
        return self._stamp(seq, tr.ENTRY_EARLY_NS) or None

    def _stamp(self, seq: int, word: int) -> int | None:
        slot = (seq - 1) % self.slots
        stamp = int(self._entries[slot, word])
        return stamp if self._done[slot] == seq else None

    def wait_sync(self, seq: int) -> None:
        """Wait, GIL released, until task seq has landed."""
        addr = self._done_host + 8 * ((seq - 1) % self.slots)
        sleep = 0.0  # spin first: a task takes microseconds, and a sleep at least ~60 us on Linux
        while not tr.wait_at_least(addr, seq, _SPIN):
            self._check_running(seq)
            if sleep:
                time.sleep(sleep)
            sleep = min(max(2 * sleep, 50e-6), 1e-3)

    def device_wait(self, stream: Any, seq: int) -> None:
        """Make `stream` wait for task seq without the host waiting (where the server is a GPU kernel)."""
        self.wait_sync(seq)

    # -- what a server provides ------------------------------------------------------------------------

    def _posted(self, stopped: int) -> None:
        """After a post, given the stop word read behind the promise: make sure the server will see it."""

    def _ensure_serving(self) -> None:
        """Start the server if it stopped."""

    def _check_running(self, seq: int) -> None:
        """A waiter whose task is late: make sure the server is up; raise if it failed."""

    def _post_on_stream(self, stream_handle: int, entry_at: int, word: int) -> None:
        raise NotImplementedError("stream-ordered posting needs a CUDA stream")

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()
            self._memory = None


class TaskEvent:
    """A task's completion, with the torch.cuda.Event methods the routes' users call."""

    __slots__ = ("_ring", "seq")

    def __init__(self, ring: TaskRing, seq: int) -> None:
        self._ring, self.seq = ring, seq

    def query(self) -> bool:
        return self._ring.landed(self.seq)

    def synchronize(self) -> None:
        self._ring.wait_sync(self.seq)

    def landed_ns(self) -> int | None:
        """The server's clock when the task landed (see TaskRing.landed_ns)."""
        return self._ring.landed_ns(self.seq)

    def taken_ns(self) -> int | None:
        """The server's clock when it began the task's copy (see TaskRing.taken_ns)."""
        return self._ring.taken_ns(self.seq)

    def early_landed_ns(self) -> int | None:
        """The server's clock when the task's request landed early (see TaskRing.early_landed_ns)."""
        return self._ring.early_landed_ns(self.seq)

    def wait(self, stream: Any = None) -> None:
        """Make `stream` wait for the task (what torch's Stream.wait_event calls)."""
        self._ring.device_wait(stream, self.seq)


class HostResidentCopier(TaskRing):
    """The CPU backend's resident copier: a thread serves the ring the way the GPU kernel does (in
    order, raising a word and stamping each task as it lands), copying rows between two tensors."""

    def __init__(self, alloc_host: Callable[..., HostMemory], host: torch.Tensor, device: torch.Tensor, *,
                 slots: int, cap: int) -> None:
        super().__init__(alloc_host, slots=slots, cap=cap)
        self._host, self._device = host, device  # [blocks, block_bytes] uint8 each
        self._stop = threading.Event()
        self._work = threading.Event()  # set by every post: the server sleeps on it while the ring is empty
        self._thread = threading.Thread(target=self._serve, name="pulseio-host-resident", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        task = 1
        while True:
            slot = (task - 1) % self.slots
            word = int(self._entries[slot, tr.ENTRY_TASK])
            if not tr.entry_holds(word, task):
                if self._stop.is_set():
                    return
                self._work.clear()  # then look once more: a post between the look and the clear is not lost
                if not tr.entry_holds(int(self._entries[slot, tr.ENTRY_TASK]), task):
                    self._work.wait(0.05)
                continue
            n, d2h = word & tr.MAX_TASK_BLOCKS, (word >> tr.COUNT_BITS) & 1
            self._entries[slot, tr.ENTRY_TAKEN_NS] = time.perf_counter_ns()
            host_ids = torch.from_numpy(self._ids[slot, :n].copy())
            slots = torch.from_numpy(self._ids[slot, self.cap : self.cap + n].copy())
            if d2h:
                self._host.index_copy_(0, host_ids, self._device.index_select(0, slots))
            else:
                self._device.index_copy_(0, slots, self._host.index_select(0, host_ids))
            entry = self._entries[slot]
            if entry[tr.ENTRY_RAISE_AT]:
                ctypes.c_int64.from_address(int(entry[tr.ENTRY_RAISE_AT])).value = int(entry[tr.ENTRY_RAISE_TO])
            entry[tr.ENTRY_LANDED_NS] = time.perf_counter_ns()
            self._done[slot] = task
            task += 1

    def _posted(self, stopped: int) -> None:
        self._work.set()

    def _ensure_serving(self) -> None:
        self._work.set()

    def close(self) -> None:
        self._stop.set()
        self._work.set()
        self._thread.join()
        super().close()
