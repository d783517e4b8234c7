"""ResidentCopier: the host side of the resident copy kernel (see `resident_kernel.py` for the protocol).

Posting a task is a few stores into pinned memory and one fenced load: no driver call, no event.
A task's completion is a `ResidentEvent`, which stands in for a torch.cuda.Event wherever the
routes hand one out: `query()` reads the task's done word, `synchronize()` spins on it with the
GIL released, and `wait(stream)` makes a stream wait for the kernel's watermark on the device.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._native import task_ring as tr
from ..errors import CudaError, PulseInternalError
from . import resident_kernel as rk
from .driver import wait_value, write_value
from .hostmem import PinnedBuffer
from .kernels import THREADS_PER_CTA
from .launch import BlockArray, PackedKernel, array_args

log = logging.getLogger(__name__)

_LINE = 16  # int64 words per 128-byte line
_SPIN = 1_000_000  # loads per GIL-free spin (~1 ms) before a waiter checks that a kernel is running
_CLOSE_S = 10.0  # how long close waits for the kernel to exit


def _lines(words: int) -> int:
    return -(-words // _LINE) * _LINE


class ResidentCopier:
    """Serves block copies between one host pool and one device pool through a resident kernel.

    slots: tasks posted and not yet known to have landed (a post waits for the task `slots` before
    it); cap: blocks per task. Thread-safe.
    """

    def __init__(self, backend: Any, host: BlockArray, pool: BlockArray, *, ctas: int, slots: int, cap: int,
                 idle_us: int) -> None:
        if not 1 <= cap <= tr.MAX_TASK_BLOCKS:
            raise ValueError(f"a resident task holds 1..{tr.MAX_TASK_BLOCKS} blocks, got cap={cap}")
        self._device = backend.device
        self.slots, self.cap, self._ctas = slots, cap, ctas
        entries_at = _LINE
        done_at = entries_at + _lines(tr.ENTRY_WORDS * slots)
        ids_at = done_at + _lines(slots)
        self._memory: PinnedBuffer | None = backend.alloc_host(8 * (ids_at + slots * 2 * cap), label="resident ring")
        words = self._memory.tensor.numpy().view(np.int64)
        words[:] = 0
        self._ctrl, self._done = words[:_LINE], words[done_at : done_at + slots]
        self._entries = words[entries_at : entries_at + tr.ENTRY_WORDS * slots].reshape(slots, tr.ENTRY_WORDS)
        self._ids = words[ids_at:].reshape(slots, 2 * cap)
        base = self._memory.device_ptr
        self._ctrl_addr, self._entries_addr, self._done_addr = base, base + 8 * entries_at, base + 8 * done_at
        self._promised_addr = base + 8 * tr.CTRL_PROMISED
        self._stopped_addr = base + 8 * tr.CTRL_STOPPED
        self._dev = torch.zeros(rk.dev_words(slots), dtype=torch.int64, device=self._device)
        self._dev[rk.DEV_START] = 1
        self.watermark_addr = self._dev.data_ptr() + 8 * rk.DEV_WATERMARK
        self.stream = torch.cuda.Stream(self._device, priority=-1)
        self._kernel = PackedKernel(rk.compile_resident_copy(), 33)
        self._kernel.values[:31] = (
            *host.kernel_args, *pool.kernel_args, *array_args(base + 8 * ids_at, (slots, 2 * cap)),
            self._ctrl_addr, self._entries_addr, self._done_addr, self._dev.data_ptr(),
        )
        self._kernel.values[32] = idle_us * 1000
        self._launch_lock = threading.Lock()
        self._post_lock = threading.Lock()  # the routes' issuer and the doorbell's fast lane both post
        self._gen = 0
        self._seq = 0  # last task posted
        self.launches = 0
        self._warm_up()

    def _warm_up(self) -> None:
        """Launch once with CTRL_CLOSE set: loads the kernel now (a first launch under lazy module loading
        waits for the device, which may be waiting for a copy) and checks that it runs and stops."""
        self._ctrl[tr.CTRL_CLOSE] = 1
        self._launch()
        self.stream.synchronize()
        self._ctrl[tr.CTRL_CLOSE] = 0
        if self._ctrl[tr.CTRL_STOPPED] != self._gen:
            raise PulseInternalError("the resident copy kernel exited without its stop handshake")

    def _launch(self) -> None:
        """Start the next generation on our stream (behind the previous one, if that is still running)."""
        self._gen += 1
        self.launches += 1
        self._kernel.values[31] = self._gen
        self._kernel.launch(self.stream.cuda_stream, self._ctas, THREADS_PER_CTA)

    # -- posting -------------------------------------------------------------------------------------

    def post(self, direction: int, host_ids: np.ndarray, slots: np.ndarray, ordered_on: Any = None,
             raise_on_landed: tuple[int, int] | None = None) -> ResidentEvent:
        """Post one task: host_ids, slots: [m <= cap] int64, host. ordered_on: a CUDA stream handle; the task
        becomes visible to the kernel only when that stream reaches this point (None: at once).
        raise_on_landed: (address of a device int64, value): the kernel raises it to value once landed."""
        with self._post_lock:
            seq = self._post(direction, host_ids, slots, ordered_on, raise_on_landed)
        return ResidentEvent(self, seq)

    def _post(self, direction: int, host_ids: np.ndarray, slots: np.ndarray, ordered_on: Any,
              raise_on_landed: tuple[int, int] | None) -> int:
        seq = self._seq + 1
        slot = (seq - 1) % self.slots
        if self._done[slot] < seq - self.slots:  # the slot's previous task has not landed yet
            self.wait_sync(seq - self.slots)
        m = len(host_ids)
        ids = self._ids[slot]
        ids[:m] = host_ids
        ids[self.cap : self.cap + m] = slots
        entry = self._entries[slot]
        entry[tr.ENTRY_RAISE_AT], entry[tr.ENTRY_RAISE_TO] = raise_on_landed or (0, 0)
        word = tr.pack_entry(seq, m, direction)
        entry_addr = self._entries_addr + 8 * (tr.ENTRY_WORDS * slot + tr.ENTRY_TASK)
        if ordered_on is None:
            stopped = tr.post(entry_addr, word, self._promised_addr, seq, self._stopped_addr)
        else:
            stopped = tr.post(0, 0, self._promised_addr, seq, self._stopped_addr)
            write_value(ordered_on, entry_addr, word)
        self._seq = seq
        self._restart_if_stopped(stopped)
        return seq

    def _restart_if_stopped(self, stopped: int) -> None:
        """After a post: if the kernel had offered to stop (it may be gone), start the next generation."""
        if stopped == self._gen:
            with self._launch_lock:
                if self._ctrl[tr.CTRL_STOPPED] == self._gen:
                    self._launch()

    def event(self, seq: int) -> ResidentEvent:
        return ResidentEvent(self, seq)

    def forwarder(self, fast: np.ndarray, num_host: int, num_slots: int, raise_at: int) -> Callable[..., int]:
        """A doorbell reader (`Doorbell.wait_rung(lane=)`) that posts the leading requests marked in `fast`
        as tasks in one compiled call (`task_ring.forward`); raise_at: the device word they raise, or 0."""

        def forward(base: int, words: np.ndarray, capacity: int, slot_words: int, max_blocks: int, next_seq: int,
                    out: np.ndarray, ids_out: np.ndarray, slots_out: np.ndarray) -> int:
            with self._post_lock:
                k, stopped = tr.forward(base, words, capacity, slot_words, max_blocks, next_seq, fast, num_host,
                                        num_slots, self._ids, self._entries, self._entries_addr, self._done,
                                        self._promised_addr, self._stopped_addr, self._seq, raise_at, out, ids_out,
                                        slots_out)
                self._seq += k
            if k:
                self._restart_if_stopped(stopped)
            return k

        return forward

    # -- completion ----------------------------------------------------------------------------------

    def landed(self, seq: int) -> bool:
        return bool(self._done[(seq - 1) % self.slots] >= seq)

    def landed_ns(self, seq: int) -> int | None:
        """%globaltimer when task seq landed (GPU clock), while its ring slot still holds it; else None."""
        slot = (seq - 1) % self.slots
        stamp = int(self._entries[slot, tr.ENTRY_LANDED_NS])
        return stamp if self._done[slot] == seq else None

    def wait_sync(self, seq: int) -> None:
        """Wait, GIL released, until task seq has landed."""
        addr = self._done_addr + 8 * ((seq - 1) % self.slots)
        sleep = 0.0  # spin first: a task takes microseconds, and a sleep at least ~60 us on Linux
        while not tr.wait_at_least(addr, seq, _SPIN):
            self._check_running(seq)
            if sleep:
                time.sleep(sleep)
            sleep = min(max(2 * sleep, 50e-6), 1e-3)

    def _check_running(self, seq: int) -> None:
        """A waiter whose task is late: start a generation if the kernel stopped, raise if the GPU failed."""
        with self._launch_lock:
            if self._ctrl[tr.CTRL_STOPPED] == self._gen:
                self._launch()
                return
        try:
            idle = self.stream.query()
        except RuntimeError as exc:  # a sticky CUDA error: the kernel faulted
            raise CudaError("resident copy kernel", -1, str(exc)) from exc
        if idle and not self.landed(seq):
            raise PulseInternalError(f"resident task {seq} was posted, no kernel is running and it has not landed")

    def device_wait(self, stream_handle: int, seq: int) -> None:
        """Enqueue on a stream: wait until task seq has landed. No host wait."""
        wait_value(stream_handle, self.watermark_addr, seq)

    def close(self) -> None:
        """Stop the kernel (it exits once idle) and free the ring. Every posted task must have landed."""
        if self._memory is None:
            return
        self._ctrl[tr.CTRL_CLOSE] = 1
        deadline = time.monotonic() + _CLOSE_S
        while not self.stream.query():
            if time.monotonic() > deadline:
                log.error("the resident copy kernel has not exited %.0f s after close; leaking its ring", _CLOSE_S)
                return
            time.sleep(100e-6)
        self._memory.close()
        self._memory = None


class ResidentEvent:
    """A resident task's completion, with the torch.cuda.Event methods the routes' users call."""

    __slots__ = ("_copier", "seq")

    def __init__(self, copier: ResidentCopier, seq: int) -> None:
        self._copier, self.seq = copier, seq

    def query(self) -> bool:
        return self._copier.landed(self.seq)

    def synchronize(self) -> None:
        self._copier.wait_sync(self.seq)

    def wait(self, stream: Any = None) -> None:
        """Make `stream` (default: current) wait for the task on the device (what Stream.wait_event calls)."""
        stream = stream if stream is not None else torch.cuda.current_stream()
        self._copier.device_wait(stream.cuda_stream, self.seq)
