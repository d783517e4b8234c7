"""Pinned (and device-twin) buffers handed out by a free queue: the staging and id buffers of the routes."""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..backend import Pending
from ..errors import PulseInternalError

if TYPE_CHECKING:
    from .backend import CudaBackend
    from .hostmem import PinnedBuffer

log = logging.getLogger(__name__)
ID_BYTES = 8  # bytes per id (int64)
_LOST_BUFFER_S = 30.0


class BufferRing:
    """Pinned (and optionally device-twin) buffers handed out by a free queue. Each goes back when
    the piece that used it has finished; an issuer that finds none free finishes the oldest piece
    in flight itself (`reclaim`), so a ring never waits on another thread to make progress."""

    def __init__(
        self, backend: CudaBackend, count: int, nbytes: int, on_device: bool, label: str,
        reclaim: Callable[[], bool],
    ) -> None:
        self._reclaim = reclaim
        self.pinned: list[PinnedBuffer] = []
        try:
            for _ in range(count):
                self.pinned.append(backend.alloc_host(nbytes, label=label))
        except BaseException:  # the buffers pinned before the failing one go back
            self.close()
            raise
        device = backend.device if on_device else None
        self.device = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(count)] if device else []
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(count):
            self._free.put(i)

    def releaser(self, index: int) -> Callable[[], None]:
        return lambda: self._free.put(index)

    def lease(self, emit: Callable[[Pending], None], record: Callable[[], Any]) -> _Lease:
        """`with ring.lease(...) as index`: a free buffer's index. If the body raises, copies it already
        enqueued may still touch the buffer: it goes back only once the stream has passed them (or
        never, if even that fails)."""
        return _Lease(self, emit, record)

    def _take(self) -> int:
        while True:
            try:
                return self._free.get_nowait()
            except queue.Empty:
                if self._reclaim():
                    continue
            try:  # nothing left in flight to finish: a piece being finished on another thread frees one
                return self._free.get(timeout=_LOST_BUFFER_S)
            except queue.Empty:
                raise PulseInternalError(
                    f"no buffer of this ring came back in {_LOST_BUFFER_S} s with nothing in flight"
                ) from None

    def close(self) -> None:
        for buffer in self.pinned:
            buffer.close()


class _Lease:
    """The context manager `BufferRing.lease` returns (a class: @contextmanager costs ~2 us a use)."""

    __slots__ = ("_ring", "_emit", "_record", "_index")

    def __init__(self, ring: BufferRing, emit: Callable[[Pending], None], record: Callable[[], Any]) -> None:
        self._ring, self._emit, self._record = ring, emit, record

    def __enter__(self) -> int:
        self._index = self._ring._take()
        return self._index

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if kind is None:
            return
        try:
            self._emit(Pending(self._record(), self._ring.releaser(self._index)))
        except Exception:
            log.error("a pinned buffer was not recycled after a failed issue; the ring has one less")
