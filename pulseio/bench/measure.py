"""The three measurements of `pulseio bench`: single-copy peak, scattered transfers, and transfers
while a bf16 GEMM runs on another stream. Each returns BenchRecords; none prints."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..backend import Backend
from ..dma import DmaEngine
from ..plan import Direction, Strategy
from ..transfer import Transfer
from .gemm import GemmLoad
from .records import BenchRecord
from .timing import copy_seconds, median_latency_us, reps_for, sustained_seconds, sustained_while, synchronize, warm_up

_POISON = 0xA5
_WARMUP_S = 0.1


@dataclass(frozen=True)
class RunInfo:
    device_name: str
    git_sha: str


def measure_peak(
    backend: Backend, sizes: list[int], info: RunInfo, tick: Callable[[BenchRecord], None], volume: float = 1.0
) -> list[BenchRecord]:
    """One contiguous copy per call, back-to-back, for each size and direction; `volume` scales the
    bytes moved per measurement (1.0: 4 GiB)."""
    largest = max(sizes)
    host_memory = backend.alloc_host(largest, label="peak buffer")
    try:
        host = host_memory.tensor
        seed = torch.randint(0, 256, (min(largest, 64 << 20),), dtype=torch.uint8)
        for start in range(0, largest, seed.numel()):
            host[start : start + seed.numel()].copy_(seed[: largest - start])
        device = backend.alloc_device(largest, label="peak buffer")
        records = []
        for size in sizes:
            reps = reps_for(size, target_bytes=int(volume * (4 << 30)), lo=10, hi=2000)
            for direction in (Direction.H2D, Direction.D2H):
                src, dst = (host, device) if direction is Direction.H2D else (device, host)
                s, d = src[:size], dst[:size]
                seconds = copy_seconds(functools.partial(d.copy_, s, non_blocking=True), backend.device, reps)
                records.append(_record("peak", "single_copy", direction, size, 1, size / seconds, info))
                tick(records[-1])
        del device
        return records
    finally:
        host_memory.close()


def _record(kind: str, strategy: str, direction: Direction, block_bytes: int, num_blocks: int,
            bytes_per_s: float, info: RunInfo, **extra: object) -> BenchRecord:
    fields: dict = dict(fraction_of_peak=None, latency_us=None, under_load=False, gemm_slowdown=None, verified=None)
    fields.update(extra)
    return BenchRecord(
        kind=kind, strategy=strategy, direction=direction.value, block_bytes=block_bytes,
        num_blocks=num_blocks, gbps=bytes_per_s / 1e9, device=info.device_name, git_sha=info.git_sha, **fields,
    )


class IdSets:
    """Pre-drawn random (host ids, device slots) per repetition: distinct blocks, scattered."""

    def __init__(self, num_host_blocks: int, num_slots: int, count: int, sets: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.host = [rng.choice(num_host_blocks, size=count, replace=False) for _ in range(sets)]
        self.slots = [rng.permutation(num_slots)[:count] for _ in range(sets)]

    def submitter(self, engine: DmaEngine, direction: Direction, strategy: Strategy) -> Callable[[int], Transfer]:
        sets = len(self.host)
        if direction is Direction.H2D:
            return lambda i: engine.recall(
                host_ids=self.host[i % sets], device_slots=self.slots[i % sets], strategy=strategy, stream_ordered=False
            )
        return lambda i: engine.offload(
            device_slots=self.slots[i % sets], host_ids=self.host[i % sets], strategy=strategy, stream_ordered=False
        )


def verify_transfer(engine: DmaEngine, ids: IdSets, direction: Direction, strategy: Strategy) -> bool:
    """Poison the destination, move fresh ids once, compare bit for bit with the source."""
    host_ids = torch.from_numpy(ids.host[0])
    slots = torch.from_numpy(ids.slots[0]).to(engine.device.slots.device)
    if direction is Direction.H2D:
        engine.device.slots.index_fill_(0, slots, _POISON)
        synchronize(engine.device.slots.device)
        engine.recall(host_ids=ids.host[0], device_slots=ids.slots[0], strategy=strategy).wait()
        landed = engine.device.slots.index_select(0, slots).cpu()
        return bool(torch.equal(landed, engine.host.blocks.index_select(0, host_ids)))
    engine.host.blocks.index_fill_(0, host_ids, _POISON)
    engine.offload(device_slots=ids.slots[0], host_ids=ids.host[0], strategy=strategy).wait()
    expected = engine.device.slots.index_select(0, slots).cpu()
    return bool(torch.equal(engine.host.blocks.index_select(0, host_ids), expected))


def measure_transfers(
    engine: DmaEngine, ids: IdSets, direction: Direction, strategy: Strategy, *, window: int,
    peak: float, info: RunInfo, label: Strategy | None = None, volume: float = 1.0,
) -> BenchRecord:
    """Sustained rate (window in flight), isolated latency, and a bit-exact check for one config;
    `volume` scales the bytes moved (1.0: 512 MiB, 64 MiB for PER_BLOCK)."""
    count, block_bytes = len(ids.host[0]), engine.host.block_bytes
    nbytes = count * block_bytes
    submit = ids.submitter(engine, direction, strategy)
    warm_up(submit, _WARMUP_S)
    slow = strategy is Strategy.PER_BLOCK
    target = int(volume * ((64 << 20) if slow else (512 << 20)))
    reps = reps_for(nbytes, target_bytes=target, lo=3 if slow else 10, hi=2000)
    seconds = sustained_seconds(submit, reps, window)
    latency = median_latency_us(submit, 3 if slow else 15)
    verified = verify_transfer(engine, ids, direction, strategy)
    rate = nbytes / seconds
    return _record(
        "recall" if direction is Direction.H2D else "offload", (label or strategy).value, direction, block_bytes,
        count, rate, info,
        fraction_of_peak=rate / 1e9 / peak if peak else None, latency_us=latency, verified=verified,
        chosen=strategy.value if label is not None else None,
    )


def measure_under_load(
    engine: DmaEngine, ids: IdSets, strategy: Strategy | None, *, window: int, peak: float, info: RunInfo,
    gemm_size: int = 8192, gemm_iters: int = 32, pairs: int = 8, idle_s: float = 0.1,
) -> BenchRecord:
    """Recall back-to-back while a bf16 GEMM runs on another stream; report both rates.

    The GEMM's clock depends on its recent past: on the H200 it ran at ~1.62 ms back-to-back (at the
    700 W cap, SM clock ~1500 MHz) but ~1.41 ms after some tens of ms of idle SMs (1980 MHz; measured
    with nvidia-smi, benchmarks/results/README.md). So every run, alone or loaded, starts after the same `idle_s` of
    idle GPU; `pairs` loaded runs alternate with runs alone, each loaded run is compared with the
    mean of the runs alone just before and after it, and the slowdown is the median of those ratios.

    In a loaded run the recall goes on for the whole GEMM, and its rate counts only the transfers
    that landed while the GEMM ran (`sustained_while`): the ones drained after it would land on an
    idle GPU. strategy None is the control: the same runs with no recall (the host only polls the
    GEMM), whose "slowdown" is the method's own noise."""
    device = engine.device.slots.device
    gemm = GemmLoad(device, gemm_size)

    def enqueue_gemms() -> tuple[torch.cuda.Event, torch.cuda.Event]:
        torch.cuda.synchronize(device)  # the same idle time before every run (see above)
        time.sleep(idle_s)
        return gemm.enqueue(gemm_iters)

    submit = ids.submitter(engine, Direction.H2D, strategy) if strategy is not None else None
    recall_bytes = ids.host[0].size * engine.host.block_bytes

    def gemm_ms(loaded: bool) -> tuple[float, int, float]:
        """One GEMM run, alone or with recalls: (ms per GEMM, bytes recalled while it ran, seconds)."""
        start, end = enqueue_gemms()
        moved, seconds = 0, 0.0
        if loaded and submit is not None:
            moved, seconds = sustained_while(submit, end.synchronize, window, recall_bytes)
        while loaded and not end.query():  # the control: the host polls, as a submitting loop would
            pass
        end.synchronize()
        return start.elapsed_time(end) / gemm_iters, moved, seconds

    gemm_ms(False)  # warm-up: the first run pays for cuBLAS's setup
    if submit is not None:
        warm_up(submit, _WARMUP_S)
    alone, loaded, moved, seconds = [gemm_ms(False)[0]], [], 0, 0.0
    for _ in range(pairs):
        ms, m, s = gemm_ms(True)
        loaded.append(ms)
        moved, seconds = moved + m, seconds + s
        alone.append(gemm_ms(False)[0])
    rate = moved / seconds if seconds else 0.0
    ratios = [ms / ((before + after) / 2) for ms, before, after in zip(loaded, alone, alone[1:])]
    verified = verify_transfer(engine, ids, Direction.H2D, strategy) if strategy is not None else None
    return _record(
        "recall", strategy.value if strategy is not None else "none", Direction.H2D, engine.host.block_bytes,
        ids.host[0].size, rate, info, fraction_of_peak=rate / 1e9 / peak if peak else None, under_load=True,
        gemm_slowdown=statistics.median(ratios) - 1.0, verified=verified,
        gemm_ms_alone=tuple(alone), gemm_ms_loaded=tuple(loaded),
    )


def with_peak_fraction(record: BenchRecord, peak: float) -> BenchRecord:
    return replace(record, fraction_of_peak=record.gbps / peak if peak else None)
