"""Block pools: HostPool (pinned host memory on the CUDA backend) and DevicePool (GPU slots).

Both are byte slabs of fixed-size blocks addressed by id; they hold no policy. `blocks` / `slots`
are [n, block_bytes] uint8 tensors; `view(dtype, *shape)` reinterprets them for a model.
"""

from __future__ import annotations

import torch

from .backend import Backend, HostMemory
from .errors import ClosedError, InsufficientMemoryError, InvalidRequestError

SEGMENT_TARGET_BYTES = 1 << 30  # host memory is pinned in segments of about this size


def segment_bytes(unit_bytes: int, target: int = SEGMENT_TARGET_BYTES) -> int:
    """Pinning segment size: the largest whole multiple of unit_bytes up to target (one unit if larger), so
    no block straddles two segments."""
    if unit_bytes < 1:
        raise ValueError(f"unit_bytes must be >= 1, got {unit_bytes}")
    return max(1, target // unit_bytes) * unit_bytes

_MIN_BLOCK = 16


def _check_geometry(kind: str, count: int, block_bytes: int) -> None:
    if not isinstance(count, int) or count < 1:
        raise InvalidRequestError(f"{kind} needs at least one block, got {count!r}")
    if not isinstance(block_bytes, int) or block_bytes < _MIN_BLOCK or block_bytes % _MIN_BLOCK:
        raise InvalidRequestError(
            f"block_bytes must be a positive multiple of {_MIN_BLOCK}, got {block_bytes!r}"
        )


def _available_host_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _view(tensor: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    rows, block_bytes = tensor.shape
    per_block = torch.empty((), dtype=dtype).element_size()
    for dim in shape:
        per_block *= dim
    if per_block != block_bytes:
        raise InvalidRequestError(
            f"a block of shape {shape} and dtype {dtype} takes {per_block} bytes, blocks here have {block_bytes}"
        )
    return tensor.view(dtype).view(rows, *shape)


class _DeviceMapped:
    """A device address range as `__cuda_array_interface__`, so torch can alias it without a copy."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "strides": None, "version": 3}


class HostPool:
    """`num_blocks` blocks of `block_bytes` each in host memory, addressed by id 0..num_blocks-1: where the
    offloaded KV cache lives.

        backend = pulseio.open_backend("auto")        # CudaBackend with a GPU, HostBackend without
        host = pulseio.HostPool(backend, num_blocks=262_144, block_bytes=8192)
        host.blocks[7]                                 # [block_bytes] uint8, CPU: block 7
        host.view(torch.bfloat16, 2, 16, 128)          # [num_blocks, 2, 16, 128] bf16 alias of the pool

    backend: from `pulseio.open_backend`. On the CUDA backend the memory is pinned and mapped into the
        GPU's address space (the copy engine and copy kernels read it with no staging); on `HostBackend`
        it is ordinary memory, and the same code runs without a GPU.
    num_blocks, block_bytes: the geometry; block_bytes is a positive multiple of 16. A pool larger than
        the machine's available memory raises `InsufficientMemoryError` before anything is allocated.

    Move blocks with a `DmaEngine` (ids chosen on the host) or a `Runtime` (ids chosen on the GPU); the
    pool itself holds no policy. `device_view` aliases it from the device. `close()` (or `with`) frees
    it: only once no transfer uses it.
    """

    def __init__(self, backend: Backend, num_blocks: int, block_bytes: int) -> None:
        _check_geometry("HostPool", num_blocks, block_bytes)
        nbytes = num_blocks * block_bytes
        available = _available_host_bytes()
        if available is not None and nbytes > available:
            raise InsufficientMemoryError(
                f"a host pool of {num_blocks} x {block_bytes} B needs {nbytes / 2**30:.2f} GiB, "
                f"the machine has {available / 2**30:.2f} GiB available"
            )
        self.backend = backend
        self.num_blocks = num_blocks
        self.block_bytes = block_bytes
        self._memory: HostMemory | None = backend.alloc_host(nbytes, label="host pool", unit_bytes=block_bytes)
        self.blocks = self._memory.tensor.view(num_blocks, block_bytes)  # [num_blocks, block_bytes] uint8
        # blocks per pinned segment: a copy-engine DMA never spans two (`pulseio.plan.split_runs`)
        self.segment_blocks: int = max(1, self._memory.segment_bytes // block_bytes)

    @property
    def device_ptr(self) -> int:
        if self._memory is None:
            raise ClosedError("this HostPool is closed")
        return self._memory.device_ptr

    def view(self, dtype: torch.dtype, *shape: int) -> torch.Tensor:
        """The pool as [num_blocks, *shape] of dtype (shape must fill a block exactly)."""
        return _view(self.blocks, dtype, shape)

    def device_view(self, dtype: torch.dtype, *shape: int) -> torch.Tensor:
        """The pool as [num_blocks, *shape] of dtype on the backend's device, aliasing the host memory:
        a kernel that writes it stores straight into the pool over the bus, in stream order, with no
        copy call and no host sync (how a decode step appends its new KV to the host copy). On the
        host backend this is `view`. Valid until the pool is closed."""
        if self.backend.device.type == "cpu":
            return self.view(dtype, *shape)
        mapped = torch.as_tensor(_DeviceMapped(self.device_ptr, self.num_blocks * self.block_bytes),
                                 device=self.backend.device)
        return _view(mapped.view(self.num_blocks, self.block_bytes), dtype, shape)

    def close(self) -> None:
        """Unpin the memory. Call only once no transfer uses the pool (the DmaEngine closes first)."""
        if self._memory is not None:
            self._memory.close()
            self._memory = None

    def __enter__(self) -> HostPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DevicePool:
    """`num_slots` blocks of `block_bytes` each on the backend's device, addressed by slot 0..num_slots-1:
    where recalled blocks land and offloaded ones are read from.

        device = pulseio.DevicePool(backend, num_slots=8192, block_bytes=8192)
        device.slots                                   # [num_slots, block_bytes] uint8 on backend.device
        device.view(torch.bfloat16, 2, 16, 128)        # [num_slots, 2, 16, 128] bf16 alias, for a model

    backend: the same one as the HostPool it pairs with (`pulseio.open_backend`); on `HostBackend` the
        "device" is the CPU. num_slots, block_bytes: the geometry; block_bytes is a positive multiple of
        16 and equals the HostPool's. `close()` (or `with`) drops the memory: only once no transfer uses it.
    """

    def __init__(self, backend: Backend, num_slots: int, block_bytes: int) -> None:
        _check_geometry("DevicePool", num_slots, block_bytes)
        self.backend = backend
        self.num_slots = num_slots
        self.block_bytes = block_bytes
        self.slots = backend.alloc_device(num_slots * block_bytes, label="device pool").view(
            num_slots, block_bytes
        )  # [num_slots, block_bytes] uint8, backend.device
        self._closed = False

    @property
    def device_ptr(self) -> int:
        if self._closed:
            raise ClosedError("this DevicePool is closed")
        return self.slots.data_ptr()

    def close(self) -> None:
        """Drop the pool's memory (the allocator reuses it once the device is done with it). Call only once no
        transfer uses the pool (the DmaEngine closes first)."""
        self._closed = True
        self.slots = self.slots[:0]

    def __enter__(self) -> DevicePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def view(self, dtype: torch.dtype, *shape: int) -> torch.Tensor:
        """The pool as [num_slots, *shape] of dtype (shape must fill a block exactly)."""
        return _view(self.slots, dtype, shape)
