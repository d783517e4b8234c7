"""The GPU side of the doorbell: the publish device function and kernel, and the device wait.

`publish_device(ring, counter, mirror, heads, ids, slots, n, tag)` is called by every thread of ONE
thread block (a selection kernel's last block, or the one-block `publish_kernel` launched right after the
selection on the same stream). Thread 0 takes the next seq from `counter` (device memory, so the
kernel gets no host-passed value and can be captured in a CUDA graph). The device half comes first: the
block writes the ids into row (seq - 1) % rows of `mirror` (device memory, which the resident copier reads
instead of the host copy) and thread 0 publishes the row's head, with device-scope fences only, so the
copier's early copy starts before the first PCIe fence. Then the host half: thread 0 marks the ring slot
busy and fences (system scope), the block writes the payload, fence, barrier, thread 0 writes count, tag
and the stamp (%globaltimer as the publish began), fences, and stores seq. The protocol is in
`pulseio/doorbell.py`.

`heads` ([rows, HEAD_WORDS] int64 device, beside the mirror) says on the device which request a mirror row
holds: (seq, count, early, landed, landed_ns), seq negative while the row is being written (a seqlock: thread 0
stores -seq before the payload and seq after it). The resident copier's copy CTAs watch it to start a request's
copy before its task arrives from the host, count their early copies of it in `early` (which the publish zeroes),
and the last of them stamps `landed_ns` and stores its seq in `landed` (`resident_kernel.py`), which the device
wait also reads. A request of no blocks has nothing to copy: its publish stores its seq in `landed` itself, so a
device wait for it ends at once instead of waiting for the host to read the request and its task to land.

Completion on the device: each request has a wait word in pinned host memory (`pulseio._wait_words`);
a consumer stream enqueues the wait kernel (`wait_kernel.py`) on it, which the copier or a host thread
satisfies with a plain store.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from numba import cuda, int64  # noqa: E402

from .._native.layout import (  # noqa: E402
    COUNT,
    HEAD_COUNT,
    HEAD_EARLY,
    HEAD_LANDED,
    HEAD_SEQ,
    HEAD_WORDS,
    HEADER_WORDS,
    SEQ,
    STAMP,
    STATUS,
    STATUS_BAD_COUNT,
    STATUS_OK,
    TAG,
)
from ..errors import InvalidRequestError
from . import (
    _numba_compat,  # noqa: F401  (must precede numba.cuda)
    driver,  # noqa: E402
)
from .launch import PackedKernel, array_args
from .sysmem import globaltimer
from .wait_kernel import SeqWaitLauncher, WaitLauncher, refuse_in_capture

PUBLISH_THREADS = 256
PUBLISH_SIGNATURE = ("void(int64[:, ::1], int64[::1], int64[:, ::1], int64[:, ::1], int64[::1], int64[::1], "
                     "int64[::1], int64, int64, int64[::1])")

@cuda.jit(device=True)
def publish_device(ring, counter, mirror, heads, ids, slots, n, tag):  # pragma: no cover - GPU / simulator
    """ring: [capacity, slot_words] int64 (host-mapped); counter: [1] int64 device; mirror: [rows, 2 *
    max_blocks] int64 device (rows may be 0: none) and heads: [rows, HEAD_WORDS] int64 device, its rows' heads;
    ids, slots: [>= n] int64. Call from every thread of exactly one block, once per request. Returns the seq."""
    shared = cuda.shared.array(2, int64)
    t = cuda.threadIdx.x
    rows = mirror.shape[0]
    if t == 0:
        shared[1] = globaltimer()  # the request's stamp: when its publish began
        seq = cuda.atomic.add(counter, 0, 1) + 1
        shared[0] = seq
        if rows > 0:
            heads[(seq - 1) % rows, HEAD_SEQ] = -seq  # busy: an early copy of the row's last request stops
            cuda.threadfence()
    cuda.syncthreads()
    seq = shared[0]
    row = (seq - 1) % ring.shape[0]
    max_blocks = (ring.shape[1] - HEADER_WORDS) // 2
    m = n if 0 <= n <= max_blocks else 0
    if rows > 0:  # the device half: the copier may start its early copy once the head holds seq
        i = t
        while i < m:
            mirror[(seq - 1) % rows, i] = ids[i]
            mirror[(seq - 1) % rows, max_blocks + i] = slots[i]
            i += cuda.blockDim.x
        cuda.threadfence()
        cuda.syncthreads()
        if t == 0:
            heads[(seq - 1) % rows, HEAD_COUNT] = n if m == n else -1
            heads[(seq - 1) % rows, HEAD_EARLY] = 0  # no copy CTA has counted this request yet
            if n == 0:  # nothing to copy: landed on the device as it is published
                heads[(seq - 1) % rows, HEAD_LANDED] = seq
            cuda.threadfence()
            heads[(seq - 1) % rows, HEAD_SEQ] = seq
    if t == 0:
        ring[row, SEQ] = -seq  # busy: a reader must not take the old payload for this seq
        cuda.threadfence_system()
    cuda.syncthreads()
    i = t
    while i < m:
        ring[row, HEADER_WORDS + i] = ids[i]
        ring[row, HEADER_WORDS + max_blocks + i] = slots[i]
        i += cuda.blockDim.x
    cuda.threadfence_system()
    cuda.syncthreads()
    if t == 0:
        ring[row, COUNT] = n
        ring[row, TAG] = tag
        ring[row, STATUS] = STATUS_OK if m == n else STATUS_BAD_COUNT
        ring[row, STAMP] = shared[1]
        cuda.threadfence_system()
        ring[row, SEQ] = seq
        cuda.threadfence_system()
    return seq


def _publish_kernel(ring, counter, mirror, heads, ids, slots, count, count_static, tag, seq_out):  # pragma: no cover
    """seq_out: [1] int64 device (where a captured device wait reads the seq this publish took) or [0]: none."""
    n = count_static if count_static >= 0 else count[0]
    if cuda.blockIdx.x == 0:
        seq = publish_device(ring, counter, mirror, heads, ids, slots, n, tag)
        if cuda.threadIdx.x == 0 and seq_out.shape[0] > 0:
            seq_out[0] = seq


publish_kernel = cuda.jit(_publish_kernel)  # lazily compiled: numba's own launch, for tests and the simulator


@functools.cache
def _compile_publish():
    return cuda.jit(PUBLISH_SIGNATURE)(_publish_kernel)


class PublishLauncher:
    """Launches the publish kernel with a pre-packed argument block (numba's launch path costs tens
    of microseconds). Not thread-safe: the Runtime posts under its lock."""

    def __init__(self, ring_ptr: int, capacity: int, slot_words: int, counter_ptr: int, mirror_ptr: int,
                 mirror_shape: tuple[int, int], heads_ptr: int) -> None:
        self._kernel = PackedKernel(_compile_publish(), 64)
        fixed = (*array_args(ring_ptr, (capacity, slot_words)), *array_args(counter_ptr, (1,)),
                 *array_args(mirror_ptr, mirror_shape), *array_args(heads_ptr, (mirror_shape[0], HEAD_WORDS)))
        self._kernel.values[: len(fixed)] = fixed
        self._at = len(fixed)

    def __call__(self, stream_handle: int, ids_ptr: int, slots_ptr: int, length: int, count_ptr: int,
                 count_static: int, tag: int, seq_out_ptr: int = 0) -> None:
        at = self._at
        self._kernel.values[at:] = (*array_args(ids_ptr, (length,)), *array_args(slots_ptr, (length,)),
                                    *array_args(count_ptr, (1,)), count_static, tag,
                                    *array_args(seq_out_ptr or count_ptr, (1 if seq_out_ptr else 0,)))
        self._kernel.launch(stream_handle, 1, PUBLISH_THREADS)


class DevicePublisher:
    """The CUDA backend's side of a Runtime's doorbell: launches publishes (owning the device counter they
    take seqs from) and enqueues device waits on request wait words. Every call here only enqueues work."""

    def __init__(self, device: Any, context: Any, ring_ptr: int, capacity: int, slot_words: int,
                 mirror_rows: int = 0) -> None:
        import torch

        self._torch = torch
        self.device = device
        self._context = context
        self._thread_ready = threading.local()
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)  # [1] int64: last seq claimed
        # [mirror_rows, 2 * max_blocks] int64: every request's ids again, in device memory (row (seq - 1) % rows)
        self.ids_mirror = torch.zeros((mirror_rows, slot_words - HEADER_WORDS), dtype=torch.int64, device=device)
        self.mirror_heads = torch.zeros((mirror_rows, HEAD_WORDS), dtype=torch.int64, device=device)  # rows' heads
        self.launch = PublishLauncher(ring_ptr, capacity, slot_words, self.counter.data_ptr(),
                                      self.ids_mirror.data_ptr(), tuple(self.ids_mirror.shape),
                                      self.mirror_heads.data_ptr())
        self.wait = WaitLauncher()
        self.wait_for_seq = SeqWaitLauncher()
        self.waits_on_device = True
        self._last: Any = None  # the stream of the previous publish

    def post(self, ids: Any, slots: Any, count: Any, tag: int, stream: Any, seq_out: Any = None) -> None:
        """Enqueue the publish of ids[:count] / slots[:count] on `stream` (torch stream or None: current);
        seq_out: a [1] int64 device tensor the publish writes its seq into, or None."""
        self._bind_thread()
        stream = stream if stream is not None else self._torch.cuda.current_stream(self.device)
        if self._last is not None and self._last != stream and not driver.is_capturing(stream.cuda_stream):
            # seqs come from the device counter in execution order: keep publishes in launch order
            # (a graph being captured is ordered by the stream it is replayed on instead)
            event = self._torch.cuda.Event()
            event.record(self._last)
            stream.wait_event(event)
        self._last = stream
        if isinstance(count, int):
            count_ptr, count_static = self.counter.data_ptr(), count
        else:
            count_ptr, count_static = count.data_ptr(), -1
        length = min(ids.numel(), slots.numel())
        self.launch(stream.cuda_stream, ids.data_ptr(), slots.data_ptr(), length, count_ptr, count_static, tag,
                    0 if seq_out is None else seq_out.data_ptr())

    def check_ids(self, name: str, ids: Any) -> None:
        """The publish kernel reads ids where they lie: a contiguous int64 tensor on this device."""
        if not (getattr(ids, "is_cuda", False) and str(ids.dtype) == "torch.int64" and ids.is_contiguous()):
            what, where = getattr(ids, "dtype", type(ids).__name__), getattr(ids, "device", "the host")
            raise InvalidRequestError(f"{name} must be a contiguous int64 CUDA tensor, got {what} on {where}")

    def wait_word(self, stream: Any, address: int, value: int) -> None:
        """Enqueue on `stream` (default: current): wait until the int64 at `address` reaches value.

        Refused while the stream is being captured (`refuse_in_capture`)."""
        self._bind_thread()
        stream = stream if stream is not None else self._torch.cuda.current_stream(self.device)
        refuse_in_capture(stream.cuda_stream)
        self.wait(stream.cuda_stream, address, value)

    def wait_seq(self, stream: Any, seq_at: int, words_base: int, words: int) -> None:
        """Enqueue on `stream`, which may be capturing a CUDA graph: wait until the wait word of the request
        whose seq the int64 at `seq_at` (device memory, written by an earlier publish on `stream`) holds
        reaches that seq, or every copy CTA has copied the request early (its mirror row's head says so); the
        words are `words` int64 at `words_base` (`pulseio._wait_words`)."""
        self._bind_thread()
        stream = stream if stream is not None else self._torch.cuda.current_stream(self.device)
        self.wait_for_seq(stream.cuda_stream, seq_at, words_base, words, self.mirror_heads.data_ptr(),
                          self.mirror_heads.shape[0])

    def _bind_thread(self) -> None:
        if not getattr(self._thread_ready, "ready", False):
            self._torch.cuda.set_device(self.device)
            if self._context is not None:
                driver.set_current(self._context)
            self._thread_ready.ready = True

    def drain_sync(self, timeout: float) -> bool:
        """Wait up to `timeout` s until the device has run everything enqueued so far (close only); False if
        it has not (the device may still write the ring). The wait runs on a helper thread, which is left
        behind if the device never drains."""
        done = threading.Event()

        def drain() -> None:
            self._torch.cuda.synchronize(self.device)
            done.set()

        threading.Thread(target=drain, name="pulseio-drain", daemon=True).start()
        return done.wait(timeout)

    def close(self) -> None:
        pass
