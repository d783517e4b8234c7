"""A weight asked of the L2 cache ahead of its GEMM, beside work that leaves the HBM idle.

An offloaded layer's sparse attention is a chain of short, latency-bound kernels (score, select, attention over
the selected blocks) that leaves the HBM partly idle. `L2Prefetch.beside` forks a side stream that asks the L2
for the weight of the GEMM after the chain (`cp.async.bulk.prefetch.L2`, 4 KiB an instruction, evict-last) and
joins it before that GEMM, which then reads its weight from the L2. Inside a captured graph the fork is a branch.
Hopper (sm_90) and later; never under Triton's interpreter.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

_CHUNK = 4096  # bytes one prefetch instruction asks for
_PER_PROGRAM = 128  # prefetches a program issues, one a thread
_EVICT_LAST = tl.constexpr("{ .reg .b64 pol; createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
                           "cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], 4096, pol; mov.u32 $0, 0; }")


@triton.jit
def _l2_prefetch_kernel(base, nbytes, PER_PROGRAM: tl.constexpr):
    offs = (tl.program_id(0) * PER_PROGRAM + tl.arange(0, PER_PROGRAM)).to(tl.int64) * 4096
    addr = tl.where(offs + 4096 <= nbytes, base + offs, base)  # whole chunks only: never past the tensor
    tl.inline_asm_elementwise(_EVICT_LAST, "=r,l", [addr], dtype=tl.int32, is_pure=False, pack=1)


def supports_l2_prefetch(device: torch.device) -> bool:
    """A Hopper or later GPU, Triton not interpreting."""
    return _supports(device)


@functools.lru_cache(maxsize=16)
def _supports(device: torch.device) -> bool:
    return (device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"
            and torch.cuda.get_device_capability(device)[0] >= 9)


def prefetch_to_l2(t: torch.Tensor, nbytes: int | None = None) -> None:
    """Ask the L2 for the first `nbytes` (default all, in whole 4 KiB chunks) of contiguous tensor t."""
    if not t.is_contiguous():
        raise ValueError("prefetch_to_l2 reads a contiguous tensor")
    total = t.numel() * t.element_size()
    nbytes = total if nbytes is None else min(nbytes, total)
    grid = (triton.cdiv(nbytes // _CHUNK, _PER_PROGRAM),)
    if grid[0]:
        _l2_prefetch_kernel[grid](t.view(-1).view(torch.uint8), nbytes, PER_PROGRAM=_PER_PROGRAM, num_warps=4)


class L2Prefetch:
    """The side stream and fork event of `beside`, for one device."""

    def __init__(self, device: torch.device) -> None:
        if not supports_l2_prefetch(device):
            raise ValueError(f"L2 prefetch needs a Hopper or later GPU and compiled Triton, not {device}")
        self.side = torch.cuda.Stream(device)
        self.fork = torch.cuda.Event()

    @contextlib.contextmanager
    def beside(self, weight: torch.Tensor) -> Iterator[None]:
        """Prefetch `weight` into the L2 on the side stream while the body's work runs on the current stream;
        the current stream waits for the prefetch at exit."""
        main = torch.cuda.current_stream(weight.device)
        self.fork.record(main)
        self.side.wait_event(self.fork)
        with torch.cuda.stream(self.side):
            prefetch_to_l2(weight)
        yield
        main.wait_stream(self.side)
