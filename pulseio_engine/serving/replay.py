"""Trace replay, the engine's main job: requests arrive at the trace's times, join in their class, decode their
output length, and the run reports what a serving user measures (`report.py`).

The engine is the decode instance of a prefill-decode disaggregated deployment: a request arrives with a
prompt of the trace's length (random token ids, seeded per request) whose KV is handed in, random KV for the
random-weight presets (`RandomKV`), or prefilled here for real models, then decodes the trace's output
length (greedy, no stop at EOS). Random-weight presets steer their selection to a measured locality, as
the sparse bench does (`sparse_bench.default_profile`; with hot sets larger than a budget, refilling from them
as the record's simulated hot caches found), so their recalls are as large as a real model's.

Before anything is allocated: every request must fit the model's context and, on its own, the KV caps;
the host pool must fit the host's memory and the engine's pools and weights the device's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from pulseio import LatencySummary
from pulseio.gc_pauses import GCPauses, GCPauseStatistics, frozen_heap
from pulseio.machine import gib, memory_budget

from ..bench import measure_copy_bandwidth_sync, measure_upload_bandwidth
from ..config import DType, OffloadConfig, SparseMode
from ..engine import TORCH_DTYPES
from ..errors import EngineError, PromptTooLongError
from ..gil_option import GIL_SWITCH_US, gil_switch, gil_switch_us
from ..kv.handoff import RandomKV
from ..kv.retrieval_heads import RetrievalHeads
from ..model.checkpoint import ModelSource, load_checkpoint
from ..offload import SteeringProfile
from ..preflight import InsufficientMemoryError, check_fits, estimate, fixes_for
from ..runner import rider_rows
from ..trace import Trace
from .budget import KVBudget, KVClass, size
from .clock import Clock, ClockKind
from .config import ServingConfig
from .engine import LaunchedRound, ServingEngine, StepOutcome
from .gpu_busy import BusyMeter
from .metrics import Recorder, counter_mean, m_summary
from .outer import OuterScheduler
from .pools import plan_pools
from .report import SCHEMA_VERSION, check_report
from .roofline import roofline


@dataclass(frozen=True)
class ReplayOptions:
    """How to replay: on `device` (cpu, cuda[:N]); `clock` None: wall time on a GPU, virtual time on a CPU;
    `heads`: the SoloHead calibration (needed for real models; presets take any head); `busy_every`: profile
    the GPU's timeline 5 rounds out of every this many (0: never); `warmup`: run `warm_up` before the clock
    starts, as a server warms up before it takes traffic; `timeline_dir`: write those windows' timelines there
    (`BusyMeter`); `skinny_gemm`: `EngineConfig.skinny_gemm` (False: every projection through cuBLAS);
    `locality_context`: a random-weight preset's selection is steered to the shipped locality measured nearest
    this context (None: nearest the trace's median prompt; `steering_context`); `gil_switch_s`: the interpreter's
    GIL switch interval while the engine serves (`pulseio.gil_switch_interval`: the main loop's Python holds
    recalls back for up to it; None: the interpreter's as it is); `freeze_heap`: exempt everything alive after the
    warm-up from garbage collection while serving (`pulseio.frozen_heap`; False: full collections walk it all)."""

    device: str = "cpu"
    clock: ClockKind | None = None
    seed: int = 0
    heads: Path | None = None
    busy_every: int = 200
    use_cuda_graphs: bool = True
    warmup: bool = True
    timeline_dir: Path | None = None
    skinny_gemm: bool = True
    locality_context: int | None = None
    gil_switch_s: float | None = GIL_SWITCH_US * 1e-6
    freeze_heap: bool = True


def replay(trace: Trace, source: ModelSource, config: ServingConfig, options: ReplayOptions, *,
           progress: Callable[[int, dict], None] | None = None, say: Callable[[str], None] = lambda _: None) -> dict:
    """Replay `trace` on `source` under `config`; -> the report (checked against the schema). `progress(n, info)`
    is called as requests finish; `say` gets one line per setup step."""
    device, dtype = options.device, DType.BFLOAT16 if options.device.startswith("cuda") else DType.FLOAT32
    config.check_device(device, options.use_cuda_graphs)
    max_len = _check_context(trace, source)
    heads = _heads(source, config, options.heads)
    steering = _steering(source, config, options.seed, options.locality_context or steering_context(trace))
    footprint, sizes = plan_pools(config, source.config, dtype)
    _check_memory(source, config, device, dtype, sizes.device_bytes(footprint))
    budget = KVBudget(footprint, gpu_bytes=config.gpu_kv_bytes, host_bytes=config.host_kv_bytes)
    threshold = config.offload_threshold if config.has_offload else None
    check = OuterScheduler(budget, threshold=threshold, max_batch=config.max_batch, max_offload=1)
    for rid, r in enumerate(trace.requests):              # refuse up front what could never be admitted
        check.check(rid, r.input_len, r.output_len)
    say(f"building {source.spec} ({dtype.value} on {device}), {config.describe()}: GPU KV cap "
        f"{size(config.gpu_kv_bytes)}" + (f", host pool {size(config.host_kv_bytes)}" if config.has_offload else ""))
    ckpt = load_checkpoint(source, dtype=TORCH_DTYPES[dtype], device=device, seed=options.seed)
    wall0 = time.perf_counter()
    with gil_switch(options.gil_switch_s), \
            ServingEngine(config, ckpt, device=device, dtype=dtype, max_model_len=max_len, seed=options.seed,
                          heads=heads, use_cuda_graphs=options.use_cuda_graphs,
                          skinny_gemm=options.skinny_gemm) as serving:
        if steering is not None:
            serving.set_steering(steering[0])
        warmup_s = 0.0
        if options.warmup:
            say("warming up: compiling the kernels and capturing the steps the first rounds need, before the clock")
            warmup_s = warm_up(serving, source, max_len, options.seed,
                               every_size=device.startswith("cuda") and options.use_cuda_graphs)
        rates = _rates(serving, device, say)
        base = _Baseline(serving.recall_statistics(), _settled_runtime(serving))
        outer = OuterScheduler(budget, threshold=threshold, max_batch=config.max_batch,
                               max_offload=max(1, serving.sizes.max_offload))
        kind = options.clock or (ClockKind.WALL if device.startswith("cuda") else ClockKind.VIRTUAL)
        with frozen_heap() if options.freeze_heap else nullcontext(), GCPauses() as pauses:
            recorder = _run(trace, serving, outer, Clock(kind), source, options, progress, pauses)
        pulse = base.since(_settled_runtime(serving))
        return check_report(_report(trace, source, config, options, kind, dtype, serving, recorder,
                                    None if steering is None else steering[1], pulse, time.perf_counter() - wall0,
                                    warmup_s, base, rates, pauses.statistics()))


WARMUP_TOKENS = 4      # a first step (eager: compiles), a second (captures its graph), then replays


def warm_up(serving: ServingEngine, source: ModelSource, max_len: int, seed: int, *,
            every_size: bool = False) -> float:
    """What a server does before it takes traffic: short requests of every class through every path the replay
    takes (both classes together, so IRQ's pieces too; a batch of one, then of two, so torch.compile's second
    batch size is met here), decoding `WARMUP_TOKENS` each (fewer, and shorter prompts, where the trace's longest
    request, `max_len` tokens, is shorter); then the engine counts from zero again. Kernels
    compiled and steps captured here are not charged to the first requests of the trace. Long enough to select
    (twice the token budget) where the budget and the context allow. `every_size`: then every batch size up to
    the caps too (`warm_batch_sizes`). -> seconds it took."""
    t0 = time.perf_counter()
    config, fp = serving.config, serving.footprint
    classes = [KVClass.NORMAL] + ([KVClass.OFFLOAD] if config.has_offload else [])
    tokens = min(WARMUP_TOKENS, max_len - 1)             # a trace of shorter requests: fewer, within its longest
    length = max(1, min(2 * config.token_budget + config.block_size, max_len - tokens))
    rid = -1                                            # warm-up ids are negative: never a trace's
    for batch in (1, 2):
        reserved = length + tokens
        gpu = batch * sum(fp.device_bytes(c, reserved) for c in classes)
        host = batch * sum(fp.host_bytes(c, reserved) for c in classes)
        if gpu > config.gpu_kv_bytes or host > config.host_kv_bytes or batch > config.max_batch or (
                config.has_offload and batch > serving.sizes.max_offload):
            break                                       # the caps hold fewer: the replay meets the rest itself
        rid = _serve_batch(serving, source, seed, rid, length, {c: (batch, tokens) for c in classes})
    if every_size:
        warm_batch_sizes(serving, source, max_len, seed, rid)
    serving.reset_statistics()
    return time.perf_counter() - t0


SWEEP_PROMPT_BLOCKS = 2        # the size sweep's prompts: a step's graphs do not depend on its requests' lengths


def warm_batch_sizes(serving: ServingEngine, source: ModelSource, max_len: int, seed: int, rid: int = -1
                     ) -> dict[KVClass, int]:
    """Each engine's step at every batch size from 1 to its `sweep_sizes`, alone (one graph) and, under IRQ, beside
    the other class's batch (split pieces): a size met first on the clock runs its first step eagerly and captures
    its graphs there, a round many times slower than the rest, which every request in it waits for. Each size is a
    batch of that many short requests of one class (with one of the other, or alone) decoding two rounds: the
    eager step, then the captured one; prompt and output within `max_len` tokens. `rid`: the first request id to
    use (negative, counting down). With `halves`, the offload batch beside the normal one runs as a pair of halves
    instead: one normal request meets each pair's smallest riders' rows, and batches of more meet every larger
    `rider_rows` up to the normal batch's top. With `ride`, every offload batch size meets every `rider_rows` up to
    the normal batch's top. -> each class's largest size warmed (0: none)."""
    config = serving.config
    paired_normal_tokens = 1 + config.normal_steps   # the captured round of a split step runs normal_steps
    length = min(SWEEP_PROMPT_BLOCKS * config.block_size, max_len - paired_normal_tokens)
    if length < 1:
        return {}
    tops = sweep_sizes(serving, length + paired_normal_tokens)
    serving.seat_riders(tops.get(KVClass.NORMAL, 0))      # before any capture
    for kv_class, top in tops.items():
        others = [c for c in tops if c is not kv_class]
        for with_other in (True, False) if config.interleaves else (False,):    # coupled: every step is whole
            for n in range(top, 0, -1):                  # the largest first: the seats grow before any capture
                batch = {kv_class: n, **({others[0]: 1} if with_other else {})}
                rid = _serve_batch(serving, source, seed, rid, length, {
                    c: (count, paired_normal_tokens if c is KVClass.NORMAL and with_other else 2)
                    for c, count in batch.items()})
    if serving.carries_riders and tops.get(KVClass.NORMAL):
        levels = sorted({rider_rows(n) for n in range(1, tops[KVClass.NORMAL] + 1)})
        smallest = 2 if config.halves else 1             # halves: an offload batch of two or more
        for rows in levels[1:] if config.halves else levels:    # halves: one normal request met 16 rows above
            normal = min(rows, tops[KVClass.NORMAL])
            for n in range(tops.get(KVClass.OFFLOAD, 0), smallest - 1, -1):
                sizes = {KVClass.NORMAL: normal, KVClass.OFFLOAD: n}
                if _fits(serving, sizes, length + paired_normal_tokens):
                    rid = _serve_batch(serving, source, seed, rid, length,
                                       {c: (k, paired_normal_tokens) for c, k in sizes.items()})
    return tops


def _serve_batch(serving: ServingEngine, source: ModelSource, seed: int, rid: int, length: int,
                 batch: dict[KVClass, tuple[int, int]]) -> int:
    """Warm-up requests of `length` prompt tokens, (how many, tokens each decodes) by class, added at once and run
    to their end; ids from `rid` counting down (never a trace's). -> the next id."""
    for kv_class, (count, tokens) in batch.items():
        for _ in range(count):
            prompt, kv = _prompt(2**31 - rid, length, source.config.vocab_size, seed, random_kv=source.random)
            serving.add(rid, prompt, tokens, kv_class, kv)
            rid -= 1
    pending = None
    while serving.has_unfinished():          # as the replay runs them, so overlapped rounds' kernels load here too
        _, pending = serving.run_round(pending)
    return rid


def sweep_sizes(serving: ServingEngine, tokens: int) -> dict[KVClass, int]:
    """The largest batch of each class `warm_batch_sizes` warms: at most the batch cap, half the step graphs its
    engine keeps (a size has two: split and whole; `OffloadConfig.kept_step_graphs`'s default for an engine without
    step graphs) and, offloaded, the offload cap, with every batch of it and one request of the other class (if any)
    of `tokens` tokens within the KV caps."""
    config = serving.config
    classes = [KVClass.NORMAL] + ([KVClass.OFFLOAD] if config.has_offload else [])
    tops = {}
    for c in classes:
        off = (serving.normal if c is KVClass.NORMAL else serving.offload).offloader     # type: ignore[union-attr]
        kept = OffloadConfig.kept_step_graphs if off is None else off.offload.kept_step_graphs
        top = min(config.max_batch, kept // 2)
        if c is KVClass.OFFLOAD:
            top = min(top, serving.sizes.max_offload)
        while top > 0 and not _fits(serving, {o: top if o is c else 1 for o in classes}, tokens):
            top -= 1
        tops[c] = top
    return tops


def _fits(serving: ServingEngine, sizes: dict[KVClass, int], tokens: int) -> bool:
    """Whether batches of these sizes (class -> requests) of `tokens` tokens each fit the GPU and host KV caps."""
    config, fp = serving.config, serving.footprint
    return (sum(n * fp.device_bytes(c, tokens) for c, n in sizes.items()) <= config.gpu_kv_bytes
            and sum(n * fp.host_bytes(c, tokens) for c, n in sizes.items()) <= config.host_kv_bytes)


@dataclass(frozen=True)
class _Baseline:
    """pulseio's counters after the warm-up, so the report counts the replay's recalls only."""

    recalls: tuple[int, int, int]      # (requests, bytes, ahead bytes), from `ServingEngine.recall_statistics`
    pulse: dict | None                 # from `_settled_runtime`

    def since(self, pulse: dict | None) -> dict | None:
        """The counters since the baseline; the latencies as they are (pulseio keeps its last samples)."""
        if pulse is None or self.pulse is None:
            return pulse
        return {k: pulse[k] - self.pulse[k] if k in _COUNTERS else pulse[k] for k in pulse}


def _run(trace: Trace, serving: ServingEngine, outer: OuterScheduler, clock: Clock, source: ModelSource,
         options: ReplayOptions, progress: Callable[[int, dict], None] | None, pauses: GCPauses) -> Recorder:
    recorder = Recorder()
    busy = BusyMeter(options.device, every=options.busy_every or 1, timeline_dir=options.timeline_dir)
    busy.enabled = busy.enabled and options.busy_every > 0
    arrivals = deque(enumerate(trace.requests))
    vocab, done, paused_s = source.config.vocab_size, 0, 0.0
    serving.host.start()
    pending: LaunchedRound | None = None        # overlapped rounds: the one launched last, not collected yet

    def record(outcome: StepOutcome, took: float) -> None:
        nonlocal done, paused_s
        t = clock.now()
        paused_before, paused_s = paused_s, pauses.statistics().paused_s      # the collections since the last round
        recorder.round(t, took, outcome.normal_batch, outcome.offload_batch, outcome.produced, outcome.finished,
                       gc_s=paused_s - paused_before)
        for rid in outcome.finished:
            outer.finish(rid)
        if serving.rounds % 50 == 1:
            recorder.sample_rss(t)
        done += len(outcome.finished)
        if progress is not None and (outcome.finished or serving.rounds % 20 == 0):
            progress(done, {"t": f"{t:.1f}s", "normal": outcome.normal_batch, "offload": outcome.offload_batch,
                            "waiting": len(outer.waiting)})

    while arrivals or outer.waiting or serving.has_unfinished():
        now = clock.now()
        while arrivals and arrivals[0][1].arrival_s <= now:
            rid, r = arrivals.popleft()
            outer.arrive(rid, r.input_len, r.output_len)
            recorder.arrived(rid, r.arrival_s, r.input_len, r.output_len, r.origin)
        decisions = outer.decide(serving.lengths())
        if pending is not None and decisions.moves:     # a move hands the request's tokens on: collect them first
            serving.host.lap("outer")                   # the arrivals and decisions so far (collect starts anew)
            t0 = time.perf_counter()
            outcome, pending = serving.collect(pending), None
            took = time.perf_counter() - t0
            clock.ran(took)
            record(outcome, took)
        for rid, to in decisions.moves:
            serving.move(rid, to)
            recorder.moved(rid)
        for rid, kv_class in decisions.admits:
            r = trace.requests[rid]
            prompt, kv = _prompt(rid, r.input_len, vocab, options.seed, random_kv=source.random)
            serving.add(rid, prompt, r.output_len, kv_class, kv)
            recorder.admitted(rid, now, kv_class.value)
        serving.host.lap("outer")
        if not serving.has_unfinished():
            if not arrivals:
                raise EngineError(f"{len(outer.waiting)} requests wait and none can be admitted into an idle engine "
                                  "(this is a bug in pulseio_engine)")
            idle0 = clock.now()
            clock.idle_until(arrivals[0][1].arrival_s)
            recorder.idle_s += clock.now() - idle0
            serving.host.start()
            continue
        opened = busy.before_round()
        clock.exclude(opened)
        serving.host.exclude(opened)
        t0 = time.perf_counter()
        outcomes, pending = serving.run_round(pending)
        took = time.perf_counter() - t0
        clock.ran(took)
        walked = busy.after_round()
        clock.exclude(walked)
        serving.host.exclude(walked)
        for outcome in outcomes:
            record(outcome, took / len(outcomes))
    recorder.sample_rss(clock.now())
    busy.stop()
    recorder.busy = busy.fraction()
    return recorder


def _rates(serving: ServingEngine, device: str, say: Callable[[str], None]) -> tuple[float | None, float | None]:
    """(device copy GB/s, link GB/s from the offload engine's pinned pool) for the serving roofline, measured
    before the clock; (None, None) on a CPU, None for the link without an offload runtime."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None, None
    say("measuring the device's copy bandwidth and the link's, for the serving roofline")
    copy = measure_copy_bandwidth_sync(dev, 1 << 30) / 1e9
    off = None if serving.offload is None else serving.offload.offloader
    link = None if off is None or off.runtime is None else measure_upload_bandwidth(off.runtime.host_pool.blocks,
                                                                                   dev) / 1e9
    return copy, link


def _prompt(rid: int, length: int, vocab: int, seed: int, *, random_kv: bool) -> tuple[list[int], RandomKV | None]:
    """A request's prompt (seeded by the run's seed and the request) and, for random weights, its handed-in KV."""
    rng = np.random.default_rng([seed, rid])
    prompt = rng.integers(0, vocab, size=length).tolist()
    kv = RandomKV(length - 1, seed=seed * 1_000_003 + rid) if random_kv and length > 1 else None
    return prompt, kv


def _check_context(trace: Trace, source: ModelSource) -> int:
    """-> the longest request (prompt + output), refusing one past the model's context."""
    limit = source.config.max_position_embeddings
    longest = max(trace.requests, key=lambda r: r.input_len + r.output_len)
    need = longest.input_len + longest.output_len
    if need > limit:
        over = sum(r.input_len + r.output_len > limit for r in trace.requests)
        raise PromptTooLongError(
            f"{over} requests exceed {source.spec}'s context of {limit} positions, the longest ({longest.origin}) "
            f"{longest.input_len} + {longest.output_len} = {need}; clip them (--max-input and --max-output, "
            f"summing to at most {limit}) or use a model with a longer context")
    return need


def _heads(source: ModelSource, config: ServingConfig, path: Path | None) -> RetrievalHeads | None:
    m = source.config
    if path is not None:
        return RetrievalHeads.load(path)
    if config.sparse not in (SparseMode.SOLOHEAD, SparseMode.SOLOHEAD_REVERSED):
        return None
    if not source.random:
        raise EngineError(f"{config.sparse.value} selection on {source.spec} needs its retrieval heads: pass --heads "
                          "(written by `pulseio-engine calibrate`), or --selection quest")
    return RetrievalHeads(m.num_kv_heads, best=(0,) * m.num_layers, worst=(m.num_kv_heads - 1,) * m.num_layers)


def steering_context(trace: Trace) -> int:
    """The context a replay's steering is measured nearest by default: the trace's median prompt."""
    return int(np.median([r.input_len for r in trace.requests]))


def _steering(source: ModelSource, config: ServingConfig, seed: int, context: int
              ) -> tuple[SteeringProfile, str] | None:
    """A random-weight preset's steering (the locality measured nearest `context`, with the rewarm of
    `config.hot_cache`) and its description for the report; None for real models and vanilla. Refuses, before
    anything is built, a hot cache the record cannot steer."""
    if not source.random or config.sparse is None:
        return None
    from ..sparse_bench import default_profile, describe, steering_profile

    profile = default_profile(config.sparse, config.token_budget, context)
    steering = steering_profile(profile, source.config.num_layers, config.dense_layers, config.hot_cache, seed,
                                ahead=config.ahead, ahead_budget=config.ahead_budget)
    hot = "" if config.hot_cache == 1.0 else f"; hot sets of {config.hot_cache:g} budgets refilled as it simulated"
    ahead = f"; {steering.ahead:g} of each later layer's recall prefetched a layer early" * config.ahead
    ahead += f" by a prediction of {config.ahead_budget:g} budgets" * (config.ahead_budget != 1.0)
    return steering, describe(profile) + hot + ahead


def _check_memory(source: ModelSource, config: ServingConfig, device: str, dtype: DType, pools: int) -> None:
    """The host pool against the host's memory, the weights and pools against the device's, before allocating."""
    host = memory_budget("cpu")
    if config.has_offload and host is not None and config.host_kv_bytes > host.nbytes:
        raise InsufficientMemoryError(
            f"--host-kv-gib asks for a host pool of {gib(config.host_kv_bytes)}, more than the {gib(host.nbytes)} "
            f"this machine offers ({host.source}); pass a smaller --host-kv-gib")
    elem = TORCH_DTYPES[dtype].itemsize
    need = estimate(source.config, dtype_bytes=elem, kv_tokens=0, batch=config.max_batch, prefill_tokens=2048)
    need = type(need)(need.weights, pools, need.activations)
    what = f"{source.spec} serving {config.describe()} with a {gib(config.gpu_kv_bytes)} KV cap"
    check_fits(need, device=device, what=what, fixes=fixes_for(source.spec, device, "a smaller --gpu-kv-gib"))


_COUNTERS = ("submitted", "completed", "failed", "device_waits_expired", "stamped_bytes",
             "stamped_publish_to_landed_s", "stamped_requests", "landed_early")
_LATENCIES = ("post_to_landed", "publish_to_taken", "publish_to_landed", "publish_to_early_landed",
              "copy_per_mib")                                                            # pulseio's, last recalls


def _settled_runtime(serving: ServingEngine, timeout_s: float = 10.0) -> dict | None:
    """pulseio's counters once every recall it was given has finished (its threads count a moment after), and its
    recall latencies (`RuntimeStatistics`: the host's post -> landed, and on the device's clock the publish ->
    the copier taking it -> landed, and -> landed early where it did), microseconds over its last recalls (`Poller`'s
    `latency_samples`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = serving.runtime_statistics()
        if stats is None:
            return None
        if stats.in_flight == 0 or time.monotonic() > deadline:                # type: ignore[attr-defined]
            out: dict = {k: getattr(stats, k) for k in _COUNTERS}
            out.update({f"{name}_us": _latency_us(getattr(stats, name)) for name in _LATENCIES})
            return out
        time.sleep(1e-3)


def _latency_us(lat: LatencySummary) -> dict:
    """A latency summary as the report holds it: count, p50 and p99 in microseconds (None without samples)."""
    return {"count": lat.count, "p50": lat.p50_us if lat.count else None, "p99": lat.p99_us if lat.count else None}


def _recall_flights(serving: ServingEngine) -> dict | None:
    """`ServingEngine.recall_flights` with its latencies as the report holds them (`_latency_us`)."""
    flights = serving.recall_flights()
    if flights is None:
        return None
    return {kind: {"stamped": f["stamped"], "bytes": f["bytes"], "landed_early": f["landed_early"],
                   "publish_to_early_landed_us": _latency_us(f["publish_to_early_landed"]),
                   "publish_to_landed_us": _latency_us(f["publish_to_landed"])} for kind, f in flights.items()}


def _report(trace: Trace, source: ModelSource, config: ServingConfig, options: ReplayOptions, kind: ClockKind,
            dtype: DType, serving: ServingEngine, rec: Recorder, steering: str | None, pulse: dict | None,
            wall_s: float, warmup_s: float, base: _Baseline, rates: tuple[float | None, float | None],
            pauses: GCPauseStatistics) -> dict:
    records = [rec.requests[rid].to_dict() for rid in sorted(rec.requests)]
    tokens = sum(r["tokens"] for r in records)
    span = rec.span_s()
    recalls, recalled, ahead = (now - before for now, before in zip(serving.recall_statistics(), base.recalls))
    handoffs = serving.handoff_statistics()
    stats = serving.inner.stats
    sizes, fp = serving.sizes, serving.footprint
    pools = sizes.device_bytes(fp)
    copier = serving.copier()
    expected = sum(r.output_len for r in trace.requests)
    completed = sum(r["finished_s"] is not None and r["tokens"] == r["output_len"] for r in records)
    return {
        "schema": SCHEMA_VERSION, "mode": config.describe(), "irq": config.interleaves, "model": source.spec,
        "device": torch.cuda.get_device_name(options.device) if options.device.startswith("cuda") else "cpu",
        "dtype": dtype.value,
        "trace": {"source": trace.source, "format": trace.format, "notes": list(trace.notes),
                  "requests": len(trace), "span_s": trace.span_s},
        "config": {"gpu_kv_gib": config.gpu_kv_bytes / 2**30, "host_kv_gib": config.host_kv_bytes / 2**30,
                   "offload_threshold": config.offload_threshold if config.has_offload else None,
                   "token_budget": config.token_budget, "selection": None if config.sparse is None
                   else config.sparse.value, "clock": kind.value, "seed": options.seed,
                   "max_batch": config.max_batch, "steering": steering,
                   "kv": "random (handed in)" if source.random else "prefilled", "gpu_ahead": config.pieces_ahead,
                   "normal_steps": config.normal_steps, "skinny_gemm": serving.normal.model.workspace is not None,
                   "overlap_rounds": config.overlap_rounds, "two_streams": config.two_streams,
                   "hot_cache": config.hot_cache, "halves": config.halves, "ride": config.ride, "ahead": config.ahead,
                   "ahead_budget": config.ahead_budget,
                   "copier_ctas": None if copier is None else copier[0],
                   "copier_idle_us": None if copier is None else copier[1],
                   "gil_switch_us": gil_switch_us(options.gil_switch_s), "freeze_heap": options.freeze_heap},
        "summary": {"requests": len(trace), "completed": completed, "complete": completed == len(trace)
                    and tokens == expected, "output_tokens": tokens, "expected_tokens": expected, "duration_s": span,
                    "decode_throughput_tok_s": tokens / span if span > 0 else 0.0,
                    "gpu_busy_fraction": rec.busy, "recalls": recalls,
                    "recalled_bytes": recalled, "ahead_bytes": ahead, "rounds": serving.rounds,
                    "warming_rounds": serving.warming_rounds,
                    "halves_rounds": serving.halves_rounds, "ridden_rounds": serving.ridden_rounds,
                    "wall_s": wall_s, "warmup_s": warmup_s, "step_graphs_built": serving.step_graphs_built(),
                    "normal_steps_mean": counter_mean(serving.normal_step_counts),
                    "handoffs_landed": handoffs.landed, "handoffs_waited": handoffs.waited},
        "tpot_ms": rec.tpot_by_bucket(),
        "host_ms_per_round": serving.host.ms_per_round(serving.rounds),
        "m": m_summary(stats.m, stats.seen_landed, stats.device_waits) if config.interleaves else None,
        "moves": asdict(serving.moves), "pulseio": pulse, "recall_flights": _recall_flights(serving),
        "memory": {"gpu_kv_cap_bytes": config.gpu_kv_bytes, **asdict(sizes), "gpu_pools_bytes": pools,
                   "host_pool_bytes": serving.host_pool_bytes()},
        "roofline": roofline(serving.read, recalled, span - rec.idle_s, tokens, copy_gbps=rates[0],
                             link_gbps=rates[1]),
        "timeline": rec.timeline(), "batches": rec.batch_histogram(), "requests": records,
        "gc": {"collections": list(pauses.collections), "paused_s": pauses.paused_s,
               "longest_ms": pauses.longest_s * 1e3},
        "longest_gaps": rec.longest_gaps(),
    }

