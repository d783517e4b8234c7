"""Sparse decode benchmark: offload requests, and the all-on-GPU baseline, on one model, against the sparse step's
own roofline and, with `compare_vanilla`, against a dense step of the same batch in the same process.

Modes (`pulseio-engine bench --mode`):

- all-on-gpu: every block stays in the paged cache; each offloaded layer attends to its selection (Quest per
  KV head, or SoloHead's shared one, `--selection`) there, in place (`RecallMode.ALL_ON_GPU`). No recall, no
  memory saving.
- offload-sync / offload-doorbell: an offload-only engine (the paged cache keeps the dense layers; the
  other layers live in pinned host memory with a hot set per layer on the GPU, `--hot-cache` budgets large). The
  selected blocks not in the hot set are recalled through pulseio: ids to the host and a host wait (sync), or
  published from the device with a device wait, both captured in the step's CUDA graph (doorbell).

Workload: handed-in random KV (`RandomKV`), random prompt tokens, greedy decode. The timed loop is the
vanilla bench's: each step feeds its greedy tokens back on the device and replays the step's CUDA graph(s)
(one for all-on-gpu and doorbell; one per layer for sync, whose recalls run on the host between them), the
host at most 10 steps ahead; the first steps go through `Engine.step` (capture, warm-up). On random weights
the query . digest top-k jumps at random every step, so the selection is steered (`kv/steering.py`): every
layer still scores every digest and takes its top-K, but a row keeps the step-to-step overlap of its middle
blocks measured on real models (`pulseio-engine locality`, `data/locality.json`; the output names the source)
and, with `--hot-cache` above 1, refills the slots it does not keep from blocks its hot set still holds as often
as the record's simulated hot caches of that size found them there (`LocalityProfile.rewarm_for`).

Measured per mode: step time (sustained, CUDA events) and the sparse roofline: the bytes a step must read
(weights, the dense layers' KV, the selecting heads' digests, the selected KV, selection and recall
bookkeeping) over the device-to-device copy bandwidth measured in the same run; kernels per step from the
GPU's own timeline; the main thread's time per step (enqueueing it: inputs, the recalls' arming, replays);
recalled units, MiB and unit size per step; for doorbell requests on the resident copier, bytes over the
device-clock time from the publish kernel's stamp to the copier's landed stamp, next to the host-to-device
peak of a contiguous copy in the same process; and GPU bytes per request of the engine's KV-side tensors.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from pulseio import DmaConfig

from .bench import (
    PROFILED_STEPS,
    BenchMode,
    BenchResult,
    _Timer,
    bench_status,
    count_kernels_per_step,
    decode_len,
    measure_copy_bandwidth_sync,
    measure_upload_bandwidth,
    run_bench,
)
from .config import CacheConfig, OffloadConfig, RecallMode, SchedulerConfig, SparseConfig, SparseMode
from .engine import Engine
from .errors import EngineError
from .evaluation.locality import LocalityProfile, packaged_profiles
from .kv.block_table import blocks_for
from .kv.cache import kv_bytes_per_token
from .kv.handoff import RandomKV
from .kv.recall import PendingRecall, Recaller
from .kv.retrieval_heads import RetrievalHeads
from .model.checkpoint import ModelSource, open_model
from .offload import SteeringProfile
from .request import SamplingParams
from .step_bytes import StepBytes, StepShape, step_bytes


class SparseBenchMode(Enum):
    ALL_ON_GPU = "all-on-gpu"
    OFFLOAD_SYNC = "offload-sync"
    OFFLOAD_DOORBELL = "offload-doorbell"

    @property
    def recall(self) -> RecallMode:
        return {SparseBenchMode.ALL_ON_GPU: RecallMode.ALL_ON_GPU, SparseBenchMode.OFFLOAD_SYNC: RecallMode.SYNC,
                SparseBenchMode.OFFLOAD_DOORBELL: RecallMode.DOORBELL}[self]


def default_profile(selection: SparseMode, token_budget: int, context_len: int | None = None) -> LocalityProfile:
    """The shipped locality measurement a preset runs with: of the same selection, Qwen2.5 before
    SmolLM2 (the closer architecture to the Qwen3 presets), the nearest budget, then the context nearest
    `context_len` (the longer of two as near; None: the longest measured). A longer context keeps less of
    its selection from step to step, so the choice sets how much a step recalls."""
    def distance(p: LocalityProfile) -> int:
        return 0 if context_len is None else abs(p.context_len - context_len)

    return min(packaged_profiles(), key=lambda p: (p.mode is not selection, not p.model.startswith("qwen"),
                                                   abs(p.token_budget - token_budget), distance(p), -p.context_len))


# Of what a layer still recalls past its hot set, the share the engine's recall ahead brought in time, by the
# prediction's budget (`OffloadConfig.ahead_budget`), on Qwen2.5-Coder-0.5B with SoloHead at 8K, budget 1024, hot sets
# of 1.5 budgets: one minus the exposed share of benchmarks/results/recall-ahead-2026-12-05-cpu/ (one budget: 0.393,
# for 1.43x the traffic; Quest 0.368 and 1.40x, SmolLM2 at 4K 0.333 and 1.12x) and of
# recall-ahead-overfetch-2026-12-06-cpu/ (1.25 budgets: 0.263, 2.01x; 1.5: 0.252, 3.00x). Against a hot set of one
# budget the share is larger (0.74 at 8K, 0.68 at 32K: speculative-2026-12-05-cpu): a larger hot set already holds the
# blocks easiest to predict.
AHEAD_HITS: dict[float, float] = {1.0: 0.61, 1.25: 0.74, 1.5: 0.75}


def ahead_hits(ahead_budget: float) -> float:
    """The steering's share of a layer's recall its prediction brought (`AHEAD_HITS`), at a prediction of
    `ahead_budget` budgets; only the measured budgets are steered."""
    if ahead_budget not in AHEAD_HITS:
        raise ValueError(f"a random-weight model's recall ahead is steered to the share measured on a real model, at "
                         f"a prediction of {', '.join(f'{b:g}' for b in sorted(AHEAD_HITS))} budgets; "
                         f"{ahead_budget:g} was not measured")
    return AHEAD_HITS[ahead_budget]


def steering_profile(locality: LocalityProfile, num_layers: int, dense_layers: int, hot_cache: float,
                     seed: int, *, ahead: bool = False, ahead_budget: float = 1.0) -> SteeringProfile:
    """A random-weight model's steering from a locality record: its overlap per layer and, for hot sets of
    `hot_cache` budgets, the rewarm its simulated hot caches give (`LocalityProfile.rewarm_for`); `ahead`
    (`OffloadConfig.ahead`, the prediction at `ahead_budget` budgets): `ahead_hits` of what a layer still recalls
    was prefetched by its prediction."""
    return SteeringProfile(locality.overlap_for(num_layers, dense_layers), seed=seed,
                           rewarm=locality.rewarm_for(num_layers, dense_layers, hot_cache),
                           ahead=ahead_hits(ahead_budget) if ahead else 0.0)


def describe(profile: LocalityProfile) -> str:
    return (f"{profile.model} {profile.mode.value} budget {profile.token_budget} context {profile.context_len}: "
            f"mean overlap {statistics.fmean(profile.overlap):.3f} over its {len(profile.overlap)} offloaded "
            "layers, stretched by depth (pulseio_engine/data/locality.json)")


class TimedRecaller:
    """A `Recaller` with the main thread's time in it and the doorbell requests (whose publish and landed stamps
    give each request's span on the device clock)."""

    def __init__(self, inner: Recaller) -> None:
        self.inner = inner
        self.host_ns = 0
        self.requests: list[Any] = []

    def post(self, ids: torch.Tensor, dst: torch.Tensor, count: torch.Tensor, *, tag: int) -> PendingRecall:
        """`Recaller.post`, its time and its device wait's on the main thread counted."""
        t0 = time.perf_counter_ns()
        pending = self.inner.post(ids, dst, count, tag=tag)
        self.host_ns += time.perf_counter_ns() - t0
        if pending.handle is not None and hasattr(pending.handle, "published_ns"):
            self.requests.append(pending.handle)

        def wait() -> None:
            t1 = time.perf_counter_ns()
            try:
                pending.wait_device()
            finally:
                self.host_ns += time.perf_counter_ns() - t1
        return PendingRecall(pending.handle, tag, waiter=wait)

    @property
    def captures(self) -> bool:
        return self.inner.captures

    @property
    def ahead_bytes(self) -> int:
        return self.inner.ahead_bytes

    def recall_graph(self) -> Any:
        return self.inner.recall_graph()

    def arm(self, recalls: Any) -> list[Any]:
        """A captured step's recalls: the main thread's time arming them, and their stamps."""
        t0 = time.perf_counter_ns()
        done = self.inner.arm(recalls)
        self.host_ns += time.perf_counter_ns() - t0
        self.requests.extend(done)
        return done

    def check_landed(self) -> None:
        self.inner.check_landed()

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
                           tuple(r.seen_ns - r.published_ns for r in stamped if r.seen_ns is not None),
                           tuple(r.early_landed_ns - r.published_ns for r in stamped if r.early_landed_ns is not None))


HOST_AHEAD = 2   # timed steps the host may enqueue in front of the GPU: one runs while the next waits, so the GPU
                 # never idles, and a launch never waits inside its timing for room in the device's queue (a step is
                 # hundreds of graph nodes) or in the ring (12 steps of recalls): the main thread's time is its work


@dataclass(frozen=True)
class StampTotals:
    """Doorbell requests' stamps: bytes and publish -> landed summed (device clock); per request, publish ->
    the copier's start (the pickup; the rest is the copy), publish -> the poller's read of it (device
    clock to host clock: only differences between requests mean anything), and, for those every copy CTA copied
    from the ids mirror before their task came, publish -> landed early (when a captured device wait ends)."""

    nbytes: int = 0
    requests: int = 0
    publish_to_landed_s: float = 0.0
    pickups_ns: tuple[int, ...] = ()
    publish_to_seen_ns: tuple[int, ...] = ()
    publish_to_early_ns: tuple[int, ...] = ()

    def __add__(self, other: StampTotals) -> StampTotals:
        return StampTotals(self.nbytes + other.nbytes, self.requests + other.requests,
                           self.publish_to_landed_s + other.publish_to_landed_s, self.pickups_ns + other.pickups_ns,
                           self.publish_to_seen_ns + other.publish_to_seen_ns,
                           self.publish_to_early_ns + other.publish_to_early_ns)

    def landed_early_fraction(self) -> float | None:
        return len(self.publish_to_early_ns) / self.requests if self.requests else None

    def early_us(self, percentile: float) -> float | None:
        return _percentile_us(self.publish_to_early_ns, percentile)

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
    cuda_graphs: bool              # the step ran as captured graphs (one, or one per layer for sync recalls)
    graphs_per_step: int           # CUDA graph replays per step
    step_ms: float                 # sustained: first timed step's start to the last one's end, over steps
    step_ms_median: float          # median of per-step times
    tokens_per_s: float
    step_bytes: StepBytes          # what a step must read
    bytes_per_step: int
    copy_bandwidth_gbps: float | None   # device-to-device copy, read + written, this process (None on a CPU)
    roofline_ms: float | None
    roofline_ratio: float | None   # step_ms / roofline_ms
    kernels_per_step: float | None     # on the GPU's own timeline (the resident copier's generations included)
    host_ms_per_step: float        # main thread's work enqueueing a step (inputs, arming the recalls, replays),
                                   # the host HOST_AHEAD steps ahead; its waits (blocked_ms_per_step) left out
    recall_host_ms_per_step: float     # of it, in recall calls (sync) or arming the captured recalls
    blocked_ms_per_step: float     # main thread in calls that waited (sync's ids and copies; a full ring)
    unit_bytes: int                # one recalled transfer unit
    units_per_step: float          # recalled, all layers and requests
    recalled_mib_per_step: float
    link_peak_gbps: float | None   # contiguous pinned -> device copy, this process
    recall_floor_ms: float | None  # recalled bytes / (0.8 x link peak): what the recall may add to a step
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
    gpu_bytes_per_request: int         # paged cache + hot slots + digests, cache sized to these requests
    vanilla_gpu_bytes_per_request: int
    host_bytes_per_request: int
    locality: str
    copier_ctas: int | None        # the runtime's resident copier: copy CTAs (DmaConfig.zero_copy_ctas) and
    copier_idle_us: int | None     # how long a generation stays up without a task; None: no runtime
    vanilla: BenchResult | None = None   # the dense step of the same batch, this process (compare_vanilla)
    vanilla_error: str | None = None     # why compare_vanilla got no dense step (it did not fit, say)
    skinny_gemm: bool = False            # projections of <= 32 rows ran through skinny_linear
    all_on_gpu_step_ms: float | None = None   # the all-on-GPU step of the same batch, this process
    all_on_gpu_error: str | None = None       # why compare_all_on_gpu got no such step
    hot_cache: float = 1.0                    # offload modes: hot sets of this many budgets (OffloadConfig.hot_cache)
    ahead: bool = False                       # offload-doorbell: each layer recalled ahead too (OffloadConfig.ahead)
    ahead_units_per_step: float = 0.0         # of units_per_step, those recalled ahead
    ahead_budget: float = 1.0                 # the prediction's budget, in budgets (OffloadConfig.ahead_budget)
    landed_early_fraction: float | None = None          # of the stamped requests, those landed early (StampTotals)
    publish_to_early_landed_us_p50: float | None = None  # their publish -> landed early, device clock

    @property
    def vanilla_ratio(self) -> float | None:
        """This step over the dense step of the same batch (compare_vanilla), or None."""
        return None if self.vanilla is None else self.step_ms / self.vanilla.step_ms

    @property
    def recall_bound_ms(self) -> float | None:
        """What an offload step may take: the all-on-GPU step plus the recall at 0.8 of the link (compare_all_on_gpu,
        on a GPU), or None."""
        if self.all_on_gpu_step_ms is None or self.recall_floor_ms is None:
            return None
        return self.all_on_gpu_step_ms + self.recall_floor_ms

    @property
    def recall_bound_ratio(self) -> float | None:
        """This step over `recall_bound_ms`, or None."""
        bound = self.recall_bound_ms
        return None if bound is None else self.step_ms / bound

    def to_dict(self) -> dict:
        out = asdict(self)
        out["vanilla_ratio"] = self.vanilla_ratio
        out["recall_bound_ms"], out["recall_bound_ratio"] = self.recall_bound_ms, self.recall_bound_ratio
        return out

    def summary(self) -> str:
        rate = ""
        if self.publish_gbps is not None:
            rate += (f", publish -> landed {self.publish_gbps:.1f} GB/s{_of_peak(self.publish_fraction_of_peak)} "
                     f"({self.publish_to_landed_us:.0f} us a request, "
                     f"pickup p50 {self.publish_to_taken_us_p50:.0f} us)")
        if self.landed_early_fraction is not None:
            early = "" if self.publish_to_early_landed_us_p50 is None else \
                f", publish -> landed early p50 {self.publish_to_early_landed_us_p50:.0f} us"
            rate += f", {self.landed_early_fraction:.0%} landed early{early}"
        roof = "" if self.roofline_ms is None else \
            f", roofline {self.roofline_ms:.2f} ms ({self.step_bytes.total / 1e9:.1f} GB) -> {self.roofline_ratio:.2f}x"
        kernels = "" if self.kernels_per_step is None else f", {self.kernels_per_step:,.0f} kernels/step"
        vs = "" if self.vanilla is None else \
            f"; vanilla {self.vanilla.step_ms:.2f} ms/step -> sparse/vanilla {self.vanilla_ratio:.2f}"
        if self.recall_bound_ms is not None:
            vs += (f"; bound {self.all_on_gpu_step_ms:.2f} (all-on-gpu) + {self.recall_floor_ms:.2f} (recall at 0.8 "
                   f"of the link) = {self.recall_bound_ms:.2f} ms -> {self.recall_bound_ratio:.2f}x")
        recall = "" if not self.units_per_step else \
            f", {self.recalled_mib_per_step:.1f} MiB/step recalled in {self.unit_bytes >> 10} KiB units{rate}"
        hot = ("" if self.hot_cache == 1.0 else f" hot set={self.hot_cache:g} budgets") + " ahead" * self.ahead
        hot += f" (prediction {self.ahead_budget:g} budgets)" * (self.ahead_budget != 1.0)
        return (f"{self.model} {self.mode} ({self.selection}) B={self.batch_size} ctx={self.context_len} "
                f"budget={self.token_budget}{hot}: {self.step_ms:.2f} ms/step ({self.tokens_per_s:,.0f} tok/s){roof}"
                f"{kernels}{recall}, main thread {self.host_ms_per_step:.2f} ms/step "
                f"({self.blocked_ms_per_step:.2f} blocked), GPU {self.gpu_bytes_per_request / 2**20:.0f} MiB/request "
                f"(vanilla {self.vanilla_gpu_bytes_per_request / 2**20:.0f}){vs}")


def run_sparse_bench(model: str | ModelSource, *, mode: SparseBenchMode, batch_size: int, context_len: int,
                     steps: int, token_budget: int = 2048, selection: SparseMode = SparseMode.SOLOHEAD,
                     warmup: int = 3, device: str | None = None, locality: LocalityProfile | None = None,
                     progress: bool = True, seed: int = 0, profile: Path | None = None,
                     use_cuda_graphs: bool = True, dma: DmaConfig | None = None,
                     compare_vanilla: bool = False, compare_all_on_gpu: bool = False,
                     skinny_gemm: bool = True, hot_cache: float = 1.0, ahead: bool = False,
                     ahead_budget: float = 1.0) -> SparseBenchResult:
    """`profile`: also write a torch.profiler table of the timed steps there, and their timeline beside it as a
    gzipped Chrome trace (they run slower under it).
    `dma`: the offload runtime's transfer settings (`OffloadConfig.dma`; None: the engine's).
    `hot_cache` (offload modes): hot sets of this many budgets (`OffloadConfig.hot_cache`), the steering refilling
    from them as the locality record's simulated hot caches found (`LocalityProfile.rewarm_for`); `ahead`
    (offload-doorbell, hot_cache > 1): each offloaded layer after the first also recalled a layer early
    (`OffloadConfig.ahead`, its prediction at `ahead_budget` budgets), steered to find `ahead_hits` of the rest of its
    recall there.
    `compare_vanilla`: then run the dense bench at the same batch and context in this process
    (`result.vanilla`, `result.vanilla_ratio`). `compare_all_on_gpu` (offload modes): then the all-on-GPU mode
    with the same selection, for the offload step's bound (`result.recall_bound_ms`, `recall_bound_ratio`).
    `skinny_gemm`: `EngineConfig.skinny_gemm`, every run."""
    if compare_all_on_gpu and mode is SparseBenchMode.ALL_ON_GPU:
        raise ValueError("compare_all_on_gpu compares an offload mode with the all-on-GPU step; got mode all-on-gpu")
    if hot_cache != 1.0 and mode is SparseBenchMode.ALL_ON_GPU:
        raise ValueError(f"hot_cache ({hot_cache:g}) sizes the offload modes' hot sets; mode all-on-gpu has none")
    source = model if isinstance(model, ModelSource) else open_model(model)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    bandwidth = None
    if dev.type == "cuda":
        bench_status(progress, "measuring the device's copy bandwidth (2 GiB copies)")
        bandwidth = measure_copy_bandwidth_sync(dev, 2 << 30)
    result = _run_sparse(source, mode, batch_size, context_len, steps, token_budget, selection, warmup, device,
                         locality, progress, seed, profile, use_cuda_graphs, dma, bandwidth, skinny_gemm, hot_cache,
                         ahead, ahead_budget)
    if compare_all_on_gpu:
        _release(dev)
        bench_status(progress, f"all-on-gpu at the same batch and context, for the bound ({batch_size} x "
                               f"{context_len})")
        try:
            on_gpu = _run_sparse(source, SparseBenchMode.ALL_ON_GPU, batch_size, context_len, steps, token_budget,
                                 selection, warmup, device, locality, progress, seed, None, use_cuda_graphs, None,
                                 bandwidth, skinny_gemm, 1.0, False, 1.0)
            result = replace(result, all_on_gpu_step_ms=on_gpu.step_ms)
        except (torch.OutOfMemoryError, EngineError) as exc:     # the offload result stands; say why there is no bound
            bench_status(progress, f"all-on-gpu did not run: {exc}")
            result = replace(result, all_on_gpu_error=f"{type(exc).__name__}: {exc}"[:500])
    if not compare_vanilla:
        return result
    _release(dev)
    bench_status(progress, f"vanilla at the same batch and context, for the ratio ({batch_size} x {context_len})")
    try:
        vanilla = run_bench(source, mode=BenchMode.VANILLA, batch_size=batch_size, context_len=context_len,
                            steps=steps, warmup=warmup, device=device, use_cuda_graphs=use_cuda_graphs,
                            skinny_gemm=skinny_gemm,
                            progress=progress, seed=seed)
    except (torch.OutOfMemoryError, EngineError) as exc:     # the sparse result stands; say why there is no ratio
        bench_status(progress, f"vanilla did not run: {exc}")
        return replace(result, vanilla_error=f"{type(exc).__name__}: {exc}"[:500])
    return replace(result, vanilla=vanilla)


def _run_sparse(source: ModelSource, mode: SparseBenchMode, batch_size: int, context_len: int, steps: int,
                token_budget: int, selection: SparseMode, warmup: int, device: str,
                locality: LocalityProfile | None, progress: bool, seed: int, profile: Path | None,
                use_cuda_graphs: bool, dma: DmaConfig | None, bandwidth: float | None,
                skinny_gemm: bool, hot_cache: float, ahead: bool, ahead_budget: float) -> SparseBenchResult:
    dev = torch.device(device)
    m, bs = source.config, CacheConfig().block_size
    max_len = decode_len(context_len, warmup, steps)
    per_seq = blocks_for(max_len, bs)
    sparse = SparseConfig(mode=selection, token_budget=token_budget, block_size=bs)
    on_gpu = mode is SparseBenchMode.ALL_ON_GPU
    groups = m.num_kv_heads if selection is SparseMode.QUEST else 1
    host_units = 1 + (m.num_layers - OffloadConfig().dense_layers) * groups * batch_size * per_seq
    offload = OffloadConfig(sparse=sparse, recall=mode.recall, host_blocks=1 if on_gpu else host_units,
                            max_seqs=batch_size, offload_only=not on_gpu, dma=dma, hot_cache=hot_cache, ahead=ahead,
                            ahead_budget=ahead_budget)
    locality = locality or default_profile(selection, token_budget, context_len)
    steering = steering_profile(locality, m.num_layers, offload.dense_layers, hot_cache, seed, ahead=ahead,
                                ahead_budget=ahead_budget)
    bench_status(progress, f"building {source.spec}, {mode.value} ({selection.value}): {batch_size} x {max_len} "
                           f"tokens, budget {token_budget}")
    engine = Engine.from_model(source, device=device, max_model_len=max_len, use_cuda_graphs=use_cuda_graphs,
                               skinny_gemm=skinny_gemm,
                               cache=CacheConfig(num_blocks=1 + batch_size * per_seq),
                               scheduler=SchedulerConfig(max_num_seqs=batch_size), progress=progress,
                               offload=offload, retrieval_heads=_any_heads(m.num_layers, m.num_kv_heads))
    with engine:
        off = engine.offloader
        assert off is not None
        off.steering = steering
        timed = None
        if off.recaller is not None:
            timed = off.recaller = TimedRecaller(off.recaller)     # type: ignore[assignment]
        gen = torch.Generator().manual_seed(seed)
        for i in range(batch_size):
            prompt = torch.randint(0, m.vocab_size, (context_len + 1,), generator=gen).tolist()
            engine.add_request(prompt, SamplingParams(max_new_tokens=max_len - context_len - 1, ignore_eos=True),
                               kv=RandomKV(context_len, seed=seed + i), offload=True)
        bench_status(progress, "loading the handed-in KV, running the first decode steps (captures the step's graph)")
        engine.step()                    # prefill: the handed-in KV
        engine.step()                    # the first decode step: eager, then captured
        graph = engine.runner.offload_step_graph
        step: Callable[[], object] = engine.step
        if graph is not None:
            def step_graph() -> None:                   # the tokens fed back, then the captured step
                graph.advance_nowait()
                graph.run()
            step = step_graph
        for _ in range(warmup):
            step()
        blocked0 = _blocked_ns(off)
        before = _settled_statistics(off)            # the warm-up's recalls counted before the clock, ahead ones too
        if timed is not None:
            timed.host_ns = 0
            timed.take_publish_to_landed()
        timers: list[_Timer] = []
        host_s = 0.0
        with _profiler(profile, dev) as prof:
            for i in tqdm(range(steps), disable=not progress, desc=f"{mode.value} B={batch_size} ctx={context_len}",
                          unit="step", leave=False):
                if i >= HOST_AHEAD:
                    timers[i - HOST_AHEAD].wait()    # outside the timed launch: see HOST_AHEAD
                timers.append(_Timer(dev))
                t0 = time.perf_counter()
                step()
                host_s += time.perf_counter() - t0
                timers[-1].stop()
        per_step = sorted(t() for t in timers)
        sustained = timers[0].seconds_until(timers[-1]) / steps
        recall_host_ms = 0.0 if timed is None else timed.host_ns / 1e6 / steps
        blocked_ms = (_blocked_ns(off) - blocked0) / 1e6 / steps
        if prof is not None and profile is not None:
            _write_profile(prof, profile, steps)
        kernels = count_kernels_per_step(step, dev, PROFILED_STEPS - 1)
        if off.recaller is not None:
            off.recaller.check_landed()            # the device is idle: raises if a recall failed
        after = _settled_statistics(off)
        published = StampTotals() if timed is None else timed.take_publish_to_landed()
        moved = after.bytes_recalled - before.bytes_recalled
        counted = steps + PROFILED_STEPS             # the profiled steps recalled too
        peak = (measure_upload_bandwidth(off.runtime.host_pool.blocks, dev) / 1e9
                if timed is not None and off.runtime is not None and dev.type == "cuda" else None)
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
        mean_ctx = context_len + 2 + warmup + (steps - 1) / 2
        nbytes = step_bytes(StepShape.of(engine), [mean_ctx] * batch_size, offload=not on_gpu)
        roofline = None if bandwidth is None else nbytes.total / bandwidth * 1e3
        recalled = moved / counted
        return SparseBenchResult(
            source.spec, mode.value, selection.value, name, batch_size, context_len, token_budget, steps,
            use_cuda_graphs and dev.type == "cuda", 0 if graph is None else graph.graphs_per_step,
            sustained * 1e3, per_step[len(per_step) // 2] * 1e3, batch_size / sustained,
            nbytes, nbytes.total, None if bandwidth is None else bandwidth / 1e9, roofline,
            None if roofline is None else sustained * 1e3 / roofline, kernels,
            host_s * 1e3 / steps - blocked_ms, recall_host_ms - blocked_ms, blocked_ms,
            off.layout.unit_bytes, recalled / off.layout.unit_bytes, recalled / 2**20, peak,
            None if peak is None or not recalled else recalled / (0.8 * peak * 1e9) * 1e3,
            pub_rate, None if pub_rate is None or peak is None else pub_rate / peak,
            pub_s / pub_n * 1e6 if pub_n else None, pickup_s / pub_n * 1e6 if pub_n else None,
            published.pickup_us(50), published.pickup_us(90), published.poller_lag_us(50), published.poller_lag_us(90),
            copy_rate, None if copy_rate is None or peak is None else copy_rate / peak,
            kv_side // batch_size, per_token * per_seq * bs, host, describe(locality),
            None if used is None else used.zero_copy_ctas, None if used is None else used.resident_idle_us,
            skinny_gemm=engine.model.workspace is not None, hot_cache=hot_cache, ahead=ahead, ahead_budget=ahead_budget,
            ahead_units_per_step=(after.bytes_ahead - before.bytes_ahead) / counted / off.layout.unit_bytes,
            landed_early_fraction=published.landed_early_fraction(),
            publish_to_early_landed_us_p50=published.early_us(50))


def _release(device: torch.device) -> None:
    """Before the next run of this process: the last one's memory back (its engine is garbage by now)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _settled_statistics(off: Any, timeout_s: float = 5.0) -> Any:
    """The offloader's statistics once pulseio has counted every recall the device has finished (its threads
    finish completions a moment after the data lands), the recaller's count of those recalled ahead included."""
    deadline = time.monotonic() + timeout_s
    while True:
        rt = None if off.runtime is None else off.runtime.statistics()
        if off.recaller is not None:
            off.recaller.check_landed()
        after = off.statistics()
        if rt is None or rt.in_flight == 0 or time.monotonic() > deadline:
            return after
        time.sleep(1e-3)


def _profiler(path: Path | None, device: torch.device) -> Any:
    if path is None:
        return contextlib.nullcontext()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def _write_profile(prof: Any, path: Path, steps: int) -> None:
    """The table at `path`, and the timeline beside it (`<path>.trace.json.gz`, for Perfetto)."""
    averages = prof.key_averages()
    tables = [f"# {steps} steps; totals over all of them\n"]
    for key in ("self_cpu_time_total", "self_device_time_total"):
        tables.append(f"\n## by {key}\n" + averages.table(sort_by=key, row_limit=45, max_name_column_width=70))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(tables))
    trace = path.with_name(path.name + ".trace.json")
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as raw, gzip.open(f"{trace}.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    trace.unlink()


def _blocked_ns(off: Any) -> int:
    recaller = off.recaller.inner if isinstance(off.recaller, TimedRecaller) else off.recaller
    return 0 if recaller is None else recaller.blocked_ns


def _any_heads(num_layers: int, num_kv_heads: int) -> RetrievalHeads:
    """SoloHead's layout needs a head per layer; the locality selector ignores which."""
    return RetrievalHeads(num_kv_heads, best=(0,) * num_layers, worst=(num_kv_heads - 1,) * num_layers)
