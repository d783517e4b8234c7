"""Programmatic dependent launch (PDL) of the engine's Triton kernels: an experiment behind PULSEIO_PDL=1.

A kernel launched as a programmatic dependent may start while the kernel before it in the stream (or the CUDA
graph) still runs, once every program of that one has called `gdc_launch_dependents` or exited; it must call
`gdc_wait` before it reads anything an earlier kernel wrote. Every engine kernel launched this way calls
`gdc_wait` first (the skinny projections ask the L2 for their weight's first lines before it: nothing writes
a weight), then `gdc_launch_dependents` at once: the next kernel's programs are placed only when every program of
this one has started, so they take no later wave's place, and their launch and prologue overlap this one's work
and drain instead of following them. Hopper (sm_90) and later; never under Triton's interpreter.
"""

from __future__ import annotations

import functools
import os

import torch


def launches_pdl(device: torch.device) -> bool:
    """Whether the engine's Triton kernels on `device` launch as programmatic dependents now: PULSEIO_PDL=1 (read
    at each launch, so a process may compare both) on a Hopper or later GPU, Triton not interpreting."""
    return os.environ.get("PULSEIO_PDL") == "1" and _supports_pdl(device)


@functools.lru_cache(maxsize=16)
def _supports_pdl(device: torch.device) -> bool:
    return (device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"
            and torch.cuda.get_device_capability(device)[0] >= 9)


def pdl_state(device: torch.device) -> dict[str, bool]:
    """What a report records: whether the engine's kernels (`pdl`) and the compiled halves' kernels
    (`inductor_pdl`, Inductor's `triton.enable_pdl`) launch as programmatic dependents on `device`."""
    import torch._inductor.config as inductor

    return {"pdl": launches_pdl(device),
            "inductor_pdl": device.type == "cuda" and bool(getattr(inductor.triton, "enable_pdl", False))}


def pdl_meta(device: torch.device) -> dict[str, bool]:
    """The launch's PDL constexpr and, when on, Triton's launch option."""
    return {"PDL": True, "launch_pdl": True} if launches_pdl(device) else {"PDL": False}
