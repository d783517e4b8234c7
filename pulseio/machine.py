"""How much memory this machine offers a run, for preflight checks made before anything is allocated.

Host: `MemAvailable` of /proc/meminfo. GPU: free bytes of the device (`torch.cuda.mem_get_info`).
`PULSEIO_MEMORY_LIMIT` (bytes, or with a K/M/G/T suffix: `8G`) caps both, so a test or a cautious user
can pretend the machine is smaller than it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MEMORY_LIMIT_ENV = "PULSEIO_MEMORY_LIMIT"
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes a run may use on one device, and where that figure comes from (for error messages)."""

    nbytes: int
    source: str


def parse_bytes(text: str) -> int:
    """'123', '512M', '8G', '1.5GiB' -> bytes; raises ValueError naming the value."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _SUFFIX and t[-1:] else ""
    try:
        value = float(t[: len(t) - len(unit)]) * _SUFFIX[unit]
    except ValueError:
        raise ValueError(f"a byte count must look like 123, 512M or 8G, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"a byte count must be positive, got {text!r}")
    return int(value)


def memory_budget(device: str) -> MemoryBudget | None:
    """What `device` ('cpu', 'cuda', 'cuda:N') has free now, capped by PULSEIO_MEMORY_LIMIT; None if unknown."""
    measured = _gpu_free(device) if device.startswith("cuda") else _host_available()
    limit = os.environ.get(MEMORY_LIMIT_ENV)
    if limit is not None:
        capped = parse_bytes(limit)
        if measured is None or capped < measured.nbytes:
            return MemoryBudget(capped, f"{MEMORY_LIMIT_ENV}={limit}")
    return measured


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def _host_available() -> MemoryBudget | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return MemoryBudget(int(line.split()[1]) * 1024, "host memory available")
    except OSError:
        return None
    return None


def _gpu_free(device: str) -> MemoryBudget | None:
    import torch

    if not torch.cuda.is_available():
        return None
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return MemoryBudget(free, f"free memory of {device}")


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache of cpu0 (Linux sysfs), or None where it cannot be read."""
    sizes = []
    try:
        for entry in os.scandir("/sys/devices/system/cpu/cpu0/cache"):
            if entry.name.startswith("index"):
                with open(os.path.join(entry.path, "size")) as f:
                    sizes.append(parse_bytes(f.read()))
    except (OSError, ValueError):
        return None
    return max(sizes, default=None)
