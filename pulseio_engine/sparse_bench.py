"""Sparse decode benchmark: offload requests, and the all-on-GPU baseline, on one model.

Modes (`pulseio-engine bench --mode`):

- quest-all-on-gpu: every block stays in the paged cache; each offloaded layer attends to its Quest
  selection there (`RecallMode.ALL_ON_GPU`). No recall, no memory saving.
- offload-sync / offload-doorbell: an offload-only engine (the paged cache keeps the dense layers; the
  other layers live in pinned host memory with a hot set per layer on the GPU). The selected blocks
  not in the hot set are recalled through pulseio: ids to the host and a host wait (sync), or
  published from the device with a device wait (doorbell).

Workload: handed-in random KV (`RandomKV`), random prompt tokens, greedy decode, each step as
CUDA-graph pieces between the recalls (`OffloadStepGraph`; `use_cuda_graphs=False`: eager). On
random weights the query . digest top-k jumps at random every step, so selection is driven by a
recall-locality model (`LocalitySelector`) whose per-layer step-to-step overlap of the selected
middle blocks was measured on real models (`pulseio-engine locality`); the output names the source
and the figures. The model's layers take the measured layers' overlaps by relative depth.

Measured per mode: step time (wall, engine.step to engine.step, which ends reading the sampled
tokens); recalled units, MiB and unit size per step; recall GB/s while recalling, two ways, next to
the host-to-device peak of a contiguous copy measured in the same process: bytes over the stream time
from each layer's post to its data being usable (CUDA events around the recall call: when the GPU has
caught up with the host, this includes the host's time to launch the publish), and, for doorbell
requests on the resident copier, bytes over the device-clock time from the publish kernel's stamp to
the copier's landed stamp (what the recall itself takes, whatever the host is doing); main-thread time
per step inside recall calls and, of it, time in calls that wait (the sync baseline's id copy and
host wait; the doorbell's post and device wait, which wait only when the ring is full); GPU bytes
per request of the engine's actual KV-side tensors (paged cache, hot slots, digests) for a cache
sized to exactly these requests, next to vanilla's.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from pulseio import DmaConfig

from .bench import bench_status
from .config import CacheConfig, OffloadConfig, RecallMode, SchedulerConfig, SparseConfig, SparseMode
from .engine import Engine
from .evaluation.locality import LocalityProfile, packaged_profiles
from .kv.block_table import blocks_for
from .kv.cache import kv_bytes_per_token
from .kv.handoff import RandomKV
from .kv.recall import Recaller
from .kv.retrieval_heads import RetrievalHeads
from .kv.synthetic_selection import LocalitySelector
from .model.checkpoint import ModelSource, open_model
from .request import SamplingParams


class SparseBenchMode(Enum):
    QUEST_ALL_ON_GPU = "quest-all-on-gpu"
    OFFLOAD_SYNC = "offload-sync"
    OFFLOAD_DOORBELL = "offload-doorbell"

    @property
    def recall(self) -> RecallMode:
        return {SparseBenchMode.QUEST_ALL_ON_GPU: RecallMode.ALL_ON_GPU, SparseBenchMode.OFFLOAD_SYNC: RecallMode.SYNC,
                SparseBenchMode.OFFLOAD_DOORBELL: RecallMode.DOORBELL}[self]


def default_profile(selection: SparseMode, token_budget: int) -> LocalityProfile:
    """The shipped locality measurement a preset runs with: of the same selection, Qwen2.5 before
    SmolLM2 (the closer architecture to the Qwen3 presets), the nearest budget, the longest context."""
    return min(packaged_profiles(), key=lambda p: (p.mode is not selection, not p.model.startswith("qwen"),
                                                   abs(p.token_budget - token_budget), -p.context_len))


def describe(profile: LocalityProfile) -> str:
    return (f"{profile.model} {profile.mode.value} budget {profile.token_budget} context {profile.context_len}: "
            f"mean overlap {statistics.fmean(profile.overlap):.3f} over its {len(profile.overlap)} offloaded "
            "layers, stretched by depth (pulseio_engine/data/locality.json)")


class TimedRecaller:
    """A `Recaller` with the main thread's time in it, the stream's time from post to landed, and the
    doorbell requests (whose publish and landed stamps give the same span on the device clock)."""

    def __init__(self, inner: Recaller, device: torch.device) -> None:
        self.inner, self.cuda = inner, device.type == "cuda"
        self.host_ns = 0
        self.events: list[tuple[Any, Any]] = []
        self.requests: list[Any] = []

    def recall(self, ids: torch.Tensor, dst: torch.Tensor, count: torch.Tensor, *, tag: int) -> Any:
        start = torch.cuda.Event(enable_timing=True) if self.cuda else None
        if start is not None:
            start.record()
        t0 = time.perf_counter_ns()
        done = self.inner.recall(ids, dst, count, tag=tag)
        self.host_ns += time.perf_counter_ns() - t0
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((start, end))
        if done is not None and hasattr(done, "published_ns"):
            self.requests.append(done)
        return done

    def check_landed(self) -> None:
        self.inner.check_landed()

    def take_stream_seconds(self) -> float:
        """Stream time spent from posts to landed since the last call (synchronizes)."""
        if not self.events:
            return 0.0
        self.events[-1][1].synchronize()
        seconds = sum(s.elapsed_time(e) for s, e in self.events) / 1e3
        self.events.clear()
        return seconds

    def take_publish_to_landed(self) -> StampTotals:
        """The finished doorbell requests since the last call that carry the device-clock stamps (RESIDENT),
        summed; unfinished ones wait for the next call."""
        finished: list[Any] = []
        pending: list[Any] = []
        for r in self.requests:                  # one look at each: one finishing meanwhile is in exactly one list
            (finished if r.done() else pending).append(r)
        self.requests = pending
        stamped = [r for r in finished if r.nbytes and None not in (r.published_ns, r.taken_ns, r.landed_ns)]
        return StampTotals(sum(r.nbytes for r in stamped), len(stamped),
                           sum(r.landed_ns - r.published_ns for r in stamped) / 1e9,
                           tuple(r.taken_ns - r.published_ns for r in stamped),
                           tuple(r.seen_ns - r.published_ns for r in stamped if r.seen_ns is not None))


@dataclass(frozen=True)
class StampTotals:
    """Doorbell requests' stamps: bytes and publish -> landed summed (device clock); per request, publish ->
    the copier's start (the pickup; the rest is the copy), and publish -> the poller's read of it (device
    clock to host clock: only differences between requests mean anything)."""

    nbytes: int = 0
    requests: int = 0
    publish_to_landed_s: float = 0.0
    pickups_ns: tuple[int, ...] = ()
    publish_to_seen_ns: tuple[int, ...] = ()

    def __add__(self, other: StampTotals) -> StampTotals:
        return StampTotals(self.nbytes + other.nbytes, self.requests + other.requests,
                           self.publish_to_landed_s + other.publish_to_landed_s, self.pickups_ns + other.pickups_ns,
                           self.publish_to_seen_ns + other.publish_to_seen_ns)

    def pickup_us(self, percentile: float) -> float | None:
        return _percentile_us(self.pickups_ns, percentile)

    def poller_lag_us(self, percentile: float) -> float | None:
        """Publish -> the poller's read, less the run's smallest: how much later than its fastest the poller
        read a request (the clocks' offset cancels; their drift, microseconds per second, does not)."""
        if not self.publish_to_seen_ns:
            return None
        least = min(self.publish_to_seen_ns)
        return _percentile_us(tuple(t - least for t in self.publish_to_seen_ns), percentile)


def _of_peak(fraction: float | None) -> str:
    """' = 0.79' for a rate's fraction of the link's peak, or nothing where no peak was measured (a CPU)."""
    return "" if fraction is None else f" = {fraction:.2f}"


def _percentile_us(samples_ns: tuple[int, ...], percentile: float) -> float | None:
    return float(np.percentile(samples_ns, percentile)) / 1e3 if samples_ns else None


@dataclass(frozen=True)
class SparseBenchResult:
    model: str
    mode: str
    selection: str                 # quest (head-wise units) or solohead (shared units)
    device: str
    batch_size: int
    context_len: int
    token_budget: int
    steps: int
    cuda_graphs: bool              # the step ran as captured pieces between the recalls
    step_ms: float                 # median wall time per step
    step_ms_mean: float
    tokens_per_s: float
    unit_bytes: int                # one recalled transfer unit
    units_per_step: float          # recalled, all layers and requests
    recalled_mib_per_step: float
    recall_gbps: float | None      # bytes / stream time from post to landed, while recalling
    link_peak_gbps: float | None   # contiguous pinned -> device copy, this process
    recall_fraction_of_peak: float | None
    publish_gbps: float | None     # bytes / device-clock time from publish to landed (doorbell, RESIDENT)
    publish_fraction_of_peak: float | None
    publish_to_landed_us: float | None   # mean per request, device clock
    publish_to_taken_us: float | None    # of it, publish -> the copier began the copy (the pickup)
    publish_to_taken_us_p50: float | None  # the pickup's median and 90th percentile over requests
    publish_to_taken_us_p90: float | None
    poller_lag_us_p50: float | None      # publish -> the poller read it, less the run's fastest (StampTotals)
    poller_lag_us_p90: float | None
    copy_gbps: float | None              # bytes / device-clock time from the copier's start to landed
    copy_fraction_of_peak: float | None
    recall_host_ms_per_step: float     # main thread inside recall calls
    blocked_ms_per_step: float         # of it, inside calls that wait (see the module doc)
    gpu_bytes_per_request: int         # paged cache + hot slots + digests, cache sized to these requests
    vanilla_gpu_bytes_per_request: int
    host_bytes_per_request: int
    locality: str
    copier_ctas: int | None        # the runtime's resident copier: copy CTAs (DmaConfig.zero_copy_ctas) and
    copier_idle_us: int | None     # how long a generation stays up without a task; None: no runtime

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        rate = ""
        if self.recall_gbps is not None:
            rate = f", recall {self.recall_gbps:.1f} GB/s{_of_peak(self.recall_fraction_of_peak)}"
            if self.link_peak_gbps is not None:
                rate += f" of {self.link_peak_gbps:.1f}"
        if self.publish_gbps is not None:
            rate += (f" (publish -> landed {self.publish_gbps:.1f} GB/s{_of_peak(self.publish_fraction_of_peak)}, "
                     f"{self.publish_to_landed_us:.0f} us a request: {self.publish_to_taken_us:.0f} us to the "
                     f"copier's start (p50 {self.publish_to_taken_us_p50:.0f}, "
                     f"p90 {self.publish_to_taken_us_p90:.0f}), then {self.copy_gbps or 0:.1f} GB/s"
                     f"{_of_peak(self.copy_fraction_of_peak)})")
        return (f"{self.model} {self.mode} ({self.selection}) B={self.batch_size} ctx={self.context_len} "
                f"budget={self.token_budget}: {self.step_ms:.2f} ms/step, {self.recalled_mib_per_step:.1f} MiB/step "
                f"in {self.unit_bytes >> 10} KiB units{rate}, main thread {self.recall_host_ms_per_step:.2f} ms/step "
                f"in recall ({self.blocked_ms_per_step:.2f} blocked), "
                f"GPU {self.gpu_bytes_per_request / 2**20:.0f} MiB/request "
                f"(vanilla {self.vanilla_gpu_bytes_per_request / 2**20:.0f})")


def run_sparse_bench(model: str | ModelSource, *, mode: SparseBenchMode, batch_size: int, context_len: int,
                     steps: int, token_budget: int = 2048, selection: SparseMode = SparseMode.SOLOHEAD,
                     warmup: int = 3, device: str | None = None, locality: LocalityProfile | None = None,
                     progress: bool = True, seed: int = 0, profile: Path | None = None,
                     use_cuda_graphs: bool = True, dma: DmaConfig | None = None) -> SparseBenchResult:
    """`profile`: also write a torch.profiler table of the timed steps there (they run slower under it).
    `dma`: the offload runtime's transfer settings (`OffloadConfig.dma`; None: the engine's)."""
    source = model if isinstance(model, ModelSource) else open_model(model)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if mode is SparseBenchMode.QUEST_ALL_ON_GPU:
        selection = SparseMode.QUEST
    m, bs = source.config, CacheConfig().block_size
    max_len = context_len + warmup + steps + 3
    per_seq = blocks_for(max_len, bs)
    sparse = SparseConfig(mode=selection, token_budget=token_budget, block_size=bs)
    on_gpu = mode is SparseBenchMode.QUEST_ALL_ON_GPU
    groups = m.num_kv_heads if selection is SparseMode.QUEST else 1
    host_units = 1 + (m.num_layers - OffloadConfig().dense_layers) * groups * batch_size * per_seq
    offload = OffloadConfig(sparse=sparse, recall=mode.recall, host_blocks=1 if on_gpu else host_units,
                            max_seqs=batch_size, offload_only=not on_gpu, dma=dma)
    locality = locality or default_profile(selection, token_budget)
    bench_status(progress, f"building {source.spec}, {mode.value}: {batch_size} x {max_len} tokens, "
                           f"budget {token_budget}")
    engine = Engine.from_model(source, device=device, max_model_len=max_len, use_cuda_graphs=use_cuda_graphs,
                               cache=CacheConfig(num_blocks=1 + batch_size * per_seq),
                               scheduler=SchedulerConfig(max_num_seqs=batch_size), progress=progress,
                               offload=offload, retrieval_heads=_any_heads(m.num_layers, m.num_kv_heads))
    with engine:
        off = engine.offloader
        off.selector = LocalitySelector(sparse, locality.overlap_for(m.num_layers, offload.dense_layers), rows=groups,
                                        device=dev, seed=seed)
        timed = None
        if off.recaller is not None:
            timed = off.recaller = TimedRecaller(off.recaller, dev)     # type: ignore[assignment]
        gen = torch.Generator().manual_seed(seed)
        for i in range(batch_size):
            prompt = torch.randint(0, m.vocab_size, (context_len + 1,), generator=gen).tolist()
            engine.add_request(prompt, SamplingParams(max_new_tokens=warmup + steps + 2, ignore_eos=True),
                               kv=RandomKV(context_len, seed=seed + i), offload=True)
        bench_status(progress, "loading the handed-in KV and running the first decode step")
        engine.step()
        for _ in range(warmup):
            engine.step()
        blocked0 = _blocked_ns(off)
        before = off.statistics()
        if timed is not None:
            timed.host_ns = 0
            timed.take_stream_seconds()
            timed.take_publish_to_landed()
        times, stream_s = [], 0.0
        published = StampTotals()
        with _profiler(profile, dev) as prof:
            for _ in tqdm(range(steps), disable=not progress, desc=f"{mode.value} B={batch_size} ctx={context_len}",
                          unit="step", leave=False):
                t0 = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - t0)
                if timed is not None:
                    stream_s += timed.take_stream_seconds()  # after the step: its tokens were read, no stall added
                    published += timed.take_publish_to_landed()
        if prof is not None and profile is not None:
            _write_profile(prof, profile, steps)
        after = off.statistics()
        moved = after.bytes_recalled - before.bytes_recalled
        peak = _link_peak(off, dev) if timed is not None and dev.type == "cuda" else None
        rate = moved / stream_s / 1e9 if stream_s > 0 and moved else None
        pub_s, pickup_s, pub_n = published.publish_to_landed_s, sum(published.pickups_ns) / 1e9, published.requests
        pub_rate = published.nbytes / pub_s / 1e9 if pub_s > 0 else None
        copy_rate = published.nbytes / (pub_s - pickup_s) / 1e9 if pub_s - pickup_s > 0 else None
        kv_side = engine.kv.statistics().bytes_total + off.digests.max.nbytes * 2
        if off.runtime is not None:
            kv_side += off.runtime.device_pool.slots.nbytes
        per_token = kv_bytes_per_token(m.num_layers, m.num_kv_heads, m.head_dim, engine.kv.dtype)
        host = 0 if off.runtime is None else off.runtime.host_pool.blocks.nbytes // batch_size
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        used = None if off.runtime is None else off.runtime.config.dma
        return SparseBenchResult(
            source.spec, mode.value, selection.value, name, batch_size, context_len, token_budget, steps,
            use_cuda_graphs and dev.type == "cuda",
            statistics.median(times) * 1e3, statistics.fmean(times) * 1e3, batch_size / statistics.fmean(times),
            off.layout.unit_bytes, moved / off.layout.unit_bytes / steps, moved / 2**20 / steps, rate, peak,
            None if rate is None or peak is None else rate / peak,
            pub_rate, None if pub_rate is None or peak is None else pub_rate / peak,
            pub_s / pub_n * 1e6 if pub_n else None, pickup_s / pub_n * 1e6 if pub_n else None,
            published.pickup_us(50), published.pickup_us(90), published.poller_lag_us(50), published.poller_lag_us(90),
            copy_rate, None if copy_rate is None or peak is None else copy_rate / peak,
            0.0 if timed is None else timed.host_ns / 1e6 / steps, (_blocked_ns(off) - blocked0) / 1e6 / steps,
            kv_side // batch_size, per_token * per_seq * bs, host, describe(locality),
            None if used is None else used.zero_copy_ctas, None if used is None else used.resident_idle_us)


def _profiler(path: Path | None, device: torch.device) -> Any:
    if path is None:
        return contextlib.nullcontext()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def _write_profile(prof: Any, path: Path, steps: int) -> None:
    averages = prof.key_averages()
    tables = [f"# {steps} steps; totals over all of them\n"]
    for key in ("self_cpu_time_total", "self_device_time_total"):
        tables.append(f"\n## by {key}\n" + averages.table(sort_by=key, row_limit=45, max_name_column_width=70))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(tables))


def _blocked_ns(off: Any) -> int:
    recaller = off.recaller.inner if isinstance(off.recaller, TimedRecaller) else off.recaller
    return 0 if recaller is None else recaller.blocked_ns


def _link_peak(off: Any, device: torch.device, nbytes: int = 512 << 20, reps: int = 5) -> float:
    """GB/s of a contiguous copy from the runtime's pinned host pool to the device, best of `reps`."""
    src = off.runtime.host_pool.blocks.view(-1)[:nbytes]
    dst = torch.empty(src.numel(), dtype=torch.uint8, device=device)
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return src.numel() / best / 1e9


def _any_heads(num_layers: int, num_kv_heads: int) -> RetrievalHeads:
    """SoloHead's layout needs a head per layer; the locality selector ignores which."""
    return RetrievalHeads(num_kv_heads, best=(0,) * num_layers, worst=(num_kv_heads - 1,) * num_layers)
