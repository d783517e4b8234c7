"""Forecast a replay's decode throughput and TPOT from bytes alone: which serving configurations could meet a target.

The forecast runs the replay's own outer scheduler (`OuterScheduler` over the `KVBudget` of `plan_pools`: the same
admissions, classes, moves and batch caps) on a trace, without an engine. Each round's duration comes from what its
decode steps must read (`step_bytes`, as the replay's roofline counts it) and what its recalls move:

- one batch (vanilla, quest, or one class alone): `e * bytes / copy`, plus the recall over the link when it is the
  offload batch (alone it has nothing to hide it behind);
- pulseinfer under IRQ: `e * (normal + offload bytes) / copy + max(0, recall / link - h * normal bytes / copy)`,
  the recall hidden behind the normal batch's steps and exposed where they run out. `h` is the normal pieces' own
  rate over their bytes (`--hide-efficiency`, default vanilla's `e`): beside a recall they run as a plain step does,
  and the rest of IRQ's cost (the device waits, the pieces' boundaries) is in `e`;
- coupled (`--no-irq`, offload-sync): `e * (normal + offload bytes) / copy + recall / link`;
- `pulseinfer --halves` (`replay --halves`): where the engine runs them, in every round with a normal batch and two
  offload requests or more, the offload batch in two halves whose pieces alternate, the normal rows riding in the
  first, so each half's recall flies while the other half computes: `max(e_h * bytes / copy, recall / link)`. `e_h`
  (`--halves-efficiency`) is the halves rounds' own: each half runs the offloaded layers' kernels for itself. The
  other rounds are IRQ's, at `e`;
- `pulseinfer --ride` (`replay --ride`): one step a round, the normal requests riding in the offload batch's, so
  the weights are read once: `e * bytes / copy + recall / link`, the recall exposed;
- `pulseinfer --ride --ahead` (`replay --ride --ahead`): `--ride`'s rounds with each offloaded layer's recall
  prefetched a layer early from a predicted selection (`OffloadConfig.ahead`;
  `benchmarks/speculative_selection.py` measures the prediction on real models):
  `max(e * bytes / copy, p * recall / link) + x * recall / link`, `p` the prefetch's traffic and `x` what the step
  still recalls after its own query, both as fractions of today's recall (`--ahead-traffic`, `--ahead-exposed`;
  by default 1.43 and 0.39, the engine's on Qwen2.5-Coder-0.5B at 8K with hot sets of 1.5 budgets,
  `benchmarks/results/recall-ahead-2026-12-05-cpu/`). A random-weight replay's steering leaves
  `1 - sparse_bench.ahead_hits(budget)` exposed, so `--fit` takes that, and the prefetch's traffic from the report's
  bytes recalled ahead;
- `pulseinfer --ahead` (`replay --ahead`, IRQ's pieces): IRQ's rounds with the same prefetch, `max(e * bytes / copy,
  p * recall / link) + max(0, x * recall / link - h * normal bytes / copy)`; with `--halves`, the halves' rounds hide
  `x * recall` behind the other half instead; `--no-irq --ahead`, the coupled steps, expose it. A round recalling
  ahead is never shorter than the link's `(p + x) * recall / link`.

`e` is a mode's rounds over this model's time, fitted to a replay on the device (`--fit REPORT`: the `e` at which the
forecast gives the report's throughput; on the H200, vanilla 1.21 on both windows, pulseinfer 1.49 on the Mooncake
window and 1.45 on the ServeGen one at budget 1024 with `h` 1.21, --no-irq 1.39; on an H100, pulseinfer 1.46-1.48,
`e_h` 1.73, `--ride` 1.82 on the Mooncake window with hot sets of 1.5 budgets, and `--ride --ahead` 1.95 there and
1.67 on the ServeGen one, 1.81 their mean; IRQ's fits agreeing across the two cards, the H100's stand for both),
`copy` and `link` the rates the
device measured (the recall at 0.8 of the link's peak, as the copier lands it). An offload request's recall is its
hot sets filled once, then per offloaded layer and step the selected blocks its hot set missed, at the locality the
presets are steered to (`sparse_bench.default_profile`). Prefill, the cost of moving a request between classes and
the overlap of rounds are not modelled (the replay hands every prompt's KV in; `e` holds the rest).

    python benchmarks/forecast_serving.py --duration 20 --time-scale 0.3          # session 27's Mooncake window
    python benchmarks/forecast_serving.py --duration 20 --time-scale 0.3 --budget 1024 2048 --threshold 2048 8192
    python benchmarks/forecast_serving.py --duration 40 --time-scale 0.15 --need 3 --need-tpot 1.1  # e for each target

Each mode prints one line: decode tok/s and its ratio to vanilla's, TPOT p50 / p99 of the < 8K requests and the p99's
ratio to vanilla's, the mean batch sizes (normal + offload) and the time the rounds spend reading weights, the rest of
their bytes and waiting for recalls (before `e`); `--need X` and `--need-tpot R` add the largest `e` at which an
offload mode still decodes X times vanilla's tokens a second, and keeps its < 8K requests' TPOT p99 within R times
vanilla's. Options given several values are swept (every combination), each pulseinfer line against vanilla at its
GPU KV cap.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import re
import statistics
import sys
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run without PYTHONPATH too

from pulseio_engine.config import DType, ModelConfig, OffloadConfig  # noqa: E402
from pulseio_engine.model.checkpoint import open_model  # noqa: E402
from pulseio_engine.serving.budget import KVBudget, KVClass  # noqa: E402
from pulseio_engine.serving.config import ServeMode, ServingConfig  # noqa: E402
from pulseio_engine.serving.metrics import Recorder  # noqa: E402
from pulseio_engine.serving.outer import OuterScheduler  # noqa: E402
from pulseio_engine.serving.pools import plan_pools  # noqa: E402
from pulseio_engine.serving.replay import steering_context  # noqa: E402
from pulseio_engine.sparse_bench import ahead_hits, default_profile  # noqa: E402
from pulseio_engine.step_bytes import StepShape, step_bytes  # noqa: E402
from pulseio_engine.trace import Trace  # noqa: E402
from pulseio_engine.trace.load import TraceOptions, open_trace  # noqa: E402


@dataclass(frozen=True)
class Rates:
    """The device's copy and the link's rates (GB/s), and a mode's rounds over their roofline (`efficiency`).
    `hide_efficiency`: the normal pieces' own rate over their bytes where they hide a recall under IRQ (None: the
    mode's `efficiency`). `halves_efficiency`: the rounds run as halves, theirs (None: `efficiency`)."""

    copy_gbps: float
    link_gbps: float
    efficiency: float
    hide_efficiency: float | None = None
    halves_efficiency: float | None = None


@dataclass
class _Running:
    kv_class: KVClass
    context: int          # tokens in its KV now
    left: int             # tokens still to decode
    cold: bool = True     # an offload request whose hot sets are still empty


@dataclass
class Forecast:
    """What the forecast replay measured; `recorder` as a replay fills it."""

    recorder: Recorder
    rounds: int
    weights_s: float       # the rounds' time reading weights, at the roofline (before `e`)
    kv_s: float            # the rest of their bytes
    exposed_recall_s: float
    normal_mean: float     # batch sizes, by round
    offload_mean: float

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.recorder.requests.values())

    @property
    def throughput(self) -> float:
        span = self.recorder.span_s()
        return self.tokens / span if span > 0 else 0.0

    def short_tpot_ms(self) -> tuple[float | None, float | None]:
        short = self.recorder.tpot_by_bucket()["<8K"]
        return short.get("p50_ms"), short.get("p99_ms")


def recall_per_token(config: ServingConfig, model_config: ModelConfig, shape: StepShape, context: int,
                     hot_cache: float = 1.0) -> tuple[float, float]:
    """(bytes an offload request recalls a decode step once warm, bytes to fill its hot sets once) at the locality
    a replay steers to (measured nearest `context`): per offloaded layer, the budget's blocks its hot set missed.
    `hot_cache` > 1: hot sets of that many budgets (`replay --hot-cache`), each layer's refills less those its hot
    set still holds, as the replay steers them (`LocalityProfile.rewarm_for`)."""
    s = shape.sparse
    assert s is not None and config.sparse is not None
    profile = default_profile(config.sparse, config.token_budget, context)
    layers, dense = model_config.num_layers, config.dense_layers
    overlap, rewarm = profile.overlap_for(layers, dense)[dense:], profile.rewarm_for(layers, dense, hot_cache)[dense:]
    missed = [(1.0 - o) * (1.0 - w) for o, w in zip(overlap, rewarm)]      # as the replay steers each layer
    block = s.block_size * shape.token_layer                     # every KV head's K and V of one block, one layer
    return sum(missed) * s.budget_blocks * block, len(missed) * s.budget_blocks * block


def forecast(trace: Trace, model: str, config: ServingConfig, rates: Rates, *, dtype: DType = DType.BFLOAT16,
             locality_context: int | None = None, hot_cache: float = 1.0, halves: bool = False,
             ride: bool = False, ahead: tuple[float, float] | None = None) -> Forecast:
    """Replay `trace` as `config` would, each round timed by its bytes (see the module doc); the recall at the
    locality `replay` steers to (`locality_context` as its option); `hot_cache`: offload requests hold that many
    budgets of hot slots (`recall_per_token`), the GPU bytes they are charged with them as the replay's engine
    allocates them (`ServingConfig.hot_cache`; modes without offload requests hold none). `halves`: the what-if
    of the module doc, under IRQ, for offload batches of two requests or more. `ride`: one forward a round, the
    weights read once for both batches. `ahead` (prefetch traffic, exposed recall), each a fraction of the recall:
    the prefetch flies behind the round's work and only the exposed part is left to recall (hidden under IRQ behind
    the normal steps, under halves behind the other half, as the recall is without it)."""
    model_config = open_model(model).config
    if config.has_offload:
        config = replace(config, hot_cache=hot_cache)
    footprint, sizes = plan_pools(config, model_config, dtype)
    budget = KVBudget(footprint, gpu_bytes=config.gpu_kv_bytes, host_bytes=config.host_kv_bytes)
    outer = OuterScheduler(budget, threshold=config.offload_threshold if config.has_offload else None,
                           max_batch=config.max_batch, max_offload=max(1, sizes.max_offload))
    elem = 2 if dtype is not DType.FLOAT32 else 4
    sparse = None if config.sparse is None else config.sparse_config()
    shapes = {KVClass.NORMAL: StepShape.for_model(model_config, dtype_bytes=elem, sparse=sparse,
                                                  dense_layers=config.dense_layers)}
    warm_recall = fill = 0.0
    if config.has_offload:
        hot_blocks = OffloadConfig(sparse=config.sparse_config(), hot_cache=config.hot_cache).hot_blocks
        shapes[KVClass.OFFLOAD] = StepShape.for_model(model_config, dtype_bytes=elem, sparse=sparse,
                                                      dense_layers=config.dense_layers, hot_blocks=hot_blocks)
        warm_recall, fill = recall_per_token(config, model_config, shapes[KVClass.OFFLOAD],
                                             locality_context or steering_context(trace), hot_cache)
    copy, link, e = rates.copy_gbps * 1e9, rates.link_gbps * 1e9, rates.efficiency
    hide = e if rates.hide_efficiency is None else rates.hide_efficiency
    e_halves = e if rates.halves_efficiency is None else rates.halves_efficiency

    rec = Recorder()
    arrivals = deque(enumerate(trace.requests))
    running: dict[int, _Running] = {}
    t = weights_s = kv_s = exposed_s = 0.0
    rounds = 0
    normal_sizes: list[int] = []
    offload_sizes: list[int] = []
    while arrivals or outer.waiting or running:
        while arrivals and arrivals[0][1].arrival_s <= t:
            rid, r = arrivals.popleft()
            outer.arrive(rid, r.input_len, r.output_len)
            rec.arrived(rid, r.arrival_s, r.input_len, r.output_len, r.origin)
        decisions = outer.decide({rid: q.context for rid, q in running.items()})
        for rid, to in decisions.moves:
            running[rid].kv_class, running[rid].cold = to, True
            rec.moved(rid)
        for rid, kv_class in decisions.admits:
            r = trace.requests[rid]
            running[rid] = _Running(kv_class, r.input_len, r.output_len)
            rec.admitted(rid, t, kv_class.value)
        if not running:
            t = max(t, arrivals[0][1].arrival_s)
            continue
        batches = {c: [rid for rid, q in running.items() if q.kv_class is c] for c in KVClass}
        normal, offload = batches[KVClass.NORMAL], batches[KVClass.OFFLOAD]
        both = bool(normal) and bool(offload)
        steps = min(config.normal_steps, *(running[rid].left for rid in normal)) if both and config.interleaves \
            else 1
        normal_bytes = weight_bytes = 0
        for step in range(steps if normal else 0):
            b = step_bytes(shapes[KVClass.NORMAL], [running[rid].context + step for rid in normal])
            normal_bytes, weight_bytes = normal_bytes + b.total, weight_bytes + b.weights
        offload_bytes = recall = 0.0
        if offload:
            b = step_bytes(shapes[KVClass.OFFLOAD], [running[rid].context for rid in offload], offload=True)
            offload_bytes, weight_bytes = b.total, weight_bytes + b.weights
            for rid in offload:
                recall += fill if running[rid].cold else warm_recall
                running[rid].cold = False
        if ride and both:                     # one forward: the weights read once for both batches
            normal_bytes -= b.weights
            weight_bytes -= b.weights
        as_halves = halves and both and config.interleaves and len(offload) >= 2    # as `ServingEngine` runs them
        compute = (e_halves if as_halves else e) * (normal_bytes + offload_bytes) / copy
        left = recall                         # to recall after each layer's own selection
        if ahead is not None:                 # the prefetch flies behind the round's work, the rest is exposed
            compute, left = max(compute, ahead[0] * recall / link), ahead[1] * recall
        if as_halves:
            exposed = max(0.0, left / link - compute)
        elif both and config.interleaves:
            exposed = max(0.0, left / link - hide * normal_bytes / copy)
        else:
            exposed = left / link
        dt = compute + exposed
        if ahead is not None:                 # the link carries both: the round is never shorter than that
            dt = max(dt, (ahead[0] + ahead[1]) * recall / link)
        t += dt
        rounds += 1
        weights_s += weight_bytes / copy
        kv_s += (normal_bytes + offload_bytes - weight_bytes) / copy
        exposed_s += exposed
        normal_sizes.append(len(normal))
        offload_sizes.append(len(offload))
        produced = {rid: steps for rid in normal} | {rid: 1 for rid in offload}
        finished: dict[int, tuple[int, ...]] = {}
        for rid, n in produced.items():
            q = running[rid]
            q.context, q.left = q.context + n, q.left - n
            if q.left == 0:
                finished[rid] = ()
        rec.round(t, dt, len(normal), len(offload), produced, finished)
        for rid in finished:
            del running[rid]
            outer.finish(rid)
    return Forecast(rec, rounds, weights_s, kv_s, exposed_s, statistics.fmean(normal_sizes),
                    statistics.fmean(offload_sizes))


def fit_efficiency(trace: Trace, model: str, config: ServingConfig, copy_gbps: float, link_gbps: float,
                   throughput: float | None, locality_context: int | None = None, hot_cache: float = 1.0,
                   halves: bool = False, hide_efficiency: float | None = None,
                   efficiency: float | None = None, ride: bool = False,
                   ahead: tuple[float, float] | None = None, short_p99_ms: float | None = None) -> float | None:
    """The `e` in [0.5, 5] at which the forecast gives `throughput`, or (`short_p99_ms` instead) the largest at which
    the < 8K requests' TPOT p99 stays within it (bisection: the forecast slows as `e` grows); None where even
    e = 0.5 falls short (the recall alone bounds the rounds). `hide_efficiency`: as `Rates`'. `halves`: the halves
    rounds' `e_h` instead, the other rounds at `efficiency`."""
    if (throughput is None) == (short_p99_ms is None):
        raise ValueError("fit_efficiency fits one target: give throughput or short_p99_ms")
    if halves and efficiency is None:
        raise ValueError("fitting the halves rounds' efficiency needs the other rounds' (efficiency=)")
    others = efficiency or 0.0                           # the other rounds' e, held (halves)

    def slack(x: float) -> float:                     # > 0: the target still holds at e = x
        rates = Rates(copy_gbps, link_gbps, x, hide_efficiency) if not halves else \
            Rates(copy_gbps, link_gbps, others, hide_efficiency, halves_efficiency=x)
        f = forecast(trace, model, config, rates, locality_context=locality_context, hot_cache=hot_cache,
                     halves=halves, ride=ride, ahead=ahead)
        if throughput is not None:
            return f.throughput - throughput
        assert short_p99_ms is not None
        p99 = f.short_tpot_ms()[1]
        return float("inf") if p99 is None else short_p99_ms - p99

    lo, hi = 0.5, 5.0
    if slack(lo) < 0:
        return None
    for _ in range(24):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if slack(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


MODES = {"vanilla": (ServeMode.VANILLA, None), "quest": (ServeMode.QUEST, None),
         "offload-sync": (ServeMode.OFFLOAD_SYNC, None), "pulseinfer": (ServeMode.PULSEINFER, None),
         "pulseinfer --no-irq": (ServeMode.PULSEINFER, False), "pulseinfer --halves": (ServeMode.PULSEINFER, None),
         "pulseinfer --ride": (ServeMode.PULSEINFER, False),
         "pulseinfer --ride --ahead": (ServeMode.PULSEINFER, False), "pulseinfer --ahead": (ServeMode.PULSEINFER, None),
         "pulseinfer --no-irq --ahead": (ServeMode.PULSEINFER, False)}
HALVES, RIDE, AHEAD = "pulseinfer --halves", "pulseinfer --ride", "pulseinfer --ride --ahead"   # see the module doc
EFFICIENCY = {"vanilla": 1.21, "pulseinfer": 1.47, "pulseinfer --no-irq": 1.39,    # fitted to H200 replays,
              "pulseinfer --ride": 1.82, "pulseinfer --ride --ahead": 1.81}          # these to H100 ones (module doc)
HALVES_EFFICIENCY = 1.73                          # the halves rounds', fitted to an H100 replay (module doc)
AHEAD_TRAFFIC, AHEAD_EXPOSED = 1.43, 0.39         # pulseinfer --ride --ahead, in today's recalls (module doc)
SWEPT = {"token_budget": "budget", "gpu_kv_gib": "GPU GiB", "host_kv_gib": "host GiB",   # the options' fields,
         "offload_threshold": "threshold", "normal_steps": "normal steps"}                 # as a line names them


def _steered_ahead(report: dict) -> tuple[float, float]:
    """A random-weight `--ride --ahead` replay's (prefetch traffic, exposed), in today's recalls: its steering
    leaves 1 - `ahead_hits` of its prediction's budget exposed, and the prefetch moved the report's ahead bytes
    against that."""
    summary = report["summary"]
    exposed = 1.0 - ahead_hits(report.get("config", {}).get("ahead_budget", 1.0))
    return exposed * summary["ahead_bytes"] / max(1, summary["recalled_bytes"] - summary["ahead_bytes"]), exposed


def mode_of(report: dict) -> str:
    """A replay report's mode as `MODES` names it: the prediction's budget (` --ahead-budget F`) is its steering's
    (`_steered_ahead`), not a mode of its own."""
    return re.sub(r" --ahead-budget \S+", "", report["mode"])


def serving_config(mode: str, *, gpu_kv_gib: float, host_kv_gib: float, offload_threshold: int, token_budget: int,
                   normal_steps: int) -> ServingConfig:
    """`mode` as `pulseio-engine replay --mode` names it, with these options (normal steps: pulseinfer's IRQ only)."""
    serve_mode, irq = MODES[mode]
    interleaves = serve_mode is ServeMode.PULSEINFER and irq is not False
    return ServingConfig(mode=serve_mode, irq=irq, gpu_kv_bytes=int(gpu_kv_gib * 2**30),
                         host_kv_bytes=int(host_kv_gib * 2**30), offload_threshold=offload_threshold,
                         token_budget=token_budget, normal_steps=normal_steps if interleaves else 1)


def line(name: str, f: Forecast, vanilla: Forecast | None, *needs: float | None | bool) -> str:
    """One mode's forecast; `needs`: the efficiency each target asked needs (None: unreachable; False: not this
    mode's: vanilla's line)."""
    p50, p99 = f.short_tpot_ms()
    ratio = "" if vanilla is None else f"({f.throughput / vanilla.throughput:.2f}x)"
    tpot = "-" if p50 is None else f"{p50:.1f} / {p99:.1f}"
    base = None if vanilla is None else vanilla.short_tpot_ms()[1]
    short = "" if base is None or p99 is None else f"({p99 / base:.2f}x)"
    return (f"{name:<64} {f.throughput:7.1f} {ratio:>8}  {tpot:>13} {short:>8}  {f.normal_mean:5.2f} + "
            f"{f.offload_mean:5.2f}  {f.weights_s:5.1f} / {f.kv_s:4.1f} / {f.exposed_recall_s:4.1f} s"
            + "".join(f"  {'' if need is False else '< 0.5' if need is None else f'{need:.2f}':>{NEED_WIDTH}}"
                      for need in needs))


def mode_efficiency(text: str) -> tuple[str, float]:
    """`--efficiency` items: MODE=E, E > 0."""
    mode, _, value = text.partition("=")
    try:
        e = float(value)
    except ValueError:
        e = 0.0
    if mode not in MODES or not e > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MODE=E with E > 0, MODE one of {', '.join(MODES)}")
    return mode, e


NEED_WIDTH = 16                                   # the `--need` / `--need-tpot` columns
HEADER = (f"{'mode, options':<64} {'tok/s':>7} {'x van.':>8}  {'TPOT <8K ms':>13} {'x van.':>8}  "
          f"{'batches':>13}  weights / KV / exposed recall")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="mooncake-sample")
    parser.add_argument("--start", type=float, default=None)
    parser.add_argument("--duration", type=float, default=None)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--max-input", type=int, default=32000, help="as benchmarks/run_serving_gpu.sh clips")
    parser.add_argument("--max-output", type=int, default=1024)
    parser.add_argument("--model", default="qwen3-14b")
    parser.add_argument("--gpu-kv-gib", type=float, nargs="+", default=[6.0])
    parser.add_argument("--host-kv-gib", type=float, nargs="+", default=[32.0])
    parser.add_argument("--threshold", dest="offload_threshold", type=int, nargs="+", default=[4096])
    parser.add_argument("--budget", dest="token_budget", type=int, nargs="+", default=[2048])
    parser.add_argument("--normal-steps", type=int, nargs="+", default=[1])
    parser.add_argument("--locality-context", type=int, default=None, metavar="TOKENS",
                        help="the recall at the shipped locality measured nearest this context, as `replay "
                             "--locality-context` steers (default: nearest the trace's median prompt, as replay)")
    parser.add_argument("--hot-cache", type=float, default=1.0, metavar="F",
                        help="offload requests hold F budgets of hot slots, as `replay --hot-cache F` builds them: "
                             "their GPU bytes, and their recall at the locality records' simulated hot caches "
                             "(1.5, 2, 4 budgets; interpolated between) (default: 1)")
    parser.add_argument("--modes", nargs="+", default=["vanilla", "pulseinfer", "pulseinfer --no-irq"],
                        choices=list(MODES))
    parser.add_argument("--copy-gbps", type=float, default=4290.0, help="device-to-device copy, GB/s")
    parser.add_argument("--link-gbps", type=float, default=55.2 * 0.8,
                        help="the recall's rate over the link, GB/s (default: 0.8 of the H200's 55.2)")
    parser.add_argument("--efficiency", nargs="+", type=mode_efficiency, default=[],
                        help="MODE=E: a mode's rounds over this model's time (default: `EFFICIENCY`, fits to replays "
                             "on the H200 and an H100); a mode not named takes its first word's, else pulseinfer's")
    parser.add_argument("--hide-efficiency", type=float, default=EFFICIENCY["vanilla"], metavar="H",
                        help="under IRQ, the normal pieces' rate over their bytes where they hide a recall (default: "
                             "vanilla's efficiency, as they run beside it)")
    parser.add_argument("--halves-efficiency", type=float, default=HALVES_EFFICIENCY, metavar="E",
                        help="pulseinfer --halves: the rounds run as halves, their rounds over their bytes (default: "
                             "fitted to a replay with --halves on an H100)")
    parser.add_argument("--ahead-traffic", type=float, default=AHEAD_TRAFFIC, metavar="P",
                        help="pulseinfer --ride --ahead: the prefetch's link traffic, a fraction of today's recall "
                             "(default: the engine's on Qwen2.5-Coder-0.5B at 8K, budget 1024, hot sets of 1.5)")
    parser.add_argument("--ahead-exposed", type=float, default=AHEAD_EXPOSED, metavar="X",
                        help="pulseinfer --ride --ahead: what a step still recalls after its own query, a fraction of "
                             "today's recall (default: as --ahead-traffic)")
    parser.add_argument("--need", type=float, default=None, metavar="X",
                        help="also print the efficiency at which each offload mode would decode X times vanilla's "
                             "tokens a second")
    parser.add_argument("--need-tpot", type=float, default=None, metavar="R",
                        help="also print the efficiency up to which each offload mode keeps its < 8K requests' "
                             "TPOT p99 within R times vanilla's")
    parser.add_argument("--fit", nargs="+", type=Path, default=[],
                        help="replay reports of this trace window: the efficiency at which the forecast gives each "
                             "one's throughput")
    args = parser.parse_args(argv)
    trace = open_trace(TraceOptions(args.trace, start_s=args.start, duration_s=args.duration,
                                    time_scale=args.time_scale, max_input=args.max_input,
                                    max_output=args.max_output))
    print(f"# {trace.describe()}; copy {args.copy_gbps:g} GB/s, recall {args.link_gbps:g} GB/s")
    eff: dict[str, float] = {**EFFICIENCY, **dict(args.efficiency)}

    def rates(mode: str) -> Rates:
        e = eff.get(mode) or eff.get(mode.split()[0]) or eff.get("pulseinfer", 1.0)
        return Rates(args.copy_gbps, args.link_gbps, e, args.hide_efficiency, args.halves_efficiency)

    for path in args.fit:
        report = json.loads(path.read_text())
        cfg = report["config"]
        config = serving_config(mode_of(report), gpu_kv_gib=cfg["gpu_kv_gib"], host_kv_gib=cfg["host_kv_gib"] or 1.0,
                                offload_threshold=cfg["offload_threshold"] or 4096, token_budget=cfg["token_budget"],
                                normal_steps=cfg["normal_steps"])
        measured = report["summary"]["decode_throughput_tok_s"]
        steered = re.search(r"context (\d+)", cfg.get("steering") or "")     # the locality the run was steered to
        halves = bool(cfg.get("halves"))                  # its halves rounds' e_h, the others at pulseinfer's e
        e = fit_efficiency(trace, report["model"], config, args.copy_gbps, args.link_gbps, measured,
                           int(steered.group(1)) if steered else None, cfg.get("hot_cache", 1.0),
                           halves=halves, hide_efficiency=args.hide_efficiency,
                           efficiency=rates("pulseinfer").efficiency, ride=bool(cfg.get("ride")),
                           ahead=_steered_ahead(report) if cfg.get("ahead") else None)
        print(f"{path}: {report['mode']}{' --halves' if halves else ''} {measured:.1f} tok/s -> "
              + ("halves rounds' " if halves else "") + "efficiency "
              + ("below 0.5" if e is None else f"{e:.3f}"))
    if args.fit:
        return 0

    asked = [f"e for {args.need:g}x"] if args.need is not None else []
    asked += [f"e for TPOT {args.need_tpot:g}x"] if args.need_tpot is not None else []
    print(HEADER + "".join(f"  {title:>{NEED_WIDTH}}" for title in asked))
    vanillas: dict[tuple, Forecast] = {}
    for values in itertools.product(*(getattr(args, name) for name in SWEPT)):
        options = dict(zip(SWEPT, values))
        for mode in args.modes:
            named = ("gpu_kv_gib",) if mode == "vanilla" else SWEPT        # vanilla depends on the GPU cap only
            swept = ", ".join(f"{SWEPT[name]} {value:g}" for name, value in options.items()
                              if name in named and len(getattr(args, name)) > 1)
            config = serving_config(mode, **options)
            key = (mode, config)
            if mode == "vanilla":        # only the GPU cap changes vanilla
                key = (mode, options["gpu_kv_gib"])
                if key in vanillas:
                    continue
            ride = mode in (RIDE, AHEAD)
            ahead = (args.ahead_traffic, args.ahead_exposed) if mode.endswith(" --ahead") else None
            f = forecast(trace, args.model, config, rates(mode), locality_context=args.locality_context,
                         hot_cache=args.hot_cache, halves=mode == HALVES, ride=ride, ahead=ahead)
            if mode == "vanilla":
                vanillas[key] = f
            base = vanillas.get(("vanilla", options["gpu_kv_gib"]))
            fit = functools.partial(fit_efficiency, trace, args.model, config, args.copy_gbps, args.link_gbps,
                                    locality_context=args.locality_context, hot_cache=args.hot_cache,
                                    halves=mode == HALVES, hide_efficiency=args.hide_efficiency,
                                    efficiency=rates(mode).efficiency, ride=ride, ahead=ahead)
            needs: list[float | None | bool] = []
            if args.need is not None:
                needs.append(base is not None and config.has_offload and fit(args.need * base.throughput))
            if args.need_tpot is not None:
                p99 = None if base is None else base.short_tpot_ms()[1]
                needs.append(p99 is not None and config.has_offload and fit(None, short_p99_ms=args.need_tpot * p99))
            print(line(f"{mode}{', ' + swept if swept else ''}", f, None if mode == "vanilla" else base, *needs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
