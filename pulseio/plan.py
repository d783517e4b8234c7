"""TransferPlan: validated (host block, device slot) pairs of one transfer; numpy, no torch.

Validation is one compiled pass (`_native.validate`, numpy where numba is missing) on the
submitting thread, before anything is queued: a bad request raises and leaves nothing behind.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np

if TYPE_CHECKING:
    import torch

from ._native import validate as _native
from .errors import InvalidRequestError, PoolTooSmallError

IdArray = Union[np.ndarray, "torch.Tensor", Sequence[int]]  # [n] integer ids, on the host


class Direction(enum.Enum):
    """Which way a transfer goes: H2D recalls host blocks to device slots, D2H offloads back."""

    # Enum's own __hash__ is Python code (hash of the name); members are singletons, so identity
    # hashing is equivalent and C-fast. Set and dict lookups of these run several times per transfer.
    __hash__ = object.__hash__

    H2D = "h2d"  # recall: host pool -> device pool
    D2H = "d2h"  # offload: device pool -> host pool


class Strategy(enum.Enum):
    """How a transfer is carried out. `AUTO` picks one by direction, block size and count."""

    __hash__ = object.__hash__  # see Direction

    PER_BLOCK = "per_block"  # one copy per block: the baseline
    GATHER_DMA = "gather_dma"  # CPU gather into pinned staging, one DMA, GPU scatter kernel
    ZERO_COPY = "zero_copy"  # GPU kernel reads/writes pinned host memory through UVA
    RESIDENT = "resident"  # zero-copy kernel that stays on the GPU, fed through a pinned task ring
    BATCHED = "batched"  # cuMemcpyBatchAsync over coalesced runs
    AUTO = "auto"


_INT64 = np.dtype(np.int64)  # builtin dtypes are singletons: `is` is the cheap test (another int64 dtype
# object, e.g. big-endian, just takes the general path)


def as_id_array(ids: Any, *, name: str) -> np.ndarray:
    """ids: [n] any integer dtype, host (list, numpy, CPU torch tensor) -> [n] int64 numpy, C-contiguous (the
    one layout the compiled id check is compiled for)."""
    if type(ids) is np.ndarray and ids.dtype is _INT64 and ids.ndim == 1 and ids.flags.c_contiguous:
        return ids  # the common case, on every submit: skip the general checks
    device = getattr(ids, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        raise InvalidRequestError(
            f"{name} must be on the host, got a tensor on {device}; "
            "GPU-produced ids reach pulseio through the doorbell ring, without a sync"
        )
    array = np.asarray(ids)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        if array.size == 0 and array.dtype == np.float64:  # np.asarray([]) is float64
            array = array.astype(np.int64)
        else:
            raise TypeError(f"{name} must have an integer dtype, got {array.dtype}")
    if array.ndim != 1:
        raise InvalidRequestError(f"{name} must be one-dimensional, got shape {array.shape}")
    return np.ascontiguousarray(array, dtype=np.int64)


def _check_range(ids: np.ndarray, limit: int, *, name: str, pool: str) -> None:
    if ids.size == 0:
        return
    bad = np.flatnonzero((ids < 0) | (ids >= limit))
    if bad.size:
        i = int(bad[0])
        raise InvalidRequestError(
            f"{name}[{i}] = {int(ids[i])} is out of range: {pool} has ids 0..{limit - 1}"
            + (f" ({bad.size} ids out of range in all)" if bad.size > 1 else "")
        )


def _check_unique(ids: np.ndarray, *, name: str) -> None:
    if ids.size < 2:
        return
    order = np.argsort(ids, kind="stable")
    repeated = np.flatnonzero(ids[order[1:]] == ids[order[:-1]])
    if repeated.size:
        j = int(repeated[0])
        first, second = sorted((int(order[j]), int(order[j + 1])))
        raise InvalidRequestError(
            f"{name} must not repeat a destination: {name}[{first}] and {name}[{second}] "
            f"are both {int(ids[first])}"
        )


class TransferPlan:
    """host_ids, device_slots: [n] int64 numpy; pair b moves block host_ids[b] <-> slot device_slots[b].

    Read-only once made (by `make_plan`, which validated it). A plain slotted class, not a frozen
    dataclass: one is built per transfer, and a frozen dataclass costs ~0.7 us to build and every
    derived property a Python call (host-side microseconds are what bounds small transfers)."""

    __slots__ = ("direction", "host_ids", "device_slots", "block_bytes", "num_blocks", "nbytes", "_runs",
                 "_segment_runs")

    def __init__(self, direction: Direction, host_ids: np.ndarray, device_slots: np.ndarray, block_bytes: int) -> None:
        self.direction = direction
        self.host_ids = host_ids
        self.device_slots = device_slots
        self.block_bytes = block_bytes
        self.num_blocks: int = host_ids.size
        self.nbytes: int = self.num_blocks * block_bytes
        self._runs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._segment_runs: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None

    def __repr__(self) -> str:
        return f"TransferPlan({self.direction.value}, {self.num_blocks} blocks of {self.block_bytes} B)"

    @property
    def runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Coalesced runs (host_start, slot_start, length): pairs consecutive on both sides, sorted by host id."""
        if self._runs is None:
            order = np.argsort(self.host_ids, kind="stable")
            host, slot = self.host_ids[order], self.device_slots[order]
            breaks = np.flatnonzero((np.diff(host) != 1) | (np.diff(slot) != 1)) + 1
            starts = np.concatenate(([0], breaks)) if host.size else breaks
            lengths = np.diff(np.concatenate((starts, [host.size])))
            self._runs = host[starts], slot[starts], lengths
        return self._runs

    def runs_within(self, segment: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`runs`, cut where the host side crosses a multiple of `segment` blocks (`split_runs`); kept, as
        `runs` is, so a plan submitted again and again is cut once."""
        cached = self._segment_runs
        if cached is None or cached[0] != segment:
            cached = self._segment_runs = (segment, split_runs(*self.runs, segment))
        return cached[1]


def split_runs(host_start: np.ndarray, slot_start: np.ndarray, length: np.ndarray, segment: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs (as `TransferPlan.runs`) cut where the host side crosses a multiple of `segment` blocks: the host
    pool is pinned in segments, and one DMA must not span two."""
    first = host_start // segment
    pieces = (host_start + length - 1) // segment - first + 1
    if pieces.size == 0 or int(pieces.max()) == 1:
        return host_start, slot_start, length
    run = np.repeat(np.arange(length.size), pieces)
    k = np.arange(run.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # piece index within its run
    seg = first[run] + k
    start = np.maximum(host_start[run], seg * segment)
    end = np.minimum(host_start[run] + length[run], (seg + 1) * segment)
    return start, slot_start[run] + (start - host_start[run]), end - start


def make_plan(
    direction: Direction,
    host_ids: Any,
    device_slots: Any,
    *,
    num_host_blocks: int,
    num_device_slots: int,
    block_bytes: int,
) -> TransferPlan:
    """Validate one transfer's ids against the pools; raise before anything moves."""
    host = as_id_array(host_ids, name="host_ids")
    slots = as_id_array(device_slots, name="device_slots")
    if host.size != slots.size:
        raise InvalidRequestError(
            f"host_ids and device_slots must have the same length, got {host.size} and {slots.size}"
        )
    if direction is Direction.H2D and slots.size > num_device_slots:
        raise PoolTooSmallError(
            f"a recall of {slots.size} blocks needs as many device slots, the device pool has {num_device_slots}"
        )
    unique_host = direction is Direction.D2H  # the destination side must not repeat
    if _native.NATIVE:
        code, _ = _native.check_ids(host, slots, num_host_blocks, num_device_slots, unique_host)
        if code == _native.OK:
            return TransferPlan(direction, host, slots, block_bytes)
    # numpy checks: the whole validation without numba, and the exact message when numba found a fault
    _check_range(host, num_host_blocks, name="host_ids", pool="the host pool")
    _check_range(slots, num_device_slots, name="device_slots", pool="the device pool")
    _check_unique(host if unique_host else slots, name="host_ids" if unique_host else "device_slots")
    return TransferPlan(direction, host, slots, block_bytes)


def merge_plans(plans: list[TransferPlan]) -> TransferPlan:
    """One plan holding the pairs of several plans of one direction (the worker merges queued transfers)."""
    if len(plans) == 1:
        return plans[0]
    return TransferPlan(
        plans[0].direction,
        np.concatenate([p.host_ids for p in plans]),
        np.concatenate([p.device_slots for p in plans]),
        plans[0].block_bytes,
    )


def pieces(plan: TransferPlan, capacity: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(host_ids, device_slots) slices of at most `capacity` pairs: what one staging buffer holds."""
    return [
        (plan.host_ids[i : i + capacity], plan.device_slots[i : i + capacity])
        for i in range(0, plan.num_blocks, capacity)
    ]
