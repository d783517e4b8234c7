"""Programmatic dependent launch (PDL) of the engine's Triton kernels.

A decode layer is a chain of about fourteen kernels in one stream. Without PDL a kernel starts only
after the kernel before it has finished and flushed its writes, so every boundary pays a launch.
With PDL (sm_90 and later), a kernel launched with `launch_pdl=True` may start while its predecessor's
last programs still run. Its programs open with `await_predecessor`:

- `gdc_wait()` returns once the predecessor has finished and its writes are visible;
- `gdc_launch_dependents()` then lets the next kernel start early in the same way.

Every engine kernel calls it before its first memory access, so the results do not depend on PDL;
what PDL saves is the launch of each kernel behind its predecessor's tail. Kernels from elsewhere
(cuBLAS, Inductor) launch as before, and so do `skinny_linear` calls inside `torch.compile` (Inductor
launches them); a PDL kernel after one of them simply starts when it ends.

`PULSEIO_ENGINE_PDL=0` turns it off, for A/B benchmarks.
"""

from __future__ import annotations

import functools
import logging
import os

import torch
import triton
import triton.language as tl

ENV = "PULSEIO_ENGINE_PDL"
log = logging.getLogger(__name__)


@triton.jit
def await_predecessor(PDL: tl.constexpr):
    """A PDL kernel's first step: wait for the kernel before it, then let the kernel after it launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def _triton_has_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in CUDAOptions.__dataclass_fields__ and hasattr(tl.extra.cuda, "gdc_wait")


@functools.lru_cache(maxsize=16)
def dependent_launch(device: torch.device) -> bool:
    """Whether the engine's kernels on `device` launch with PDL: a CUDA device of compute capability 9 or
    more, a Triton that has it, and `PULSEIO_ENGINE_PDL` not 0. Says once why not on a CUDA device."""
    if device.type != "cuda":
        return False
    if os.environ.get(ENV, "1") == "0":
        log.info("%s=0: the engine's kernels launch without programmatic dependent launch", ENV)
        return False
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        log.info("programmatic dependent launch needs sm_90 or later; %s is sm_%d%d, kernels launch without it",
                 device, major, minor)
        return False
    if not _triton_has_pdl():
        log.warning("Triton %s has no programmatic dependent launch; the engine's kernels launch without it",
                    triton.__version__)
        return False
    return True


def launch_options(pdl: bool) -> dict[str, bool]:
    """The launch keyword a kernel call adds: `launch_pdl=True` with PDL, nothing without (the
    interpreter takes no such option)."""
    return {"launch_pdl": True} if pdl else {}
