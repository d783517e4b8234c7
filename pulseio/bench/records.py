"""One benchmark measurement as a flat record (what `--json` writes), plus run metadata."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BenchRecord:
    kind: str  # "peak" (one contiguous copy), "recall" (scattered blocks, h2d) or "offload" (d2h)
    strategy: str  # "single_copy" for peak records
    direction: str  # "h2d" | "d2h"
    block_bytes: int  # copy size for peak records
    num_blocks: int  # 1 for peak records
    gbps: float  # sustained: bytes / wall time over back-to-back operations
    fraction_of_peak: float | None  # gbps / single-copy peak of the same direction, same run
    latency_us: float | None  # one operation alone, submit -> landed, median
    under_load: bool  # measured while a bf16 GEMM ran on another stream
    gemm_slowdown: float | None  # GEMM time with this recall running / alone - 1 (median over interleaved runs)
    device: str
    git_sha: str
    verified: bool | None  # bit-exact check of the data moved (None: not checked in this record)
    gemm_ms_alone: tuple[float, ...] | None = None  # under_load: ms per GEMM of each run alone, in run order
    gemm_ms_loaded: tuple[float, ...] | None = None  # ... and of each run with the recall (between those)
    chosen: str | None = None  # strategy "auto": what it resolved to (measured on an engine of its own)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def git_sha() -> str:
    """The checkout's commit; PULSEIO_GIT_SHA wins (device copies of a tree carry no .git)."""
    if os.environ.get("PULSEIO_GIT_SHA"):
        return os.environ["PULSEIO_GIT_SHA"]
    try:
        root = Path(__file__).resolve().parents[2]
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_metadata(device_name: str) -> dict[str, Any]:
    return {
        "device": device_name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "host": platform.node(),
        "python": platform.python_version(),
    }
