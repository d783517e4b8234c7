"""Frozen, validated configuration of the transfer layer, and the AUTO strategy policy."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .plan import Direction, Strategy


@dataclass(frozen=True)
class AutoPolicy:
    """What `Strategy.AUTO` means: picks a strategy by (direction, block size, block count) from points
    measured on this machine. Pass it in the DmaConfig of a DmaEngine or a Runtime:

        records = json.loads(Path("results/bench.json").read_text())["records"]   # `pulseio bench` wrote it
        policy = pulseio.AutoPolicy.from_records(records)
        dma = pulseio.DmaEngine(host, device, pulseio.DmaConfig(auto=policy))
        rt = pulseio.open_runtime(pulseio.RuntimeConfig(dma=pulseio.DmaConfig(auto=policy)))

    Without one, DmaConfig's default policy has no points and uses `fallback`. (In the doorbell path
    AUTO means RESIDENT whatever the policy.)

    best: maps (direction, block_bytes) to [(num_blocks, strategy)] sorted by count: the strategy
        measured fastest at that count. A request takes the point nearest in log(block size), then in
        log(count). fallback: [(count limit, strategy)] for a direction with no point: the first whose
        limit exceeds the count (ZERO_COPY under 256 blocks, else GATHER_DMA).
    """

    best: Mapping[tuple[Direction, int], tuple[tuple[int, Strategy], ...]] = field(default_factory=dict)
    fallback: tuple[tuple[int, Strategy], ...] = ((256, Strategy.ZERO_COPY), (1 << 62, Strategy.GATHER_DMA))

    def choose(self, direction: Direction, block_bytes: int, num_blocks: int) -> Strategy:
        sizes = [size for (d, size) in self.best if d is direction]
        if not sizes:
            return next(s for limit, s in self.fallback if num_blocks < limit)
        size = min(sizes, key=lambda s: abs(math.log(s) - math.log(block_bytes)))
        points = self.best[(direction, size)]
        count = max(num_blocks, 1)
        return min(points, key=lambda p: abs(math.log(p[0]) - math.log(count)))[1]

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]]) -> AutoPolicy:
        """Build from `pulseio bench` records (dicts with strategy, direction, block_bytes, num_blocks, gbps)."""
        fastest: dict[tuple[Direction, int, int], tuple[float, Strategy]] = {}
        for r in records:
            scattered = r.get("kind", "recall") in ("recall", "offload")
            if not scattered or r.get("under_load") or r["strategy"] == Strategy.AUTO.value:
                continue
            key = (Direction(r["direction"]), int(r["block_bytes"]), int(r["num_blocks"]))
            if key not in fastest or r["gbps"] > fastest[key][0]:
                fastest[key] = (float(r["gbps"]), Strategy(r["strategy"]))
        best: dict[tuple[Direction, int], list[tuple[int, Strategy]]] = {}
        for (direction, size, count), (_, strategy) in sorted(fastest.items(), key=lambda kv: kv[0][2]):
            best.setdefault((direction, size), []).append((count, strategy))
        return cls(best={k: tuple(v) for k, v in best.items()})


@dataclass(frozen=True)
class DmaConfig:
    """How a DmaEngine moves blocks.

    staging_bytes: size of each pinned staging buffer of the GATHER_DMA route; a larger transfer is
        split into pieces that pipeline (CPU gather of piece i+1 overlaps the DMA of piece i).
    staging_buffers: how many staging buffers rotate (>= 2 for that overlap).
    zero_copy_ctas: CTA budget of the copy kernels (ZERO_COPY, RESIDENT, the scatter/gather kernels): it
        never occupies more SMs than this (RESIDENT one more, its leader), so model kernels keep the
        rest. 64 CTAs already keep PCIe busy on the H200; one per SM made a concurrent GEMM twice as
        slow there.
    resident_idle_us: the RESIDENT route's kernel exits after this long without a task, giving its
        SMs back; the next transfer relaunches it (one launch, not one per transfer). A device wait
        launches a generation of its own behind its publish; the running one serves that request too if
        it is still up when the publish runs, and hands over after it, off the request's path. While it
        is up it holds zero_copy_ctas copy CTAs and a leader CTA that polls the task ring (a concurrent
        GEMM ran 15-40% slower on the H200), and a device synchronize waits for it to go idle and exit.
    max_inflight: transfers submitted but not finished before `submit` raises WouldBlock.
    merge_blocks: queued transfers of one route are merged into one issue up to this many blocks.
    inline_issue: a transfer whose route is only a kernel launch or one driver call (zero-copy,
        batched) is issued on the submitting thread when nothing is queued ahead of it.
    auto: the policy behind Strategy.AUTO.
    """

    staging_bytes: int = 64 << 20
    staging_buffers: int = 3
    zero_copy_ctas: int = 64
    resident_idle_us: int = 200
    max_inflight: int = 4096
    merge_blocks: int = 8192
    inline_issue: bool = True
    auto: AutoPolicy = field(default_factory=AutoPolicy)

    def __post_init__(self) -> None:
        for name in ("staging_bytes", "zero_copy_ctas", "resident_idle_us", "max_inflight", "merge_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"DmaConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.staging_buffers, int) or self.staging_buffers < 2:
            raise ConfigError(
                f"DmaConfig.staging_buffers must be >= 2 so gather and DMA overlap, got {self.staging_buffers!r}"
            )


@dataclass(frozen=True)
class RuntimeConfig:
    """What a Runtime builds. ring_slots bounds the requests posted and not yet read by the poller;
    max_outstanding the requests posted and not yet finished (each holds one wait word until then);
    max_blocks_per_request the blocks of one request; spin_iterations the poller's GIL-free spin
    before it sleeps (poll_sleep_s: first and longest sleep of its backoff). device_wait_timeout_s:
    how long a request a stream waits for may stay unfinished before the watchdog fails it and
    releases the stream (see the Runtime's module doc for what its slots then hold). On a GPU with one
    I/O worker the publish kernel also writes each request's ids into a device mirror, max_outstanding
    rows of 2 x max_blocks_per_request int64, so the resident copier reads them without a PCIe round
    trip and starts copying a request as it is published, before the poller has read it; a mirror over
    64 MiB (or 4096 rows) is left out, which the log says.

    The default spin (~20-40 us of loads) saves a core between bursts but lets the poller fall
    asleep between decode layers; a request that arrives then waits out the sleep (20 us .. 1 ms).
    For latency, spin through the gaps: `benchmarks/bench_doorbell.py` uses 5_000_000 (a few ms),
    which is what its sub-microsecond publish -> seen figures assume.
    """

    device: str = "auto"
    host_blocks: int = 4096
    device_slots: int = 1024
    block_bytes: int = 8192
    ring_slots: int = 64
    max_outstanding: int = 1024
    max_blocks_per_request: int = 2048
    io_workers: int = 1
    strategy: Strategy = Strategy.AUTO
    dma: DmaConfig = field(default_factory=DmaConfig)
    spin_iterations: int = 20_000
    poll_sleep_s: tuple[float, float] = (20e-6, 1e-3)
    close_timeout_s: float = 10.0
    device_wait_timeout_s: float = 10.0
    latency_samples: int = 4096

    def __post_init__(self) -> None:
        minimum = dict(host_blocks=1, device_slots=1, block_bytes=16, ring_slots=2, max_outstanding=2,
                       max_blocks_per_request=1, io_workers=1, spin_iterations=1, latency_samples=1)
        for name, low in minimum.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"RuntimeConfig.{name} must be an int >= {low}, got {value!r}")
        if self.block_bytes % 16:
            raise ConfigError(f"RuntimeConfig.block_bytes must be a multiple of 16, got {self.block_bytes}")
        if not isinstance(self.strategy, Strategy):
            raise ConfigError(f"RuntimeConfig.strategy must be a pulseio.Strategy, got {self.strategy!r}")
        first, longest = self.poll_sleep_s
        if not 0 < first <= longest:
            raise ConfigError(f"RuntimeConfig.poll_sleep_s must be (first, longest) with 0 < first <= longest, "
                             f"got {self.poll_sleep_s!r}")
        for name in ("close_timeout_s", "device_wait_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"RuntimeConfig.{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if self.max_outstanding < self.ring_slots:
            raise ConfigError(f"RuntimeConfig.max_outstanding={self.max_outstanding} must be >= ring_slots="
                             f"{self.ring_slots}: a request stays outstanding from its post until it finishes")
