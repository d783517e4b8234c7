"""The `replay`, `replay-table` and `replay-gaps` subcommands of `pulseio-engine` (parsers and handlers).

    pulseio-engine replay --trace mooncake-sample --model tiny --mode pulseinfer --gpu-kv-gib 0.02 \
        --host-kv-gib 0.5 --offload-threshold 2048 --token-budget 256 --requests 50 --max-input 3072 \
        --max-output 64 --json out/pulseinfer.json --plot out/pulseinfer.png
    pulseio-engine replay-table out/vanilla.json out/pulseinfer.json --plot out/compare.png
    pulseio-engine replay-gaps out/timelines            # after replay --timeline-dir out/timelines

Every option and the trace are checked before the model is loaded; a mistake is one line on stderr and exit
code 2. Each transformation of the trace is printed as it is applied.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from pulseio.cliargs import (
    DEBUG_HELP,
    UsageError,
    check_writable,
    device_name,
    float_at_least,
    int_at_least,
    progress_enabled,
    require_device,
)
from pulseio.machine import memory_budget

from ..ahead_option import add_ahead_budget_option, check_ahead_budget
from ..config import SparseMode
from ..copier_options import add_copier_options
from ..gil_option import add_gil_switch_option, gil_switch_s
from ..model.checkpoint import open_model
from ..trace import SAMPLES, TraceFormat, TraceOptions, open_trace
from .clock import ClockKind
from .config import ServeMode, ServingConfig
from .plots import plot_compare, plot_run
from .replay import ReplayOptions, replay
from .report import load_report, table
from .timeline import describe, read_window

_SELECTIONS = (SparseMode.QUEST.value, SparseMode.SOLOHEAD.value)
DEFAULT_HOST_GIB = 16.0


def add_parsers(sub: argparse._SubParsersAction, model_help: str) -> None:
    r = sub.add_parser("replay", help="serve a trace (Mooncake, ServeGen) as the decode instance; report and plot",
                       description="Serve a trace as the decode instance of a prefill-decode disaggregated "
                                   "deployment: each request arrives at the trace's time with its prompt's KV handed "
                                   "in (random KV for presets, prefilled for real models) and decodes the trace's "
                                   "output length. Every mode is held to the same GPU KV cap (--gpu-kv-gib).")
    r.add_argument("--trace", required=True, help=f"a Mooncake .jsonl, a ServeGen chunk-<client>-trace.csv or a "
                                                 f"folder of clients, or a shipped sample ({', '.join(SAMPLES)})")
    r.add_argument("--format", choices=[f.value for f in TraceFormat], default=TraceFormat.AUTO.value,
                   help="how to read --trace (auto: .jsonl is Mooncake, .csv or a folder ServeGen)")
    r.add_argument("--model", required=True, help=model_help)
    r.add_argument("--mode", required=True, choices=[m.value for m in ServeMode],
                   help="vanilla / quest: every KV on the GPU (dense / Quest); offload-sync: long requests offloaded, "
                        "recalled with a host sync, one coupled batch (ArkVale-like); pulseinfer: doorbell recalls, "
                        "SoloHead, the two batches interleaved layer by layer (IRQ)")
    r.add_argument("--no-irq", action="store_true",
                   help="pulseinfer with its two batches coupled, not interleaved: each batch's whole step in turn, "
                        "two forwards a round (one forward for both: --ride)")
    r.add_argument("--gpu-kv-gib", type=float_at_least(1e-6), required=True,
                   help="GPU memory every mode may hold for KV (and digests, hot sets), GiB")
    r.add_argument("--host-kv-gib", type=float_at_least(1e-6), default=None,
                   help=f"offload modes: the host pool, GiB (default {DEFAULT_HOST_GIB:g}, at most half the host's "
                        "free memory)")
    r.add_argument("--offload-threshold", type=int_at_least(1), default=8192,
                   help="offload modes: tokens from which a request keeps its KV in the host pool")
    r.add_argument("--token-budget", type=int_at_least(1), default=2048,
                   help="sparse modes: tokens each request attends to (a multiple of 16)")
    r.add_argument("--selection", choices=_SELECTIONS, default=None,
                   help="sparse modes: which heads select (default: quest for quest / offload-sync, solohead for "
                        "pulseinfer)")
    r.add_argument("--locality-context", type=int_at_least(1), default=None, metavar="TOKENS",
                   help="random-weight presets: steer the selection to the shipped locality measured nearest this "
                        "context (default: nearest the trace's median prompt)")
    r.add_argument("--heads", type=Path, default=None, help="SoloHead's calibration (pulseio-engine calibrate); "
                                                           "presets take any head")
    r.add_argument("--max-batch", type=int_at_least(1), default=256, help="requests in each batch at most")
    r.add_argument("--max-offload", type=int_at_least(1), default=None,
                   help="offload modes: offload requests at most (each holds hot sets on the GPU; the warm-up meets "
                        "every offload batch size up to it; default: as many as the GPU KV cap holds at the threshold)")
    r.add_argument("--hot-cache", type=float_at_least(1.0), default=1.0, metavar="F",
                   help="offload modes: each offload request's hot set per layer and selecting row holds F token "
                        "budgets of blocks, the least recently selected evicted: F times the hot slots' GPU memory "
                        "(fewer offload requests fit --gpu-kv-gib) for fewer recalls; a random-weight preset's "
                        "steering refills from it as the locality record's simulated hot caches found (default 1: "
                        "the last selection only)")
    r.add_argument("--gpu-ahead", type=int_at_least(1), default=None,
                   help="pulseinfer (IRQ): layer pieces the host may enqueue ahead of the GPU (default: 8 with "
                        "overlapped rounds, whose next launch must run while the GPU still has work; 1 without)")
    r.add_argument("--normal-steps", type=int_at_least(1), default=ServingConfig.normal_steps,
                   help="pulseinfer (IRQ): the normal batch's decode steps a round, between the offload batch's layers")
    r.add_argument("--two-streams", action="store_true",
                   help="pulseinfer (IRQ) on a GPU: the offload batch on a high-priority stream, the normal batch on a "
                        "low-priority one, so the GPU runs normal layers wherever the offload batch waits")
    r.add_argument("--halves", action="store_true",
                   help="pulseinfer (IRQ): the offload batch in two halves whose layers alternate, the normal requests "
                        "riding in the first, so each half's recall flies while the other computes")
    r.add_argument("--ride", action="store_true",
                   help="pulseinfer without IRQ: the normal requests ride in the offload batch's step, one forward a "
                        "round that reads the weights once for both (the recall is not hidden)")
    r.add_argument("--ahead", action="store_true",
                   help="pulseinfer: each layer's predicted blocks are recalled during the layer before, into the "
                        "hot set's spare entries (give --hot-cache above 1), so after its own selection a layer "
                        "recalls only what the prediction missed (under IRQ, the normal layers hide that rest); a "
                        "random-weight preset's steering finds that share of its recall prefetched "
                        "(`sparse_bench.AHEAD_HITS`)")
    add_ahead_budget_option(r)
    add_copier_options(r)
    t = r.add_argument_group("trace transformations (applied in this order, each printed)")
    t.add_argument("--start", type=float_at_least(0.0), default=None, help="window start, s of the trace")
    t.add_argument("--duration", type=float_at_least(1e-6), default=None, help="window length, s of the trace")
    t.add_argument("--requests", type=int_at_least(1), default=None, help="the first N requests of the window")
    t.add_argument("--time-scale", type=float_at_least(1e-9), default=1.0,
                   help="arrival times x this (< 1: faster arrivals)")
    t.add_argument("--max-input", type=int_at_least(1), default=None, help="clip prompt lengths to this")
    t.add_argument("--max-output", type=int_at_least(1), default=None, help="clip output lengths to this")
    r.add_argument("--seed", type=int_at_least(0), default=0, help="ServeGen's draws, prompts, KV and weights")
    r.add_argument("--clock", choices=["auto", *[c.value for c in ClockKind]], default="auto",
                   help="wall: real time (sleeps when idle); virtual: rounds' measured time, jumping over idle "
                        "(auto: wall on a GPU, virtual on a CPU)")
    r.add_argument("--gpu-busy-every", type=int_at_least(0), default=200,
                   help="profile the GPU's timeline 5 rounds in every this many (0: never)")
    r.add_argument("--timeline-dir", type=Path, default=None, metavar="DIR",
                   help="write the timelines of the rounds --gpu-busy-every profiles (GPU kernels and the host's "
                        "calls; Chrome trace JSON, one file a window: open them in Perfetto) into this folder")
    r.add_argument("--json", type=Path, default=None, help="write the report here")
    r.add_argument("--plot", type=Path, default=None, help="write its four panels here (PNG)")
    r.add_argument("--no-cuda-graphs", action="store_true", help="run every piece eagerly")
    r.add_argument("--overlap-rounds", action=argparse.BooleanOptionalAction, default=True,
                   help="launch each round before the previous one's tokens reach the host (their ids fed on the "
                        "device), so the host's work between rounds overlaps the GPU's; a replay finishes each "
                        "request by its trace's output length either way (default: on)")
    r.add_argument("--no-skinny-gemm", action="store_true",
                   help="every projection through cuBLAS (default on a GPU: up to 32 rows through skinny_linear)")
    r.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="start the clock at once: the first requests pay for compiling kernels and capturing steps "
                        "(by default a few short requests warm the engine up first, as a server does)")
    add_gil_switch_option(r)
    r.add_argument("--no-freeze-heap", dest="freeze_heap", action="store_false",
                   help="leave what the warm-up built collectable: full garbage collections walk all of it, pausing "
                        "the loop for up to hundreds of ms (by default it is frozen out of collection while serving)")
    r.add_argument("--device", type=device_name(allow_auto=True), default="auto",
                   help="cpu, cuda or cuda:N; auto = cuda when torch sees a GPU, else cpu")
    r.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    r.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    r.set_defaults(func=_replay, prog=r.prog)

    tb = sub.add_parser("replay-table", help="replay reports side by side (and plotted)",
                        description="Replay reports side by side: throughput (and its ratio to a vanilla run), "
                                    "TPOT p50/p99 per input length, GPU busy, recalls, m.")
    tb.add_argument("reports", nargs="+", type=Path, metavar="REPORT", help="replay --json files")
    tb.add_argument("--plot", type=Path, default=None, help="throughput over time and TPOT of every run (PNG)")
    tb.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    tb.set_defaults(func=_replay_table, prog=tb.prog)

    tg = sub.add_parser("replay-gaps", help="where the GPU stood idle in a replay's timelines",
                        description="Read the timelines replay --timeline-dir wrote: the GPU's idle time between the "
                                    "model's kernels, by gap length and by the kernels around them, the model's "
                                    "kernels by run time, the longest gaps with the host calls that overlap them "
                                    "most, the device waits for recalls against their publishes, each layer's "
                                    "window from its selection to its recall's wait, and what runs while no weight "
                                    "product does.")
    tg.add_argument("timelines", nargs="+", type=Path, metavar="PATH",
                    help="timeline files, or folders of them (rounds-*.json)")
    tg.add_argument("--longest", type=int_at_least(1), default=5, help="gaps listed a timeline (default: 5)")
    tg.add_argument("--boundaries", type=int_at_least(0), default=8,
                    help="kinds of boundary (the kernels around a gap) listed with their idle time (default: 8)")
    tg.add_argument("--kernels", type=int_at_least(0), default=12,
                    help="model kernels listed with their run time, and by their time while no weight product "
                         "runs (default: 12)")
    tg.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    tg.set_defaults(func=_replay_gaps, prog=tg.prog)


def _replay(args: argparse.Namespace) -> int:
    prog = args.prog
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:
            check_writable(prog, option, path)
    if args.timeline_dir is not None:
        check_writable(prog, "--timeline-dir", args.timeline_dir / "rounds-0-0.json")
        if args.gpu_busy_every == 0:
            raise UsageError(prog, "--timeline-dir writes the windows --gpu-busy-every profiles, and "
                                   "--gpu-busy-every 0 profiles none; give it a period (say 200)")
    config = _serving_config(prog, args)
    switch_s = gil_switch_s(prog, args.gil_switch_us)
    trace = open_trace(TraceOptions(args.trace, TraceFormat(args.format), args.seed, args.start, args.duration,
                                    args.requests, args.time_scale, args.max_input, args.max_output))
    device = require_device(prog, args.device)
    source = open_model(args.model, progress=progress_enabled(args.progress))
    for note in trace.notes:
        print(f"trace: {note}")
    print(f"trace: {trace.describe()}")
    say = _say(prog)
    options = ReplayOptions(device=device, clock=None if args.clock == "auto" else ClockKind(args.clock),
                            seed=args.seed, heads=args.heads, busy_every=args.gpu_busy_every,
                            use_cuda_graphs=not args.no_cuda_graphs, warmup=args.warmup,
                            timeline_dir=args.timeline_dir, skinny_gemm=not args.no_skinny_gemm,
                            locality_context=args.locality_context, gil_switch_s=switch_s,
                            freeze_heap=args.freeze_heap)
    bar = tqdm(total=len(trace), unit="req", desc=config.describe(), disable=not progress_enabled(args.progress),
               leave=False)
    status = StatusLines(len(trace), every_s=STATUS_EVERY_S) if bar.disable else None  # a log, where no bar shows

    def progress(done: int, info: dict) -> None:
        bar.update(done - bar.n)
        bar.set_postfix(info, refresh=False)
        if status is not None:
            status.update(done, info)

    try:
        report = replay(trace, source, config, options, progress=progress, say=say)
    finally:
        bar.close()
    print(table([report]))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot is not None:
        plot_run(report, args.plot)
        print(f"wrote {args.plot}")
    if args.timeline_dir is not None:
        written = sorted(args.timeline_dir.glob("rounds-*.json"))
        print(f"wrote {len(written)} timelines to {args.timeline_dir}" if written else
              f"wrote no timeline to {args.timeline_dir}: the replay ran fewer than --gpu-busy-every "
              f"{args.gpu_busy_every} rounds")
    return 0 if report["summary"]["complete"] else 1


STATUS_EVERY_S = 10.0


class StatusLines:
    """Where no progress bar is drawn (a log file, PULSEIO_NO_PROGRESS): one status line at most every
    `every_s` seconds of wall time, so a long replay's log shows how far it got."""

    def __init__(self, total: int, *, every_s: float, clock: Callable[[], float] = time.monotonic,
                 out: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        self.total, self.every_s, self._clock, self._out = total, every_s, clock, out
        self._start = self._last = clock()

    def update(self, done: int, info: dict) -> None:
        now = self._clock()
        if now - self._last < self.every_s and done < self.total:
            return
        self._last = now
        fields = " ".join(f"{key} {value}" for key, value in info.items())
        self._out(f"replay: {done}/{self.total} requests finished after {now - self._start:.0f} s wall; {fields}")


def _serving_config(prog: str, args: argparse.Namespace) -> ServingConfig:
    mode = ServeMode(args.mode)
    offload = mode in (ServeMode.OFFLOAD_SYNC, ServeMode.PULSEINFER)
    if args.no_irq and mode is not ServeMode.PULSEINFER:
        raise UsageError(prog, f"--no-irq turns pulseinfer's interleaving off; --mode {mode.value} does not "
                               "interleave")
    if args.host_kv_gib is not None and not offload:
        raise UsageError(prog, f"--host-kv-gib sizes the offload modes' host pool; --mode {mode.value} keeps no KV "
                               "on the host")
    for flag, value in (("--copier-ctas", args.copier_ctas), ("--copier-idle-us", args.copier_idle_us)):
        if value is not None and not offload:
            raise UsageError(prog, f"{flag} sets the offload modes' resident copier; --mode {mode.value} has none")
    if args.hot_cache != 1.0 and not offload:
        raise UsageError(prog, f"--hot-cache sizes the offload modes' hot sets; --mode {mode.value} offloads no "
                               "request")
    if args.ahead and mode is not ServeMode.PULSEINFER:
        raise UsageError(prog, f"--ahead recalls each layer's predicted blocks during the layer before, through "
                               f"pulseinfer's doorbell; --mode {mode.value} has no such recall")
    check_ahead_budget(prog, args.ahead, args.ahead_budget)
    if args.ahead and args.hot_cache <= 1.0:
        raise UsageError(prog, "--ahead recalls into the hot sets' spare entries: give --hot-cache above 1 (e.g. 1.5)")
    if args.selection is not None and mode is ServeMode.VANILLA:
        raise UsageError(prog, "--selection picks the sparse modes' selecting heads; vanilla attends densely")
    host = 0.0
    if offload:
        host = args.host_kv_gib if args.host_kv_gib is not None else _default_host_gib()
    try:
        return ServingConfig(mode, gpu_kv_bytes=int(args.gpu_kv_gib * 2**30), host_kv_bytes=int(host * 2**30),
                             offload_threshold=args.offload_threshold, irq=False if args.no_irq else None,
                             token_budget=args.token_budget,
                             selection=None if args.selection is None else SparseMode(args.selection),
                             max_batch=args.max_batch, max_offload_seqs=args.max_offload, gpu_ahead=args.gpu_ahead,
                             normal_steps=args.normal_steps,
                             copier_ctas=args.copier_ctas,
                             copier_idle_us=args.copier_idle_us, overlap_rounds=args.overlap_rounds,
                             two_streams=args.two_streams, hot_cache=args.hot_cache, halves=args.halves,
                             ride=args.ride, ahead=args.ahead, ahead_budget=args.ahead_budget)
    except ValueError as exc:
        raise UsageError(prog, str(exc)) from None


def _default_host_gib() -> float:
    free = memory_budget("cpu")
    return DEFAULT_HOST_GIB if free is None else min(DEFAULT_HOST_GIB, free.nbytes / 2 / 2**30)


def _replay_table(args: argparse.Namespace) -> int:
    if args.plot is not None:
        check_writable(args.prog, "--plot", args.plot)
    reports = [load_report(p) for p in args.reports]
    print(table(reports))
    if args.plot is not None:
        plot_compare(reports, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _replay_gaps(args: argparse.Namespace) -> int:
    files = []
    for path in args.timelines:
        found = sorted([*path.glob("rounds-*.json"), *path.glob("rounds-*.json.gz")], key=_first_round) \
            if path.is_dir() else [path]
        if not found or not all(f.is_file() for f in found):
            raise UsageError(args.prog, f"{path}: no timeline there (replay --timeline-dir writes rounds-*.json)")
        files += found
    windows = [read_window(f, longest=args.longest) for f in files]
    print(describe(windows, boundaries=args.boundaries, kernels=args.kernels))
    return 0


def _first_round(path: Path) -> tuple[int, str]:
    """Timelines in round order (`rounds-<first>-<last>.json`); a name without its numbers goes last."""
    first = path.stem.split("-")[1]
    return (int(first), path.name) if first.isdigit() else (sys.maxsize, path.name)


def _say(prog: str):  # noqa: ANN202
    def say(text: str) -> None:
        print(f"{prog.split()[0]}: {text}", file=sys.stderr)

    return say
