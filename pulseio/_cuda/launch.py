"""Launch the numba `copy_blocks` kernel with pre-packed arguments through cuda.core.

numba's own launch path types every argument and parses `__cuda_array_interface__` on each call
(tens of microseconds); a 64-block recall has a budget of about 20. Here the compiled kernel's
cuda.core handle is launched directly, with each array passed the way numba lays it out in the
kernel's parameter list: meminfo, parent, nitems, itemsize, data, shape..., strides....
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cached_property

from cuda.core import LaunchConfig, Stream, launch

from .kernels import THREADS_PER_CTA, compile_copy_blocks

_WORD = 8


@dataclass(frozen=True)
class BlockArray:
    """A [rows, block_bytes] byte region at a device-visible address, seen by the kernel as uint64 words."""

    ptr: int
    rows: int
    block_bytes: int

    @cached_property
    def kernel_args(self) -> tuple[int, ...]:
        words = self.block_bytes // _WORD
        return (0, 0, self.rows * words, _WORD, self.ptr, self.rows, words, words * _WORD, _WORD)


def _id_args(ptr: int, n: int) -> tuple[int, ...]:
    return (0, 0, n, 8, ptr, n, 8)


class CopyBlocksLauncher:
    """Launches copy_blocks on a stream with a fixed CTA budget."""

    def __init__(self, *, max_ctas: int) -> None:
        dispatcher = compile_copy_blocks()
        (compiled,) = dispatcher.overloads.values()
        self._kernel = compiled._codelibrary.get_cufunc().kernel
        self._max_ctas = max_ctas
        self._configs: dict[int, LaunchConfig] = {}
        self._streams: dict[int, Stream] = {}

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
        ctas = max(1, min(n, self._max_ctas))
        config = self._configs.get(ctas)
        if config is None:
            config = self._configs[ctas] = LaunchConfig(grid=ctas, block=THREADS_PER_CTA)
        stream = self._streams.get(stream_handle)
        if stream is None:
            stream = self._streams[stream_handle] = Stream.from_handle(stream_handle)
        launch(
            stream,
            config,
            self._kernel,
            *src.kernel_args,
            *_id_args(src_ids_ptr, n),
            *dst.kernel_args,
            *_id_args(dst_ids_ptr, n),
            ctypes.c_int64(n),
        )
