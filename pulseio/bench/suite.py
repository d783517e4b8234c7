"""run_bench: every measurement of `pulseio bench` in one process, with a progress bar."""

from __future__ import annotations

import logging
import platform
from dataclasses import dataclass, field, replace

import torch

from .._devices import open_backend
from ..config import AutoPolicy, DmaConfig
from ..dma import DmaEngine
from ..errors import InsufficientMemoryError
from ..machine import gib, last_level_cache_bytes, memory_budget
from ..memory import DevicePool, HostPool
from ..plan import Direction, Strategy
from .measure import IdSets, RunInfo, measure_peak, measure_transfers, measure_under_load, with_peak_fraction
from .records import BenchRecord, run_metadata

log = logging.getLogger(__name__)

_MEASURES_CPU = ("host memory copies (no GPU: HostBackend moves blocks within RAM); not PCIe. The peak is "
                 "the fastest copy of 64 MiB (or 2 x the last-level cache) or more, so copies a cache holds "
                 "do not set it")
_MEASURES_GPU = "PCIe transfers between pinned host memory and the GPU; the peak is the fastest single copy"
_STRATEGIES = (Strategy.PER_BLOCK, Strategy.GATHER_DMA, Strategy.ZERO_COPY, Strategy.RESIDENT, Strategy.BATCHED)


@dataclass(frozen=True)
class BenchOptions:
    """What `pulseio bench` measures. Sizes in bytes; None picks a default for the device."""

    device: str = "auto"
    block_sizes: tuple[int, ...] = (8 << 10, 64 << 10)
    counts: tuple[int, ...] = (64, 256, 512, 2048, 4096)
    strategies: tuple[Strategy, ...] = _STRATEGIES
    directions: tuple[Direction, ...] = (Direction.H2D, Direction.D2H)
    peak_max_bytes: int | None = None
    host_pool_bytes: int | None = None
    window: int = 8
    under_load: bool = True
    load_count: int = 4096  # blocks per recall in the GEMM run (one run per block size)
    id_sets: int = 16
    progress: bool = True
    volume: float = 1.0  # bytes moved per measurement, as a fraction of the full run's (quick runs: less)
    verbose: bool = False  # print each record as it is measured
    dma: DmaConfig = field(default_factory=DmaConfig)

    def __post_init__(self) -> None:
        if not self.block_sizes or not self.counts or not self.strategies or not self.directions:
            raise ValueError("block_sizes, counts, strategies and directions must not be empty, got "
                             f"{self.block_sizes}, {self.counts}, {self.strategies}, {self.directions}")
        if any(s % 16 or s < 16 for s in self.block_sizes):
            raise ValueError(f"block sizes must be positive multiples of 16 bytes, got {self.block_sizes}")
        if min(self.counts) < 1:
            raise ValueError(f"counts must be >= 1 block, got {self.counts}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not 0 < self.volume <= 1:
            raise ValueError(f"volume must be in (0, 1], got {self.volume}")
        if self.peak_max_bytes is not None and self.peak_max_bytes < 4096:
            raise ValueError(f"peak_max_bytes (--peak-max-bytes) must be >= 4096, got {self.peak_max_bytes}")
        for size in self.block_sizes:
            if self.host_pool_bytes is not None and self.host_pool_bytes // size < max(self.counts):
                raise ValueError(
                    f"host_pool_bytes (--host-pool-bytes) {self.host_pool_bytes} holds "
                    f"{self.host_pool_bytes // size} blocks of {size} B, fewer than the largest count "
                    f"{max(self.counts)}; pass at least {max(self.counts) * size} or smaller counts"
                )

    def host_pool_blocks(self, block_bytes: int, on_gpu: bool) -> int:
        """Blocks of the host pool: host_pool_bytes, else 2 GiB (GPU) / 256 MiB (CPU) or 2 x the largest count."""
        if self.host_pool_bytes is not None:
            return self.host_pool_bytes // block_bytes
        default = (2 << 30) if on_gpu else (256 << 20)
        return max(default // block_bytes, 2 * max(self.counts))

    def peak_bytes(self, on_gpu: bool) -> int:
        return self.peak_max_bytes or ((1 << 30) if on_gpu else (256 << 20))


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


class _Progress:
    """tqdm bar, plus one printed line per record when verbose (for logs of unattended runs)."""

    def __init__(self, total: int, options: BenchOptions) -> None:
        from tqdm import tqdm

        self._tqdm = tqdm
        self._bar = tqdm(total=total, desc="pulseio bench", unit="step", disable=not options.progress, leave=False)
        self._verbose = options.verbose

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.close()

    def update(self, record: BenchRecord | None = None) -> None:
        self._bar.update()
        if self._verbose and record is not None:
            r = record
            self._tqdm.write(
                f"{r.kind} {r.strategy} {r.direction} {r.block_bytes}B x{r.num_blocks} load={r.under_load}: "
                f"{r.gbps:.2f} GB/s lat={r.latency_us} slow={r.gemm_slowdown} ok={r.verified}"
            )


def run_bench(options: BenchOptions) -> tuple[dict, list[BenchRecord]]:
    """Run every measurement; returns (run metadata, records)."""
    backend = open_backend(options.device)
    on_gpu = backend.device.type == "cuda"
    check_bench_memory(options, on_gpu, str(backend.device))
    meta = run_metadata(_device_name(backend.device))
    meta["measures"] = _MEASURES_GPU if on_gpu else _MEASURES_CPU
    info = RunInfo(meta["device"], meta["git_sha"])
    peak_max = options.peak_bytes(on_gpu)
    sizes = [4096 << (2 * k) for k in range(16) if (4096 << (2 * k)) <= peak_max]
    configs = len(options.block_sizes) * len(options.counts) * len(options.directions)
    total = 2 * len(sizes) + configs * (len(options.strategies) + 1)
    under_load = options.under_load and on_gpu
    total += (len(options.strategies) + 1) * len(options.block_sizes) if under_load else 0
    with _Progress(total, options) as bar:
        records = measure_peak(backend, sizes, info, bar.update, options.volume)
        floor = 0 if on_gpu else min(cpu_peak_floor(), max(sizes))   # on CPU: copies larger than any cache
        peaks = {d: max(r.gbps for r in records if r.direction == d and r.block_bytes >= floor)
                 for d in ("h2d", "d2h")}
        meta["peak_gbps"] = peaks
        meta["peak_from_bytes"] = floor or min(sizes)
        records = [with_peak_fraction(r, peaks[r.direction]) for r in records]
        for block_bytes in options.block_sizes:
            records += _measure_block_size(backend, block_bytes, options, peaks, info, bar.update)
        if under_load:
            records += _measure_load(backend, options, peaks, info, bar.update)
    return meta, records


def cpu_peak_floor() -> int:
    """The smallest copy that sets the CPU's peak: 64 MiB, or twice the last-level cache if larger."""
    return max(64 << 20, 2 * (last_level_cache_bytes() or 0))


def check_bench_memory(options: BenchOptions, on_gpu: bool, device: str) -> None:
    """Refuse, before anything is allocated, a run whose buffers exceed the host's (or GPU's) memory."""
    pools = max(options.host_pool_blocks(b, on_gpu) * b for b in options.block_sizes)
    slots = max(2 * max(options.counts) * b for b in options.block_sizes)
    peak = options.peak_bytes(on_gpu)
    needs = [("cpu", peak + pools + (0 if on_gpu else peak + slots))]
    if on_gpu:
        needs.append((device, max(peak, slots)))
    for where, need in needs:
        budget = memory_budget(where)
        if budget is not None and need > budget.nbytes:
            raise InsufficientMemoryError(
                f"this run needs {gib(need)} of {where} memory (peak copies of up to {peak} B, a host pool "
                f"of {gib(pools)}, device slots of {gib(slots)}), more than the {gib(budget.nbytes)} it has "
                f"({budget.source}); pass smaller --block-sizes, --counts, --host-pool-bytes or --peak-max-bytes"
            )


def _pools(backend, block_bytes: int, options: BenchOptions) -> tuple[HostPool, DevicePool]:
    num_blocks = options.host_pool_blocks(block_bytes, backend.device.type == "cuda")
    host = HostPool(backend, num_blocks, block_bytes)
    device = DevicePool(backend, 2 * max(options.counts), block_bytes)
    seed = torch.randint(0, 256, (min(num_blocks, 4096), block_bytes), dtype=torch.uint8)
    for start in range(0, num_blocks, seed.shape[0]):
        host.blocks[start : start + seed.shape[0]].copy_(seed[: num_blocks - start])
    # distinct content per block: the first 8 bytes carry the block id
    host.blocks[:, :8].copy_(torch.arange(num_blocks, dtype=torch.int64).view(torch.uint8).view(num_blocks, 8))
    device.slots.copy_(host.blocks[: device.num_slots].to(device.slots.device))
    return host, device


def _measure_block_size(backend, block_bytes, options, peaks, info, tick) -> list[BenchRecord]:
    host, device = _pools(backend, block_bytes, options)
    records: list[BenchRecord] = []
    try:
        for count in options.counts:
            ids = IdSets(host.num_blocks, device.num_slots, count, options.id_sets, seed=count)
            config = replace(options.dma, merge_blocks=count)  # one transfer, one issue: no merging
            with DmaEngine(host, device, config) as engine:
                for direction in options.directions:
                    for strategy in options.strategies:
                        if strategy in engine.available:
                            records.append(measure_transfers(
                                engine, ids, direction, strategy, window=options.window,
                                peak=peaks[direction.value], info=info, volume=options.volume,
                            ))
                            tick(records[-1])
            policy = AutoPolicy.from_records(r.to_dict() for r in records)
            with DmaEngine(host, device, replace(config, auto=policy)) as engine:
                for direction in options.directions:
                    chosen = policy.choose(direction, block_bytes, count)
                    records.append(measure_transfers(
                        engine, ids, direction, chosen, window=options.window,
                        peak=peaks[direction.value], info=info, label=Strategy.AUTO, volume=options.volume,
                    ))
                    tick(records[-1])
    finally:
        host.close()
    return records


def _measure_load(backend, options, peaks, info, tick) -> list[BenchRecord]:
    out = []
    for block_bytes in options.block_sizes:
        host, device = _pools(backend, block_bytes, replace(options, counts=(*options.counts, options.load_count)))
        try:
            ids = IdSets(host.num_blocks, device.num_slots, options.load_count, options.id_sets, seed=99)
            config = replace(options.dma, merge_blocks=options.load_count)
            with DmaEngine(host, device, config) as engine:
                for strategy in (None, *options.strategies):  # None: the control, no recall
                    if strategy is None or strategy in engine.available:
                        out.append(measure_under_load(
                            engine, ids, strategy, window=options.window, peak=peaks["h2d"], info=info
                        ))
                        tick(out[-1])
        finally:
            host.close()
    return out
