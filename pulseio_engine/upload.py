"""Host tensors to the device without making the host wait for the GPU.

`tensor.to(cuda)` from ordinary (pageable) host memory is a blocking copy: the host waits until every kernel
enqueued before it on the stream has run, and a serving loop that keeps rounds queued ahead drains its queue
and leaves the GPU idle while it catches up. Staged in pinned memory, the copy is non-blocking: it is enqueued in
stream order and the host goes on (torch's pinned-memory allocator keeps the staging buffer until the copy ran).
"""

from __future__ import annotations

import torch


def to_device_nowait(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (a CPU tensor) on `device`, copied in the current stream's order; never waits on a CUDA device
    (staged through pinned memory). On a CPU device, `host` itself."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
