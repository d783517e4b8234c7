"""ResidentCopier: the resident copy kernel as a server of a `pulseio._resident.TaskRing`.

Posting a task is a few stores into pinned memory and one fenced load: no driver call, no event
(`TaskRing.post`). A task's completion is a `TaskEvent`, which stands in for a torch.cuda.Event
wherever the routes hand one out: `query()` reads the task's done word, `synchronize()` spins on it
with the GIL released, and `wait(stream)` makes a stream wait for the kernel's watermark on the
device. This class adds the kernel: launching it, restarting it after an idle stop, launching a
generation for a device wait in the waiting stream's order (see `resident_kernel.py` for the
protocol), and stopping it at close.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import numpy as np
import torch

from .._native import task_ring as tr
from .._native.layout import HEAD_WORDS
from .._resident import TaskRing
from ..errors import CudaError, PulseInternalError
from . import resident_kernel as rk
from .driver import OwnStream, write_value
from .kernels import THREADS_PER_CTA
from .launch import BlockArray, PackedKernel, array_args
from .wait_kernel import WaitLauncher, refuse_in_capture

log = logging.getLogger(__name__)

_CLOSE_S = 10.0  # how long close waits for the kernel to exit


class ResidentCopier(TaskRing):
    """Serves block copies between one host pool and one device pool through the resident kernel.

    The ring is pinned and device-mapped (UVA: its device addresses equal its host addresses).
    """

    reads_ids_mirror = True

    def __init__(self, backend: Any, host: BlockArray, pool: BlockArray, *, ctas: int, slots: int, cap: int,
                 idle_us: int) -> None:
        super().__init__(backend.alloc_host, slots=slots, cap=cap)
        with contextlib.ExitStack() as built:  # a part that fails frees the ring and those built before it
            built.callback(super().close)
            self._device = backend.device
            self._ctas = ctas
            self._dev = torch.zeros(rk.dev_words(slots, ctas), dtype=torch.int64, device=self._device)
            self._dev[rk.DEV_START : rk.DEV_START + 2] = 1  # the first generation starts at task 1
            self.watermark_addr = self._dev.data_ptr() + 8 * rk.DEV_WATERMARK
            self._own_stream = OwnStream(self._device)   # never shared: the kernel stays on it while it serves
            built.callback(self._own_stream.destroy)
            self.stream = self._own_stream.torch
            base = self._memory.device_ptr
            self._kernel = PackedKernel(rk.compile_resident_copy(), 46)
            self._holds = torch.zeros((rk.HOLD_GENS, 2), dtype=torch.int64, pin_memory=True)  # device-mapped (UVA)
            self._holds_view = self._holds.numpy()
            self._wait = WaitLauncher()
            self._kernel.values[:27] = (
                *host.kernel_args, *pool.kernel_args, *array_args(base + 8 * self._ids_at, (slots, 2 * cap)))
            self._kernel.values[27:36] = array_args(self._dev.data_ptr(), (0, 2))  # no ids mirror (`read_ids_from`)
            self._kernel.values[36:40] = base, self._entries_host, self._done_host, self._dev.data_ptr()
            self._kernel.values[41] = idle_us * 1000
            self._kernel.values[44] = self._holds.data_ptr()
            self._kernel.values[45] = self._dev.data_ptr()  # no mirror heads (`read_ids_from`): unread
            self._launch_lock = threading.Lock()
            self._gen = 0
            self.launches = 0
            self._published = torch.cuda.Event()  # re-recorded per serve_for: a stream wait takes its call's record
            self._warm_up()
            built.pop_all()

    def _warm_up(self) -> None:
        """Launch once with CTRL_CLOSE set: loads the kernel now (a first launch under lazy module loading
        waits for the device, which may be waiting for a copy) and checks that it runs and stops."""
        self._ctrl[tr.CTRL_CLOSE] = 1
        self._published.record(self.stream)  # creates the event now, not in the first device wait's serve_for
        self.stream.wait_event(self._published)
        self._launch()
        self.stream.synchronize()
        self._ctrl[tr.CTRL_CLOSE] = 0
        if self._ctrl[tr.CTRL_STOPPED] != self._gen:
            raise PulseInternalError("the resident copy kernel exited without its stop handshake")

    def _launch(self, hold_at: int = 0, hold_to: int = 0) -> None:
        """Start the next generation on our stream (behind the previous one, if that is still running), with
        its hold in `holds` before CTRL_LAUNCHED tells the running one it has a successor. Under the launch lock."""
        self._gen += 1
        self.launches += 1
        self._holds_view[self._gen % rk.HOLD_GENS] = hold_at, hold_to
        self._ctrl[tr.CTRL_LAUNCHED] = self._gen
        values = self._kernel.values
        values[40], values[42], values[43] = self._gen, hold_at, hold_to
        self._kernel.launch(self.stream.cuda_stream, 1 + self._ctas, THREADS_PER_CTA)  # the leader, the copy CTAs

    def read_ids_from(self, mirror: torch.Tensor, heads: torch.Tensor) -> None:
        """mirror: [rows, 2 * w] int64 on this device, where a publisher also writes each doorbell request's
        ids (row (seq - 1) % rows); heads: [rows, HEAD_WORDS] int64, each row's head (`doorbell_kernels`: its
        seq, < 0 while written, and count, and the copy CTAs' early copies of it). Tasks the fast lane posts then
        name their row instead of carrying their ids, and the kernel reads them there; a copy CTA with no task to
        serve copies its share of a request as soon as the heads show it, before its task arrives, and the last
        to do so marks the request landed in its head. Call before the first request is published."""
        if mirror.dtype != torch.int64 or mirror.dim() != 2 or not mirror.is_contiguous() or mirror.shape[1] % 2:
            raise PulseInternalError(f"an ids mirror is a contiguous [rows, 2 * w] int64 tensor, got "
                                     f"{tuple(mirror.shape)} {mirror.dtype}")
        if mirror.shape[0] > tr.MAX_MIRROR_ROWS:
            raise PulseInternalError(f"an ids mirror has at most {tr.MAX_MIRROR_ROWS} rows, got {mirror.shape[0]}")
        if (heads.dtype != torch.int64 or tuple(heads.shape) != (mirror.shape[0], HEAD_WORDS)
                or not heads.is_contiguous()):
            raise PulseInternalError(f"an ids mirror's heads are a contiguous [{mirror.shape[0]}, {HEAD_WORDS}] int64 "
                                     f"tensor, got {tuple(heads.shape)} {heads.dtype}")
        with self._launch_lock:
            self._mirror = mirror, heads  # kept alive while kernels read them
            self._kernel.values[27:36] = array_args(mirror.data_ptr(), tuple(mirror.shape))
            self._kernel.values[45] = heads.data_ptr()
            self._row_task = np.zeros(mirror.shape[0], np.int64)
            self.mirror_rows = mirror.shape[0]

    def serve_for(self, stream: Any, word_at: int, value: int) -> None:
        """A stream is about to wait on the device until the int64 at `word_at` reaches value, which a task
        of this ring will store: launch a generation that starts once `stream` reaches this point (behind
        the request's publish) and does not stop before the word is set. Landing the task then needs no
        driver call, and no kernel of ours runs ahead of the publish it serves (see the kernel's doc)."""
        stream = stream if stream is not None else torch.cuda.current_stream(self._device)
        refuse_in_capture(stream.cuda_stream)
        with self._launch_lock:
            self._published.record(stream)
            self.stream.wait_event(self._published)
            self._launch(word_at, value)

    def _posted(self, stopped: int) -> None:
        """After a post: if the last generation launched had offered to stop (it may be gone), start the next."""
        if stopped == self._gen:
            self._ensure_serving()

    def _ensure_serving(self) -> None:
        with self._launch_lock:
            if self._ctrl[tr.CTRL_STOPPED] == self._gen:
                self._launch()

    def describe(self) -> str:
        return f"{super().describe()}, current generation {self._gen}, launches {self.launches}"

    def _post_on_stream(self, stream_handle: int, entry_at: int, word: int) -> None:
        write_value(stream_handle, entry_at, word)

    def _check_running(self, seq: int) -> None:
        """A waiter whose task is late: start a generation if the kernel stopped, raise if the GPU failed.
        Under the launch lock, the stream is queried before the stop word is read: a generation that stops
        between the two reads has written its stop word by then (it does so before it exits), and none is
        launched in between, so an idle stream without the current generation's stop word is a generation
        that exited without the handshake. (Read the other way round, a generation stopping in between
        looked like that.)"""
        with self._launch_lock:
            try:
                idle = self.stream.query()
            except RuntimeError as exc:  # a sticky CUDA error: the kernel faulted
                raise CudaError("resident copy kernel", -1, str(exc)) from exc
            if self._ctrl[tr.CTRL_STOPPED] == self._gen:
                self._launch()
                return
        if idle and not self.landed(seq):
            raise PulseInternalError(f"resident task {seq} was posted, no kernel is running and it has not landed")

    def device_wait(self, stream: Any, seq: int) -> None:
        """Enqueue on `stream` (torch stream, default: current): wait until task seq has landed. No host wait."""
        stream = stream if stream is not None else torch.cuda.current_stream()
        self._wait(stream.cuda_stream, self.watermark_addr, seq)

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
        super().close()
        self._own_stream.destroy()
