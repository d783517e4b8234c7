"""Pinned, device-mapped host memory: a torch byte tensor registered with the driver in chunks.

Why register rather than `torch.empty(pin_memory=True)`: torch's pinned allocator rounds every
request up to a power of two (a 40 GiB pool would pin 64 GiB) and pins it in one call. Here the
buffer is one contiguous pageable allocation, page-aligned, pinned chunk by chunk from a few
threads (pinning is page-faulting, which parallelises), with a progress bar for large pools on a terminal.
Under UVA the device pointer of registered memory equals its host pointer, so one contiguous
range stays contiguous for kernels; that is checked per chunk, not assumed. The copy engine does not
see it so: a DMA that spans two registrations fails (cuMemcpyBatchAsync: CUDA_ERROR_INVALID_VALUE), so
chunks are whole blocks (`segment_bytes`) and the DMA routes cut their runs at chunk boundaries.
"""

from __future__ import annotations

import logging
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ..errors import PulseInternalError
from ..memory import SEGMENT_TARGET_BYTES
from . import driver

log = logging.getLogger(__name__)

_ALIGN = 2 << 20  # 2 MiB: page-aligned, and huge-page-aligned where the kernel uses them
_PROGRESS_BYTES = 2 << 30


class PinnedBuffer:
    """`nbytes` of pinned host memory as `tensor` ([nbytes] uint8, CPU); `device_ptr` is its UVA address;
    registered in chunks of `segment_bytes` (a DMA must not span two). A buffer collected without `close` is
    unpinned then: its memory goes back to the allocator, and a registration left on it would make the next
    allocation placed there fail to pin (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)."""

    def __init__(
        self, nbytes: int, *, context: Any, chunk_bytes: int = SEGMENT_TARGET_BYTES, threads: int = 4, label: str = ""
    ) -> None:
        self.nbytes = nbytes
        self.segment_bytes = chunk_bytes
        self._context = context
        raw = torch.empty(nbytes + _ALIGN, dtype=torch.uint8)
        offset = (-raw.data_ptr()) % _ALIGN
        self.tensor = raw[offset : offset + nbytes]
        self.host_ptr = self.tensor.data_ptr()
        self._chunks: list[int] = []
        unpin = weakref.finalize(self, _unpin_collected, context, self._chunks, label)
        unpin.atexit = False  # the process is ending: its context goes with it
        self._register(chunk_bytes, threads, label)
        self.device_ptr = self.host_ptr

    def _register(self, chunk_bytes: int, threads: int, label: str) -> None:
        starts = list(range(0, self.nbytes, chunk_bytes))
        bar = None
        if self.nbytes >= _PROGRESS_BYTES:
            from tqdm import tqdm

            bar = tqdm(total=self.nbytes >> 20, unit="MiB", desc=f"pinning {label}".strip(), leave=False,
                       disable=None)                    # None: drawn on a terminal only, not into a log file

        def pin(start: int) -> None:
            driver.set_current(self._context)
            size = min(chunk_bytes, self.nbytes - start)
            ptr = self.host_ptr + start
            device_ptr = driver.host_register(ptr, size)
            with lock:
                self._chunks.append(ptr)
            if device_ptr != ptr:
                raise PulseInternalError(
                    f"registered host memory at {ptr:#x} maps to device address {device_ptr:#x}; "
                    "pulseio needs UVA identity mapping (a 64-bit CUDA platform)"
                )
            if bar is not None:
                bar.update(size >> 20)

        lock = threading.Lock()
        try:
            with ThreadPoolExecutor(max_workers=max(1, min(threads, len(starts)))) as pool:
                list(pool.map(pin, starts))
        except BaseException:
            self.close()
            raise
        finally:
            if bar is not None:
                bar.close()

    def close(self) -> None:
        """Unpin. The tensor stays valid as plain memory until it is garbage-collected."""
        _unpin(self._context, self._chunks)


def _unpin(context: Any, chunks: list[int]) -> None:
    """Unregister the pinned chunks left in `chunks`, emptying it."""
    if chunks:
        driver.set_current(context)
    while chunks:
        driver.host_unregister(chunks.pop())


def _unpin_collected(context: Any, chunks: list[int], label: str) -> None:
    """A PinnedBuffer's finalizer: unpin the chunks `close` has not (none after a close)."""
    if chunks:  # a warning: its owner was dropped unclosed, and the unpin may wait for the device whenever GC runs
        log.warning("the %s was collected without close: unpinning it now", label or "pinned buffer")
        _unpin(context, chunks)
