"""HostBackend: pulseio on a machine without a GPU. The "device" pool is host memory too and the
copy engine is the DMA worker thread; every route runs the same planning as on the GPU (merging,
staging pieces, coalesced runs), so the whole transfer path is exercised in CI and on laptops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._host_producer import HostProducer
from ._native.task_ring import MAX_TASK_BLOCKS
from ._resident import HostResidentCopier
from .backend import Pending
from .config import DmaConfig
from .doorbell import Doorbell
from .memory import DevicePool, HostPool
from .plan import Direction, Strategy, TransferPlan, merge_plans, pieces

_RING_SLOTS = 16  # RESIDENT tasks in flight, as on the GPU


class _HostMemory:
    def __init__(self, nbytes: int) -> None:
        self.tensor = torch.empty(nbytes, dtype=torch.uint8)
        self.device_ptr = self.tensor.data_ptr()
        self.segment_bytes = max(nbytes, 1)  # one allocation

    def close(self) -> None:
        pass


class HostBackend:
    """The CPU backend: plain host memory, copies done by pulseio's worker thread."""

    name = "host"
    device = torch.device("cpu")

    def alloc_host(self, nbytes: int, *, label: str, unit_bytes: int = 1) -> _HostMemory:
        return _HostMemory(nbytes)

    def alloc_device(self, nbytes: int, *, label: str) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def open_routes(
        self, host: HostPool, device: DevicePool, config: DmaConfig, reclaim: Callable[[], bool]
    ) -> _HostRoutes:
        return _HostRoutes(host, device, config)

    def open_publisher(self, doorbell: Doorbell, ids_mirror_rows: int = 0) -> HostProducer:
        return HostProducer(doorbell)  # no device memory: ids_mirror_rows does not apply


class _HostRoutes:
    available = frozenset(
        {Strategy.PER_BLOCK, Strategy.GATHER_DMA, Strategy.ZERO_COPY, Strategy.RESIDENT, Strategy.BATCHED}
    )
    inline = frozenset({Strategy.RESIDENT})  # a post; the other host routes do the copying themselves
    raises_on_device = frozenset({Strategy.RESIDENT})  # the serving thread stores the word, as the kernel does
    posted = frozenset({Strategy.RESIDENT})  # an unordered issue is a post into the task ring

    def __init__(self, host: HostPool, device: DevicePool, config: DmaConfig) -> None:
        self._host = host.blocks  # [num_blocks, block_bytes] uint8
        self._dev = device.slots  # [num_slots, block_bytes] uint8
        self._capacity = max(1, config.staging_bytes // host.block_bytes)
        self._staging = torch.empty(self._capacity, host.block_bytes, dtype=torch.uint8)
        # RESIDENT: a thread serves the same task ring as the GPU kernel (and the doorbell's fast lane)
        self.resident = HostResidentCopier(host.backend.alloc_host, self._host, self._dev, slots=_RING_SLOTS,
                                           cap=min(config.merge_blocks, MAX_TASK_BLOCKS))

    def record_after(self) -> Any:
        return None

    def issue(
        self, strategy: Strategy, plans: Sequence[TransferPlan], after: Sequence[Any],
        emit: Callable[[Pending], None], raise_on_landed: tuple[int, int] | None = None,
        posted_task: int | None = None,
    ) -> None:
        plan = merge_plans(list(plans))
        if strategy is Strategy.RESIDENT:
            return self.resident.post_plan(plan, emit, raise_on_landed=raise_on_landed, posted_task=posted_task)
        src, dst = (self._host, self._dev) if plan.direction is Direction.H2D else (self._dev, self._host)
        src_ids, dst_ids = (
            (plan.host_ids, plan.device_slots) if plan.direction is Direction.H2D
            else (plan.device_slots, plan.host_ids)
        )
        if strategy is Strategy.PER_BLOCK:
            for s, d in zip(src_ids.tolist(), dst_ids.tolist()):
                dst[d].copy_(src[s])
        elif strategy is Strategy.BATCHED:
            host_start, slot_start, length = plan.runs
            starts = (host_start, slot_start) if plan.direction is Direction.H2D else (slot_start, host_start)
            for s, d, n in zip(starts[0].tolist(), starts[1].tolist(), length.tolist()):
                dst[d : d + n].copy_(src[s : s + n])
        elif strategy is Strategy.GATHER_DMA:
            for host_ids, slots in pieces(plan, self._capacity):
                s_ids, d_ids = (host_ids, slots) if plan.direction is Direction.H2D else (slots, host_ids)
                staged = self._staging[: len(s_ids)]
                torch.index_select(src, 0, torch.from_numpy(s_ids), out=staged)
                dst.index_copy_(0, torch.from_numpy(d_ids), staged)
        elif strategy is Strategy.ZERO_COPY:  # a GPU kernel's work: one index copy
            dst.index_copy_(0, torch.from_numpy(dst_ids), src.index_select(0, torch.from_numpy(src_ids)))
        else:
            raise ValueError(f"unknown strategy {strategy!r}")

    def bind_thread(self) -> None:
        pass

    def synchronize(self, event: Any) -> None:
        if event is not None:
            event.synchronize()

    def query(self, event: Any) -> bool:
        return event is None or event.query()

    def close(self) -> None:
        self.resident.close()
