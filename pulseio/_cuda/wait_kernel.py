"""The device wait: a one-thread kernel that holds its stream until an int64 word reaches a value.

Device waits (a doorbell request's wait word in pinned host memory, a resident task's watermark in
device memory) are this kernel, not `cuStreamWaitValue64`. A stream memory operation on a host word is
re-read by the GPU's front end on a schedule the driver owns; this kernel reads the word itself, at
system scope, every ~100 ns, and ends as soon as any writer (the copier, a host thread, the watchdog)
stores the value. It holds one warp of one SM while it waits. `wait_seq`, a doorbell request's wait, also ends
once the request's ids mirror row says every copy CTA copied it early (`doorbell_kernels`): its blocks are in
place then, before the task the host posts for it lands them.
"""

from __future__ import annotations

import functools
import threading

from numba import cuda

from .._native.layout import HEAD_LANDED, HEAD_WORDS
from ..errors import InvalidRequestError
from . import _numba_compat  # noqa: F401  (must precede numba.cuda)
from .driver import is_capturing
from .launch import PackedKernel
from .sysmem import globaltimer, load_acquire_gpu, load_acquire_sys, load_relaxed_gpu, pause

WAIT_SIGNATURE = "void(int64, int64)"
WAIT_SEQ_SIGNATURE = "void(int64, int64, int64, int64, int64)"
WAIT_THREADS = 32
HOST_POLL_NS = 8_000  # with an ids mirror, how often `wait_seq` reads the request's host word between its row's reads


def wait_word(address, value):  # pragma: no cover - runs on the GPU / simulator
    """Spin until the int64 at `address` reaches value, compared cyclically as cuStreamWaitValue64's GEQ
    does ((word - value) as int64 >= 0): later work on the stream runs only after that."""
    if cuda.threadIdx.x == 0:
        while load_acquire_sys(address) - value < 0:
            pause()


def wait_seq(seq_at, words_base, words, heads, rows):  # pragma: no cover - runs on the GPU / simulator
    """`wait_word` for the request whose seq an earlier kernel of this stream (a publish) stored at seq_at:
    its word is (seq - 1) % words of the `words` int64 at words_base. The seq is read on the device, so
    this wait can be captured in a CUDA graph: each replay waits for the request that replay published.
    With an ids mirror (rows > 0: `heads`, the address of its [rows, HEAD_WORDS] int64 heads), the wait also
    ends once the request's row says it landed early (HEAD_LANDED = seq, stored with release by the last copy CTA
    to copy its part: acquired here, the parts are visible to what the stream runs next). It reads the row each pass
    and the host word every HOST_POLL_NS: a host read is a PCIe round trip (microseconds beside the copier's
    traffic) in which a landing on the row would go unseen."""
    if cuda.threadIdx.x == 0:
        seq = load_relaxed_gpu(seq_at)
        address = words_base + 8 * ((seq - 1) % words)
        if rows == 0:
            while load_acquire_sys(address) - seq < 0:
                pause()
            return
        landed = heads + 8 * (HEAD_WORDS * ((seq - 1) % rows) + HEAD_LANDED)
        polled = globaltimer() - HOST_POLL_NS                        # the host word at once, then every HOST_POLL_NS
        while load_acquire_gpu(landed) != seq:                       # an L2 read each pass
            now = globaltimer()
            if now - polled >= HOST_POLL_NS:                         # a PCIe round trip, in which no L2 read is made
                if load_acquire_sys(address) - seq >= 0:
                    return
                polled = now
            pause()


def refuse_in_capture(stream_handle: int) -> None:
    """A device wait (and the copier generation launched for it) is not captured in a CUDA graph: a replay
    would wait for this one request again, long after its word was reused."""
    if is_capturing(stream_handle):
        raise InvalidRequestError(
            "device_wait on a stream that is capturing a CUDA graph: a replay would wait for this one "
            "request again; call device_wait outside the capture, before replaying the graph")


@functools.cache
def compile_wait_word():
    return cuda.jit(WAIT_SIGNATURE)(wait_word)


@functools.cache
def compile_wait_seq():
    return cuda.jit(WAIT_SEQ_SIGNATURE)(wait_seq)


class SeqWaitLauncher:
    """Launches `wait_seq` (pre-packed, loaded at construction, thread-safe), on a stream that may be
    capturing a CUDA graph."""

    def __init__(self) -> None:
        self._kernel = PackedKernel(compile_wait_seq(), 5)
        self._lock = threading.Lock()

    def __call__(self, stream_handle: int, seq_at: int, words_base: int, words: int, heads: int = 0,
                 rows: int = 0) -> None:
        """heads, rows: the ids mirror's heads (address, rows), whose landed seq also ends the wait; 0: none."""
        with self._lock:
            self._kernel.values[:] = (seq_at, words_base, words, heads, rows)
            self._kernel.launch(stream_handle, 1, WAIT_THREADS)


class WaitLauncher:
    """Launches `wait_word` with a pre-packed argument block. Thread-safe: device waits come from any
    thread. Compiled and loaded into the context at construction, so a wait never loads a module (a
    module load can itself wait for the device, see `pulseio._device_waits`)."""

    def __init__(self) -> None:
        self._kernel = PackedKernel(compile_wait_word(), 2)
        self._lock = threading.Lock()

    def __call__(self, stream_handle: int, address: int, value: int) -> None:
        with self._lock:
            self._kernel.values[0], self._kernel.values[1] = address, value
            self._kernel.launch(stream_handle, 1, WAIT_THREADS)
