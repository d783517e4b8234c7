"""Transfer: the handle of one submitted transfer; done(), wait(), exception(), callbacks, device wait.

State moves one way: QUEUED -> ISSUED -> DONE or FAILED (FAILED may also follow QUEUED). ISSUED
means every copy and kernel of the transfer is enqueued on the copy stream, so a consumer stream
can wait on `device_event` without the host waiting for the GPU.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from ._inflight import InFlight
from ._once import Latch
from .errors import PulseInternalError, TransferError
from .handle import Handle
from .plan import Direction, Strategy


class TransferState(enum.Enum):
    """Where a transfer is: QUEUED -> ISSUED -> DONE, or FAILED."""

    __hash__ = object.__hash__  # see pulseio.plan.Direction

    QUEUED = "queued"
    ISSUED = "issued"
    DONE = "done"
    FAILED = "failed"


_ISSUED, _DONE = TransferState.ISSUED, TransferState.DONE  # hot paths: a member lookup is a Python call

_NEXT = {
    TransferState.QUEUED: {TransferState.ISSUED, TransferState.FAILED},
    TransferState.ISSUED: {TransferState.DONE, TransferState.FAILED},
    TransferState.DONE: set(),
    TransferState.FAILED: set(),
}


class Transfer(Handle):
    """One transfer (a `pulseio.Handle`). Created by `DmaEngine.submit`; resolved by pulseio's threads."""

    __slots__ = ("_inflight", "direction", "strategy", "device_event", "_state", "_issued", "_issued_callbacks",
                 "_issue_error")

    def __init__(
        self, *, seq: int, tag: int | None, direction: Direction, strategy: Strategy, num_blocks: int, nbytes: int,
        inflight: InFlight | None = None,
    ) -> None:
        super().__init__(seq=seq, tag=tag, num_blocks=num_blocks, nbytes=nbytes)
        self._inflight = inflight
        self.direction = direction
        self.strategy = strategy
        self.device_event: Any = None  # torch.cuda.Event once ISSUED on a GPU backend
        self._state = TransferState.QUEUED
        self._issued = Latch()
        self._issued_callbacks: list[Callable[[Transfer], None]] | None = None
        self._issue_error: TransferError | None = None  # its issue raised; FAILED once its turn in the FIFO comes

    def __repr__(self) -> str:
        return (
            f"<Transfer seq={self.seq} tag={self.tag!r} {self.direction.value} {self.strategy.value} "
            f"{self.num_blocks} blocks {self._state.value}>"
        )

    @property
    def state(self) -> TransferState:
        return self._state

    def done(self) -> bool:
        """True once finished (landed or failed). Never waits; finishes what has already landed."""
        if not self._finished.is_set() and self._inflight is not None:
            self._inflight.poll()
        return self._finished.is_set()

    def add_done_callback(self, fn: Callable[[Transfer], None]) -> None:
        """Call fn(self) once finished (now, if already done), on the thread that finishes it: pulseio's
        completion thread, or a thread that waits for a later transfer of the same engine."""
        super().add_done_callback(fn)
        if not self._finished.is_set() and self._inflight is not None:
            self._inflight.watch(self)

    def _help_finish(self, timeout: float | None) -> None:
        if self._inflight is None:
            return
        if timeout is None:
            self._inflight.finish(self)  # on this thread: no hand-off to wait for
        else:
            self._inflight.watch(self)

    def add_issued_callback(self, fn: Callable[[Transfer], None]) -> None:
        """Call fn(self) once its copies are enqueued (`device_event` set) or it failed, from the pulseio
        worker thread (now, if that already happened). fn must not block: it runs on the copy path."""
        with self._lock:
            if not self._issued.is_set():
                if self._issued_callbacks is None:  # most transfers never get one: no list until then
                    self._issued_callbacks = []
                self._issued_callbacks.append(fn)
                return
        fn(self)

    def device_wait(self, stream: Any = None) -> None:
        """Make a torch CUDA stream (default: current) wait for the data, without waiting for the GPU.

        Blocks the calling thread only until pulseio's worker has enqueued the copies (microseconds
        behind submit), never for the copy itself. Raises at once if the transfer already failed.
        On the host backend, where there is no device, it waits on the host until the data landed.
        """
        self._issued.wait()
        error = self._exception or self._issue_error
        if error is not None:
            raise error
        if self.device_event is None:  # host backend: no device to wait on; wait on the host instead
            self.wait()
            return
        self.device_event.wait(stream)  # torch.cuda.Event or a resident TaskEvent; None: the current stream

    # -- called by pulseio's threads -------------------------------------------------------

    def _move(self, state: TransferState) -> None:
        if state not in _NEXT[self._state]:
            raise PulseInternalError(f"{self!r}: illegal state change {self._state.value} -> {state.value}")
        self._state = state

    def _set_issued(self, device_event: Any) -> None:
        with self._lock:
            self.device_event = device_event
            self._move(_ISSUED)
            self._issued.set()
            callbacks, self._issued_callbacks = self._issued_callbacks, None
        if callbacks:
            for fn in callbacks:
                fn(self)

    def _set_issue_failed(self, cause: BaseException) -> None:
        """Its issue raised: nothing will land, so waits for the issue (`device_wait`) end now with the error.
        The transfer becomes FAILED (and `wait()` returns) once the FIFO resolves its issue, in order."""
        error = self._failure(cause)
        with self._lock:
            self._issue_error = error
            callbacks, self._issued_callbacks = self._issued_callbacks, None
            self._issued.set()
        for fn in callbacks or []:
            fn(self)

    def _set_done(self) -> None:
        self._finish(_DONE, None)

    def _set_failed(self, cause: BaseException) -> None:
        self._finish(TransferState.FAILED, self._failure(cause))

    def _failure(self, cause: BaseException) -> TransferError:
        error = TransferError(f"transfer seq={self.seq} tag={self.tag!r} failed: {cause}")
        error.__cause__ = cause
        return error

    def _finish(self, state: TransferState, exception: BaseException | None) -> None:
        with self._lock:
            self._move(state)
            issued_callbacks, self._issued_callbacks = self._issued_callbacks, None
            self._issued.set()
            callbacks = self._finish_locked(exception)
        if issued_callbacks:
            callbacks = issued_callbacks + callbacks
        for fn in callbacks:
            fn(self)
