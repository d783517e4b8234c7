"""CudaBackend: pinned host pool, GPU slot pool, and the routes: four on one copy stream, RESIDENT on its own.

Staging buffer layout (pinned and device twins, `capacity` blocks each):
    [ blocks: capacity x block_bytes | ids: capacity x int64 ]
A recall piece of m blocks is gathered into rows 0..m-1 and its destination slot ids are written
right behind them, at byte m*block_bytes, so blocks and ids travel in ONE contiguous DMA; the scatter
kernel then reads the ids from device memory. An offload piece writes its source slot ids at the
fixed ids area, where the gather kernel reads them through UVA.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .._native.task_ring import MAX_TASK_BLOCKS
from ..backend import Pending
from ..config import DmaConfig
from ..doorbell import Doorbell
from ..errors import DeviceUnavailableError, PoolTooSmallError
from ..memory import DevicePool, HostPool, segment_bytes
from ..plan import Direction, Strategy, TransferPlan, merge_plans, pieces
from . import driver
from .buffers import ID_BYTES as _ID
from .buffers import BufferRing
from .doorbell_kernels import DevicePublisher
from .hostmem import PinnedBuffer
from .launch import BlockArray, CopyBlocksLauncher
from .resident import ResidentCopier

log = logging.getLogger(__name__)
_ID_BUFFERS = 16  # zero-copy id buffers: one per transfer in flight before an issuer must reclaim


def _words(rows: torch.Tensor) -> torch.Tensor:
    """[n, block_bytes] uint8 -> [n, block_bytes / 8] int64. ATen's CPU index_select copies a row
    with one memcpy only while a row has fewer than 32768 elements: as bytes, a 64 KiB block
    falls to an element-wise loop (~1.4 GB/s measured on the H200 host), as words it does not."""
    return rows.view(torch.int64)


class CudaBackend:
    """The GPU backend. Construct it only where torch sees a CUDA device."""

    name = "cuda"

    def __init__(self, device: int | str | torch.device = "cuda") -> None:
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                "the CUDA backend needs a CUDA GPU, and torch sees none; use pulseio.HostBackend() on this machine"
            )
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise DeviceUnavailableError(f"CudaBackend needs a cuda device, got {self.device}")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.init()
        driver.init()
        self.context = driver.primary_context(self.device.index)

    def alloc_host(self, nbytes: int, *, label: str, unit_bytes: int = 1) -> PinnedBuffer:
        return PinnedBuffer(nbytes, context=self.context, label=label, chunk_bytes=segment_bytes(unit_bytes))

    def alloc_device(self, nbytes: int, *, label: str) -> torch.Tensor:
        free, _ = torch.cuda.mem_get_info(self.device)
        if nbytes > free:
            raise PoolTooSmallError(
                f"the {label} needs {nbytes / 2**30:.2f} GiB of GPU memory, {self.device} has "
                f"{free / 2**30:.2f} GiB free"
            )
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def open_routes(
        self, host: HostPool, device: DevicePool, config: DmaConfig, reclaim: Callable[[], bool]
    ) -> CudaRoutes:
        return CudaRoutes(self, host, device, config, reclaim)

    def open_publisher(self, doorbell: Doorbell, ids_mirror_rows: int = 0) -> DevicePublisher:
        layout = doorbell.layout
        return DevicePublisher(self.device, self.context, doorbell.device_ptr, layout.capacity, layout.slot_words,
                               ids_mirror_rows)


class CudaRoutes:
    available = frozenset(
        {Strategy.PER_BLOCK, Strategy.GATHER_DMA, Strategy.ZERO_COPY, Strategy.RESIDENT, Strategy.BATCHED}
    )
    # issuing is a launch, a driver call or a post: no bulk CPU work
    inline = frozenset({Strategy.ZERO_COPY, Strategy.RESIDENT, Strategy.BATCHED})
    raises_on_device = frozenset({Strategy.RESIDENT})  # its kernel sets the request's word when a task lands
    posted = frozenset({Strategy.RESIDENT})  # an unordered issue is a post into the task ring: no driver call

    def __init__(
        self, backend: CudaBackend, host: HostPool, device: DevicePool, config: DmaConfig,
        reclaim: Callable[[], bool],
    ) -> None:
        self._device = backend.device
        self._context = backend.context
        self._thread_ready = threading.local()  # the worker thread binds the device once
        self._host = host
        self._pool = device
        self._bb = host.block_bytes
        if self._bb % 8:
            raise PoolTooSmallError(f"the CUDA routes move blocks as 8-byte words; block_bytes={self._bb}")
        self._bind_thread()  # the launcher resolves its kernel in the current context
        with contextlib.ExitStack() as built:  # a part that fails frees those built before it, in reverse
            # the highest priority: under a GEMM, the scatter / zero-copy CTAs get SMs as soon as any free up
            self._own_stream = driver.OwnStream(self._device)
            built.callback(self._own_stream.destroy)
            self.stream = self._own_stream.torch
            self._stream_handle = self.stream.cuda_stream
            self._copy_blocks = CopyBlocksLauncher(max_ctas=config.zero_copy_ctas)
            # host seconds spent per stage of the gather_dma recall path, cumulative (read by diagnostics)
            self.stage_seconds: Counter[str] = Counter()
            self._capacity = max(1, config.staging_bytes // self._bb)
            self._staging = BufferRing(
                backend, config.staging_buffers, self._capacity * (self._bb + _ID), True, "staging", reclaim
            )
            built.callback(self._staging.close)
            self._id_capacity = config.merge_blocks
            self._ids = BufferRing(backend, _ID_BUFFERS, 2 * self._id_capacity * _ID, False, "id ring", reclaim)
            built.callback(self._ids.close)
            self._id_views = [b.tensor.numpy().view(np.int64) for b in self._ids.pinned]
            self._arange = torch.arange(self._capacity, dtype=torch.int64, device=self._device)
            self._batch = {
                Direction.H2D: driver.MemcpyBatch(host_to_device=True, device_ordinal=self._device.index),
                Direction.D2H: driver.MemcpyBatch(host_to_device=False, device_ordinal=self._device.index),
            }
            self._host_array = BlockArray(host.device_ptr, host.num_blocks, self._bb)
            self._pool_array = BlockArray(device.device_ptr, device.num_slots, self._bb)
            # Load the kernel now: under CUDA lazy loading its first launch waits for the device to go
            # idle, which deadlocks if a consumer stream is already waiting for this very copy.
            arange = self._arange.data_ptr()
            self._copy_blocks(self.stream.cuda_stream, self._pool_array, arange, self._pool_array, arange, 0)
            self.stream.synchronize()
            self._resident = ResidentCopier(
                backend, self._host_array, self._pool_array, ctas=config.zero_copy_ctas, slots=_ID_BUFFERS,
                cap=min(config.merge_blocks, MAX_TASK_BLOCKS), idle_us=config.resident_idle_us,
            )
            built.callback(self._resident.close)
            self._teardown = built.pop_all()  # what `close` frees: the same parts, in reverse
        self._routes = {
            Strategy.RESIDENT: self._route_resident, Strategy.ZERO_COPY: self._route_zero_copy,
            Strategy.BATCHED: self._route_batched, Strategy.GATHER_DMA: self._route_gather_dma,
            Strategy.PER_BLOCK: self._route_per_block,
        }

    # -- RouteSet ------------------------------------------------------------------------------

    def record_after(self) -> Any:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self._device))
        return event

    def issue(
        self, strategy: Strategy, plans: Sequence[TransferPlan], after: Sequence[Any],
        emit: Callable[[Pending], None], raise_on_landed: tuple[int, int] | None = None,
        posted_task: int | None = None,
    ) -> None:
        self._bind_thread()
        for event in after:
            self.stream.wait_event(event)
        plan = plans[0] if len(plans) == 1 else merge_plans(list(plans))
        self._routes[strategy](plan, emit, bool(after), raise_on_landed, posted_task)

    # -- the routes: one per strategy, each (plan, emit, ordered, raise_on_landed, posted_task) -------

    def _route_resident(self, plan: TransferPlan, emit: Callable[[Pending], None], ordered: bool,
                        raise_on_landed: tuple[int, int] | None, posted_task: int | None) -> None:
        # stream-ordered: the copy stream (already waiting on the callers' streams) releases the task
        self._resident.post_plan(plan, emit, ordered_on=self._stream_handle if ordered else None,
                                 raise_on_landed=raise_on_landed, posted_task=posted_task)

    def _route_zero_copy(self, plan: TransferPlan, emit: Callable[[Pending], None], *_: Any) -> None:
        self._zero_copy(plan, emit)

    def _route_batched(self, plan: TransferPlan, emit: Callable[[Pending], None], *_: Any) -> None:
        self._batched(plan)
        emit(Pending(self._record()))

    def _route_gather_dma(self, plan: TransferPlan, emit: Callable[[Pending], None], *_: Any) -> None:
        with torch.cuda.stream(self.stream):  # torch copies below go to the copy stream
            self._gather_dma(plan, emit)

    def _route_per_block(self, plan: TransferPlan, emit: Callable[[Pending], None], *_: Any) -> None:
        with torch.cuda.stream(self.stream):
            self._per_block(plan)
            emit(Pending(self._record()))

    def synchronize(self, event: Any) -> None:
        self._bind_thread()
        event.synchronize()

    def bind_thread(self) -> None:
        self._bind_thread()

    def _bind_thread(self) -> None:
        """Make our device and context current on the calling thread (once per thread), in relaxed capture
        mode: a graph captured on another thread must not make our copies and queries illegal."""
        if not getattr(self._thread_ready, "ready", False):
            torch.cuda.set_device(self._device)
            driver.set_current(self._context)
            driver.relax_stream_capture()
            self._thread_ready.ready = True

    def query(self, event: Any) -> bool:
        self._bind_thread()
        return event.query()

    def close(self) -> None:
        self.stream.synchronize()
        self._teardown.close()

    # -- routes --------------------------------------------------------------------------------

    def _record(self) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def _per_block(self, plan: TransferPlan) -> None:
        host, pool = self._host.blocks, self._pool.slots
        pairs = zip(plan.host_ids.tolist(), plan.device_slots.tolist())
        if plan.direction is Direction.H2D:
            for h, d in pairs:
                pool[d].copy_(host[h], non_blocking=True)
        else:
            for h, d in pairs:
                host[h].copy_(pool[d], non_blocking=True)

    def _batched(self, plan: TransferPlan) -> None:
        host_start, slot_start, length = plan.runs_within(self._host.segment_blocks)
        host_ptrs = (self._host.device_ptr + host_start * self._bb).astype(np.uint64)
        slot_ptrs = (self._pool.device_ptr + slot_start * self._bb).astype(np.uint64)
        sizes = (length * self._bb).astype(np.uint64)
        dsts, srcs = (slot_ptrs, host_ptrs) if plan.direction is Direction.H2D else (host_ptrs, slot_ptrs)
        self._batch[plan.direction](dsts, srcs, sizes, self.stream.cuda_stream)

    def _zero_copy(self, plan: TransferPlan, emit: Callable[[Pending], None]) -> None:
        capacity = self._id_capacity
        parts = [(plan.host_ids, plan.device_slots)] if plan.num_blocks <= capacity else pieces(plan, capacity)
        for host_ids, slots in parts:  # the hot path of small recalls: keep it to a handful of calls
            with self._ids.lease(emit, self._record) as index:
                m = len(host_ids)
                ids_np = self._id_views[index]
                ids_np[:m] = host_ids
                ids_np[capacity : capacity + m] = slots
                host_ids_ptr = self._ids.pinned[index].device_ptr
                slot_ids_ptr = host_ids_ptr + capacity * _ID
                if plan.direction is Direction.H2D:
                    self._copy_blocks(self._stream_handle, self._host_array, host_ids_ptr, self._pool_array,
                                      slot_ids_ptr, m)
                else:
                    self._copy_blocks(self._stream_handle, self._pool_array, slot_ids_ptr, self._host_array,
                                      host_ids_ptr, m)
                emit(Pending(self._record(), self._ids.releaser(index)))

    @property
    def resident(self) -> ResidentCopier:
        """The RESIDENT route's copier (the doorbell poller's fast lane posts into it directly)."""
        return self._resident

    def _gather_dma(self, plan: TransferPlan, emit: Callable[[Pending], None]) -> None:
        piece_fn = self._recall_piece if plan.direction is Direction.H2D else self._offload_piece
        for host_ids, slots in pieces(plan, self._capacity):
            start = time.perf_counter()
            with self._staging.lease(emit, self._record) as index:
                self.stage_seconds["wait_staging"] += time.perf_counter() - start
                emit(piece_fn(index, host_ids, slots))

    def _recall_piece(self, index: int, host_ids: np.ndarray, slots: np.ndarray) -> Pending:
        m, bb = len(host_ids), self._bb
        pinned, dev = self._staging.pinned[index], self._staging.device[index]
        nbytes = m * bb + m * _ID
        stages, t0 = self.stage_seconds, time.perf_counter()
        torch.index_select(
            _words(self._host.blocks), 0, torch.from_numpy(host_ids), out=_words(pinned.tensor[: m * bb].view(m, bb))
        )
        pinned.tensor[m * bb : nbytes].view(torch.int64).copy_(torch.from_numpy(slots))
        t1 = time.perf_counter()
        dev[:nbytes].copy_(pinned.tensor[:nbytes], non_blocking=True)
        t2 = time.perf_counter()
        staged = BlockArray(dev.data_ptr(), m, bb)
        self._copy_blocks(
            self.stream.cuda_stream, staged, self._arange.data_ptr(), self._pool_array, dev.data_ptr() + m * bb, m
        )
        pending = Pending(self._record(), self._staging.releaser(index))
        t3 = time.perf_counter()
        stages["gather"] += t1 - t0
        stages["dma_enqueue"] += t2 - t1
        stages["scatter_launch_record"] += t3 - t2
        stages["pieces"] += 1
        return pending

    def _offload_piece(self, index: int, host_ids: np.ndarray, slots: np.ndarray) -> Pending:
        m, bb = len(host_ids), self._bb
        pinned, dev = self._staging.pinned[index], self._staging.device[index]
        ids_at = self._capacity * bb
        pinned.tensor[ids_at : ids_at + m * _ID].view(torch.int64).copy_(torch.from_numpy(slots))
        staged = BlockArray(dev.data_ptr(), m, bb)
        self._copy_blocks(
            self.stream.cuda_stream, self._pool_array, pinned.device_ptr + ids_at, staged, self._arange.data_ptr(), m
        )
        pinned.tensor[: m * bb].copy_(dev[: m * bb], non_blocking=True)
        host_index = torch.from_numpy(host_ids)
        release = self._staging.releaser(index)

        def scatter_on_host() -> None:
            try:
                _words(self._host.blocks).index_copy_(0, host_index, _words(pinned.tensor[: m * bb].view(m, bb)))
            finally:
                release()

        return Pending(self._record(), scatter_on_host)
