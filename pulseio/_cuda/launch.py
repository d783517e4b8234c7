"""Launch the numba `copy_blocks` kernel with pre-packed arguments, straight through cuLaunchKernel.

numba's own launch path types every argument and parses `__cuda_array_interface__` on each call
(tens of microseconds), and cuda.core's `launch` still costs about 8 us on the H200 host; a 64-block
recall has a budget of about 20. Here the argument block is one ctypes array written in place and
cuLaunchKernel is called through ctypes (GIL released for the call). Each array argument is laid
out the way numba lays it out in the kernel's parameter list: meminfo, parent, nitems, itemsize,
data, shape..., strides....
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from cuda.bindings import driver as cu

from . import driver
from .kernels import THREADS_PER_CTA, compile_copy_blocks

_WORD = 8
_LaunchFn = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,  # CUfunction
    ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,  # grid
    ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,  # block
    ctypes.c_uint,  # shared memory bytes
    ctypes.c_void_p,  # CUstream
    ctypes.c_void_p,  # void **kernelParams
    ctypes.c_void_p,  # void **extra
)


@dataclass(frozen=True)
class BlockArray:
    """A [rows, block_bytes] byte region at a device-visible address, seen by the kernel as uint64 words."""

    ptr: int
    rows: int
    block_bytes: int

    @cached_property
    def kernel_args(self) -> tuple[int, ...]:
        return array_args(self.ptr, (self.rows, self.block_bytes // _WORD))


def array_args(ptr: int, shape: tuple[int, ...], itemsize: int = 8) -> tuple[int, ...]:
    """A C-contiguous array at a device-visible address as numba lays it out in a kernel's parameters."""
    nitems, strides, step = 1, [], itemsize
    for d in reversed(shape):
        strides.insert(0, step)
        step *= d
        nitems *= d
    return (0, 0, nitems, itemsize, ptr, *shape, *strides)


def _id_args(ptr: int, n: int) -> tuple[int, ...]:
    return array_args(ptr, (n,))


_NUM_ARGS = 9 + 7 + 9 + 7 + 1  # src, src_ids, dst, dst_ids, n


class PackedKernel:
    """A compiled numba kernel and its argument block (`values`, one int64 word per parameter word),
    launched straight through cuLaunchKernel. The caller writes `values` in place between launches."""

    def __init__(self, dispatcher: Any, num_words: int) -> None:
        (compiled,) = dispatcher.overloads.values()
        kernel = compiled._codelibrary.get_cufunc().handle  # a CUkernel (library-based loading)
        self._function = driver.kernel_function(kernel)
        self._launch = _LaunchFn(driver.proc_address("cuLaunchKernel", 4000))
        self.values = (ctypes.c_int64 * num_words)()
        base = ctypes.addressof(self.values)
        self._params = (ctypes.c_void_p * num_words)(*(base + _WORD * i for i in range(num_words)))
        self._params_ptr = ctypes.addressof(self._params)
        self._name = getattr(dispatcher, "__name__", "kernel")

    def launch(self, stream_handle: int, grid: int, threads: int) -> None:
        status = self._launch(self._function, grid, 1, 1, threads, 1, 1, 0, stream_handle, self._params_ptr, None)
        if status:
            driver.check(f"cuLaunchKernel({self._name})", (cu.CUresult(status),))


class CopyBlocksLauncher:
    """Launches copy_blocks on a stream with a fixed CTA budget. Not thread-safe: one per issuer
    (the routes' issue lock serialises issues)."""

    def __init__(self, *, max_ctas: int) -> None:
        self._kernel = PackedKernel(compile_copy_blocks(), _NUM_ARGS)
        self._max_ctas = max_ctas
        self._arrays: tuple[BlockArray, BlockArray] | None = None  # (src, dst) the block holds now

    def __call__(
        self,
        stream_handle: int,
        src: BlockArray,
        src_ids_ptr: int,
        dst: BlockArray,
        dst_ids_ptr: int,
        n: int,
    ) -> None:
        """Copy n blocks: src row src_ids[b] -> dst row dst_ids[b]; ids are [n] int64 at device-visible addresses."""
        values = self._kernel.values
        if self._arrays is not None and self._arrays[0] is src and self._arrays[1] is dst:
            # same pools as last time (every zero-copy recall): only the ids and the count change
            values[11] = values[14] = values[27] = values[30] = values[32] = n
            values[13], values[29] = src_ids_ptr, dst_ids_ptr
        else:
            values[:] = (*src.kernel_args, *_id_args(src_ids_ptr, n), *dst.kernel_args, *_id_args(dst_ids_ptr, n), n)
            self._arrays = (src, dst)
        self._kernel.launch(stream_handle, max(1, min(n, self._max_ctas)), THREADS_PER_CTA)
