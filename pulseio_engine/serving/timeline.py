"""Where the GPU stands idle in a replay's timelines (`replay --timeline-dir`), and what the host did meanwhile.

A timeline is one window of rounds as a Chrome trace: the GPU's kernels and the host's calls on one clock. The
GPU is busy where a model kernel runs (not a copy, nor pulseio's copier or device waits: as in `BusyMeter`); every
stretch between them is a gap. Gaps are summed by length (a few microseconds between two kernels of one graph,
tens between graphs, hundreds and more where the host did not keep the GPU fed), and the longest are listed
with the host calls that overlap them most: the main thread's `record_function` ranges and torch ops, and
whatever else the profiler recorded (a `cudaGraphLaunch`, a `cudaStreamSynchronize`). Gaps are also summed by
the model kernels on either side of them, with the pulseio kernels that ran inside (a device wait, a publish):
the same pair of kernels once a layer or once a round says which boundary loses the time. The busy time is summed
by kernel name too, which says what the GPU spends its rounds on. Last, each device wait
for a recall is read against the publish before it: how long the recall took as the stream saw it, how much of
that the model's kernels filled (under IRQ, the other batch's pieces) and how long the GPU stood idle in the wait;
and each layer's own recall from its publish: how long the selection that planned it and the publish ran, when the
main chain reached its wait, when the recall landed. Then the main chain between two weight products where it
attends (a layer's attention section: norms, store, selection, the wait for its recall, attention), by what fills it:
the layer's time that is not its weights. Last, the time no weight product runs on any stream, by what runs then:
what a round costs beyond reading the weights, which decode reads once a step however it attends.
"""

from __future__ import annotations

import gzip
import heapq
import json
import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .gpu_busy import idle_gaps, is_pulseio_kernel

BUCKETS_US = (10.0, 100.0, 1000.0)          # gap lengths: < 10 us, < 100 us, < 1 ms, longer
DEVICE_WAITS = ("wait_seq", "wait_word")    # pulseio's kernels that hold a stream until a recall has landed
WEIGHT_PRODUCTS = ("gemm", "nvjet", "cutlass", "xmma", "splitkreduce")   # the projections' kernels, by name (lower)
ATTENTION = ("_paged_decode", "attn", "attention", "flash")              # attention kernels, by name (lower case)
IDLE = "(no kernel)"                        # `_outside_weights`' name for time with nothing running


@dataclass(frozen=True)
class Gap:
    """One stretch with no model kernel on the GPU, in microseconds of the trace's clock."""

    start_us: float
    end_us: float
    host: tuple[tuple[str, float], ...]      # the host calls overlapping it most: (name, microseconds of overlap)

    @property
    def us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class Boundary:
    """Idle time at one kind of boundary: between the model kernels `before` and `after`, with `inside` the
    pulseio kernels that ran in those gaps ('' if none)."""

    before: str
    after: str
    inside: str


@dataclass(frozen=True)
class RecallWait:
    """One device wait for a recall, from the start of the publish before it: `recall_us` to the wait's end (the
    recall as the stream saw it), `work_us` of it with a model kernel running before the wait began, `idle_us` of
    the wait with none; `chain_us` from the wait's end to the next publish's start (under IRQ, the offload
    batch's own piece before its next recall), None after the window's last publish."""

    recall_us: float
    work_us: float
    idle_us: float
    chain_us: float | None = None


@dataclass(frozen=True)
class Section:
    """The main chain from the end of one weight product to the start of the next, where it attends: its length,
    and the microseconds of each kernel on the chain in it by `kernel_name` (device waits among them); what they
    leave of `us` the chain stood idle."""

    us: float
    parts: tuple[tuple[str, float], ...]

    @property
    def idle_us(self) -> float:
        return self.us - sum(us for _, us in self.parts)


@dataclass(frozen=True)
class WindowGaps:
    """One timeline: its span from the first model kernel's start to the last one's end, and its gaps."""

    path: Path
    start_us: float
    span_us: float
    gaps: tuple[Gap, ...]                    # longest first; the first `listed` with their host calls
    listed: int
    boundaries: dict[Boundary, tuple[float, int]]     # idle microseconds and gaps, by the kernels around them
    recalls: tuple[RecallWait, ...] = ()              # the device waits with a publish before them, in order
    kernels: dict[str, tuple[float, int]] = field(default_factory=dict)   # model kernels' us and launches, by name
    windows: tuple[tuple[float, float, float, float], ...] = ()   # `_recall_windows` (us): select, publish, wait
    sections: tuple[Section, ...] = ()                 # `_attention_sections`, in order
    outside: dict[str, float] = field(default_factory=dict)   # `_outside_weights`: us by kernel name, IDLE

    @property
    def idle_us(self) -> float:
        return sum(g.us for g in self.gaps)

    def idle_by_length(self) -> list[float]:
        """Idle microseconds in gaps shorter than each of `BUCKETS_US`, and in longer ones (the last)."""
        sums = [0.0] * (len(BUCKETS_US) + 1)
        for g in self.gaps:
            sums[next((i for i, top in enumerate(BUCKETS_US) if g.us < top), len(BUCKETS_US))] += g.us
        return sums


def _is_weight_product(name: str) -> bool:
    """A projection's kernel (`WEIGHT_PRODUCTS`), by its name."""
    low = name.lower()
    return any(w in low for w in WEIGHT_PRODUCTS)


def _is_copier(name: str) -> bool:
    """pulseio's resident copier, which runs throughout a window: no part of a gap, a stretch or a boundary."""
    return "resident_copy" in name


def kernel_name(name: str) -> str:
    """A kernel's name without its template and argument lists or namespaces, cut to 40 characters."""
    return re.split(r"[(<\[]", name.removeprefix("void "), maxsplit=1)[0].strip().rsplit("::", 1)[-1][:40]


def read_window(path: Path, *, longest: int = 5, top_host: int = 3) -> WindowGaps:
    """The gaps of one timeline (a Chrome trace `BusyMeter` wrote, gzipped if its name ends in .gz); the
    `longest` of them with their `top_host` host calls (a window has thousands of short gaps and host calls: only
    the listed ones are matched)."""
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    events = [e for e in json.loads(text)["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    kernels = [(float(e["ts"]), float(e["ts"]) + float(e["dur"]), str(e["name"])) for e in events
               if e.get("cat") == "kernel"]
    streams = [e.get("args", {}).get("stream") for e in events if e.get("cat") == "kernel"]
    copies = [(float(e["ts"]), float(e["ts"]) + float(e["dur"]), str(e["name"]).split(" ", 1)[0]) for e in events
              if str(e.get("cat", "")) in ("gpu_memset", "gpu_memcpy")]
    model = [(lo, hi) for lo, hi, name in kernels if not is_pulseio_kernel(name)]
    if not model:
        return WindowGaps(path, 0.0, 0.0, (), 0, {})
    start, end = min(lo for lo, _ in model), max(hi for _, hi in model)
    chain = _main_chain(kernels, streams)
    ordered = idle_gaps(model, start, end)
    gaps = sorted(ordered, key=lambda g: g[0] - g[1])                                    # longest first
    listed = gaps[:longest]
    overlap: list[defaultdict[str, float]] = [defaultdict(float) for _ in listed]   # name -> us of overlap
    for e in events:
        cat = str(e.get("cat", ""))
        if cat in ("kernel", "Trace") or cat.startswith("gpu_"):       # the GPU's own rows, the profiler's own
            continue
        h_lo, h_hi = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        for (lo, hi), counts in zip(listed, overlap, strict=True):
            if h_lo < hi and h_hi > lo:
                counts[str(e["name"])] += min(hi, h_hi) - max(lo, h_lo)
    found = [Gap(lo, hi, tuple(heapq.nlargest(top_host, c.items(), key=lambda kv: kv[1])))   # as most_common
             for (lo, hi), c in zip(listed, overlap, strict=True)]
    return WindowGaps(path, start, end - start, (*found, *(Gap(lo, hi, ()) for lo, hi in gaps[longest:])),
                      len(listed), _boundaries(kernels, gaps, copies), _recall_waits(kernels, ordered),
                      _by_kernel(kernels), _recall_windows(kernels, chain), _attention_sections(chain),
                      _outside_weights(kernels, start, end))


def _by_kernel(kernels: list[tuple[float, float, str]]) -> dict[str, tuple[float, int]]:
    """The model kernels' run time and launches, by `kernel_name` (overlapping kernels each count in full)."""
    out: dict[str, tuple[float, int]] = {}
    for lo, hi, name in kernels:
        if not is_pulseio_kernel(name):
            us, n = out.get(kernel_name(name), (0.0, 0))
            out[kernel_name(name)] = (us + hi - lo, n + 1)
    return out


def _outside_weights(kernels: list[tuple[float, float, str]], start: float, end: float) -> dict[str, float]:
    """The microseconds of [start, end] in which no weight product (`WEIGHT_PRODUCTS`) runs on any stream, by what
    runs then: each stretch shared evenly among the kernels running in it (by `kernel_name`; pulseio's copier, which
    runs throughout, left out; its device waits and publishes in), `IDLE` where none runs."""
    edges = []                                 # (time, 0 = an end / 1 = a start, is a weight product, name)
    for lo, hi, name in kernels:
        if _is_copier(name) or hi <= start or lo >= end:
            continue
        weight = _is_weight_product(name)
        short = kernel_name(name)
        edges += [(max(lo, start), 1, weight, short), (min(hi, end), 0, weight, short)]
    out: defaultdict[str, float] = defaultdict(float)
    weights = 0                                # weight products running
    running: defaultdict[str, int] = defaultdict(int)   # other kernels running, by name
    last = start
    for t, starts, weight, short in sorted(edges):            # ends before starts at one instant
        if t > last and not weights:
            n = sum(running.values())
            for name, k in running.items():
                out[name] += (t - last) * k / n
            if not n:
                out[IDLE] += t - last
        last = max(last, t)
        step = 1 if starts else -1
        if weight:
            weights += step
        else:
            running[short] += step
            if not running[short]:
                del running[short]
    if end > last:
        out[IDLE] += end - last
    return dict(out)


def _recall_waits(kernels: list[tuple[float, float, str]],
                  ordered: list[tuple[float, float]]) -> tuple[RecallWait, ...]:
    """Each device wait against the latest publish that started before it (`ordered`: the idle gaps in order)."""
    publishes = sorted(lo for lo, _, name in kernels if "publish_kernel" in name)
    starts = [lo for lo, _ in ordered]

    def idle(a: float, b: float) -> float:                 # idle time within [a, b]
        i = max(0, bisect_left(starts, a) - 1)
        total = 0.0
        while i < len(ordered) and ordered[i][0] < b:
            total += max(0.0, min(b, ordered[i][1]) - max(a, ordered[i][0]))
            i += 1
        return total

    out = []
    for lo, hi, name in sorted(kernels):
        i = bisect_left(publishes, lo)
        if i == 0 or not any(w in name for w in DEVICE_WAITS):
            continue
        published = publishes[i - 1]
        after = bisect_left(publishes, hi)
        chain = publishes[after] - hi if after < len(publishes) else None
        out.append(RecallWait(hi - published, (lo - published) - idle(published, lo), idle(lo, hi), chain))
    return tuple(out)


def _main_chain(kernels: list[tuple[float, float, str]], streams: list[object]) -> list[tuple[float, float, str]]:
    """The kernels of the stream running the most model-kernel time, in order (pulseio's device waits on it too)."""
    busy: defaultdict[object, float] = defaultdict(float)
    for (lo, hi, name), stream in zip(kernels, streams, strict=True):
        if not is_pulseio_kernel(name):
            busy[stream] += hi - lo
    if not busy:
        return []
    main = max(busy, key=busy.__getitem__)
    return sorted(k for k, stream in zip(kernels, streams, strict=True) if stream == main)


def _stretches(chain: list[tuple[float, float, str]]
               ) -> list[tuple[float, float, float, list[tuple[float, float, str]]]]:
    """The main chain (`_main_chain`'s kernels) cut at its runs of weight products (`WEIGHT_PRODUCTS`): each stretch
    between two runs with an attention kernel (`ATTENTION`) in it -> (where the opening run began, where it ended,
    where the closing run begins, the chain's kernels in between). The copier's kernel runs throughout and is no part
    of a stretch."""
    out = []
    run_start: float | None = None
    opened = 0.0
    in_run = False
    inside: list[tuple[float, float, str]] = []
    for lo, hi, name in chain:
        if _is_copier(name):
            continue
        if _is_weight_product(name):
            if not in_run:
                if run_start is not None and any(a in kernel_name(n).lower() for _, _, n in inside for a in ATTENTION):
                    out.append((run_start, opened, lo, inside))
                run_start, in_run, inside = lo, True, []
            opened = hi
        else:
            in_run = False
            inside.append((lo, hi, name))
    return out


def _attention_sections(chain: list[tuple[float, float, str]]) -> tuple[Section, ...]:
    """Each of the main chain's attention stretches (`_stretches`), from the end of the weight product before it to
    the start of the one after, by the kernels that ran on the chain there."""
    out = []
    for _, opened, closed, inside in _stretches(chain):
        parts: defaultdict[str, float] = defaultdict(float)
        for k_lo, k_hi, k_name in inside:
            parts[kernel_name(k_name)] += min(k_hi, closed) - max(k_lo, opened)
        out.append(Section(closed - opened, tuple(parts.items())))
    return tuple(out)


def _recall_windows(kernels: list[tuple[float, float, str]],
                    chain: list[tuple[float, float, str]]) -> tuple[tuple[float, float, float, float], ...]:
    """A layer's window for its own recall: in each attention stretch of the main chain (`_stretches`; `chain`:
    `_main_chain`'s kernels, the stream running the most model-kernel time), the last device wait, against the first
    publish that started once the run of weight products opening the stretch had begun (the layer's own: its recall
    ahead of the next layer is posted after it, on the same stream, and a recall ahead of this layer came during the
    layer before) and the selection, on any stream, that ended last before that publish (the one that planned it) ->
    (us that selection ran, us the publish ran, us from the publish's start to the wait's start, to the wait's end):
    what the recall waits for, what runs beside it and when it lands. Anchored on the stretch rather than on a
    selection on the chain, it reads a layer whose selection ran on a graph branch as one whose selection ran on the
    chain; a stretch whose waits come with no publish since it opened (a recall ahead alone) is none."""
    publishes = sorted((lo, hi) for lo, hi, name in kernels if "publish_kernel" in name)
    starts = [lo for lo, _ in publishes]
    selections = sorted((hi, lo) for lo, hi, name in kernels if "_select_kernel" in name)
    ends = [hi for hi, _ in selections]
    out = []
    for run_start, _, _, inside in _stretches(chain):
        waits = [(lo, hi) for lo, hi, name in inside if any(w in name for w in DEVICE_WAITS)]
        window = _own_window(publishes, starts, selections, ends, run_start, waits[-1]) if waits else None
        if window is not None:
            out.append(window)
    return tuple(sorted(out, key=lambda w: w[3]))


def _own_window(publishes: list[tuple[float, float]], starts: list[float], selections: list[tuple[float, float]],
                ends: list[float], opened: float, wait: tuple[float, float]
                ) -> tuple[float, float, float, float] | None:
    """`_recall_windows`' window of the wait (lo, hi) in a stretch opened at `opened`, or None without a publish
    between the two or a selection before that publish."""
    i = bisect_left(starts, opened)
    if i == len(starts) or starts[i] > wait[0]:
        return None
    j = bisect_right(ends, starts[i])                       # selections that ended by the publish's start
    if not j:
        return None
    (p_lo, p_hi), (s_hi, s_lo) = publishes[i], selections[j - 1]
    return s_hi - s_lo, p_hi - p_lo, wait[0] - p_lo, wait[1] - p_lo


def _boundaries(kernels: list[tuple[float, float, str]], gaps: list[tuple[float, float]],
                copies: list[tuple[float, float, str]]) -> dict[Boundary, tuple[float, int]]:
    """Each gap by the model kernel that ended where it starts and the one that starts where it ends, with the
    pulseio kernels and the copies and memsets (`copies`) that ran inside it."""
    ended, started = {}, {}
    for lo, hi, name in kernels:
        if not is_pulseio_kernel(name):
            ended[hi] = started[lo] = kernel_name(name)
    inside = sorted([(lo, hi, kernel_name(name)) for lo, hi, name in kernels if is_pulseio_kernel(name)
                     and not _is_copier(name)] + copies)        # the copier runs throughout: not a boundary's
    starts = [lo for lo, _, _ in inside]
    longest = max((hi - lo for lo, hi, _ in inside), default=0.0)
    out: dict[Boundary, tuple[float, int]] = {}
    for lo, hi in gaps:      # what overlaps [lo, hi) starts before hi, and after lo - longest (it ends after lo)
        ran = {name for p_lo, p_hi, name in inside[bisect_left(starts, lo - longest):bisect_left(starts, hi)]
               if p_hi > lo}
        key = Boundary(ended.get(lo, "?"), started.get(hi, "?"), " + ".join(sorted(ran)))
        us, n = out.get(key, (0.0, 0))
        out[key] = (us + hi - lo, n + 1)
    return out


def describe(windows: list[WindowGaps], *, boundaries: int = 8, kernels: int = 12) -> str:
    """A table of the windows' idle time by gap length, then the `boundaries` kinds of boundary losing the most
    over all windows, the `kernels` model kernels running longest, then each window's listed gaps with their host
    calls."""
    head = ["< 10 us", "10-100 us", "0.1-1 ms", ">= 1 ms"]
    lines = [f"{'timeline':<28} {'span ms':>8} {'busy':>6}  idle ms in gaps of " + " / ".join(head)]
    for w in windows:
        if not w.span_us:
            lines.append(f"{w.path.name:<28} no GPU kernel in it (a CPU run: the host's calls only)")
            continue
        busy = 1.0 - w.idle_us / w.span_us
        parts = " / ".join(f"{us / 1e3:.2f}" for us in w.idle_by_length())
        lines.append(f"{w.path.name:<28} {w.span_us / 1e3:>8.2f} {busy:>6.1%}  {parts}")
    total: dict[Boundary, tuple[float, int]] = {}
    for w in windows:
        for key, (us, n) in w.boundaries.items():
            t_us, t_n = total.get(key, (0.0, 0))
            total[key] = (t_us + us, t_n + n)
    span = sum(w.span_us for w in windows)
    if total and boundaries:
        lines.append(f"\nidle by the model kernels around it, over {span / 1e3:.1f} ms of timeline "
                     f"(the {boundaries} boundaries losing most)")
        lines.append(f"  {'idle ms':>8} {'share':>6} {'gaps':>6} {'mean us':>8}  "
                     "before -> after [pulseio kernels, copies inside]")
        for key, (us, n) in sorted(total.items(), key=lambda kv: -kv[1][0])[:boundaries]:
            inside = f" [{key.inside}]" if key.inside else ""
            lines.append(f"  {us / 1e3:>8.2f} {us / span:>6.1%} {n:>6} {us / n:>8.1f}  "
                         f"{key.before} -> {key.after}{inside}")
    lines.extend(_describe_kernels(windows, span, kernels))
    lines.extend(_describe_recalls(windows, span))
    lines.extend(_describe_sections(windows, kernels))
    lines.extend(_describe_outside(windows, span, kernels))
    for w in windows:
        if not w.listed:
            continue
        lines.append(f"\n{w.path.name}: the longest gaps")
        for g in w.gaps[:w.listed]:
            calls = ", ".join(f"{name} {us:.0f} us" for name, us in g.host) or "no host call recorded"
            lines.append(f"  {g.us:>9.1f} us at +{(g.start_us - w.start_us) / 1e3:.2f} ms: {calls}")
    return "\n".join(lines)


def _describe_kernels(windows: list[WindowGaps], span_us: float, top: int) -> list[str]:
    """The `top` model kernels by run time over all windows, with their share of the timeline."""
    total: dict[str, tuple[float, int]] = {}
    for w in windows:
        for name, (us, n) in w.kernels.items():
            t_us, t_n = total.get(name, (0.0, 0))
            total[name] = (t_us + us, t_n + n)
    if not total or not top:
        return []
    ran = sum(us for us, _ in total.values())
    lines = [f"\nthe model's kernels by run time, over {span_us / 1e3:.1f} ms of timeline ({ran / 1e3:.1f} ms of "
             f"kernels, {sum(n for _, n in total.values())} launches; the {top} longest)",
             f"  {'run ms':>8} {'share':>6} {'launches':>8} {'mean us':>8}  kernel"]
    for name, (us, n) in sorted(total.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {us / 1e3:>8.2f} {us / span_us:>6.1%} {n:>8} {us / n:>8.1f}  {name}")
    return lines


def _describe_recalls(windows: list[WindowGaps], span_us: float) -> list[str]:
    """The device waits for recalls: how many, the idle inside them, their p50 / p90 of each part over all windows and
    of the layers' own recalls (`_recall_windows`), then each window's p50s (a window is a few rounds: the batches of
    one stretch of the run)."""
    recalls = [r for w in windows for r in w.recalls]
    if not recalls:
        return []
    selections = [s for w in windows for s in w.windows]

    def parts(rs: list[RecallWait]) -> list[list[float]]:
        chains = [r.chain_us for r in rs if r.chain_us is not None]
        return [[r.recall_us for r in rs], [r.work_us for r in rs], [r.idle_us for r in rs], chains or [np.nan]]

    names = ("publish -> the wait's end", "the model's kernels in between", "idle in the wait",
             "the wait's end -> the next publish")
    idle = sum(r.idle_us for r in recalls)
    lines = [f"\ndevice waits for recalls: {len(recalls)}, idle inside them {idle / 1e3:.2f} ms "
             f"({idle / span_us:.1%} of the timeline)",
             "  per wait, p50 / p90 us: " + "; ".join("{} {:.1f} / {:.1f}".format(name, *np.percentile(v, [50, 90]))
                                                      for name, v in zip(names, parts(recalls), strict=True)),
             f"  {'timeline':<28} {'waits':>6}  p50 us: " + " / ".join(names)]
    if selections:
        chose, ran, start, end = (np.percentile([s[i] for s in selections], [50, 90]) for i in range(4))
        lines.insert(2, "  a layer's own recall, from its publish's start to the last wait where the main chain "
                        f"attends, p50 / p90 us: the selection before it ran {chose[0]:.1f} / {chose[1]:.1f}, "
                        f"the publish {ran[0]:.1f} / {ran[1]:.1f}, the chain waits from {start[0]:.1f} / "
                        f"{start[1]:.1f}, the recall landed at {end[0]:.1f} / {end[1]:.1f} ({len(selections)} "
                        "windows)")
    for w in windows:
        if w.recalls:
            p50 = " / ".join(f"{np.percentile(v, 50):.1f}" for v in parts(list(w.recalls)))
            lines.append(f"  {w.path.name:<28} {len(w.recalls):>6}  {p50}")
    return lines


def _describe_sections(windows: list[WindowGaps], top: int) -> list[str]:
    """The attention sections of the main chain (`_attention_sections`) over all windows: how many, their p50 / p90 /
    mean, and what fills one on average, the `top` largest kernels and the chain's idle time."""
    sections = [s for w in windows for s in w.sections]
    if not sections or not top:
        return []
    lengths = [s.us for s in sections]
    p50, p90 = np.percentile(lengths, [50, 90])
    parts: defaultdict[str, float] = defaultdict(float)
    for s in sections:
        for name, us in s.parts:
            parts[name] += us
    n = len(sections)
    lines = [f"\nthe main chain between weight products where it attends: {n} stretches, p50 / p90 / mean "
             f"{p50:.1f} / {p90:.1f} / {np.mean(lengths):.1f} us; what fills one, mean us (the {top} largest):"]
    for name, us in sorted(parts.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {us / n:>8.1f}  {name}")
    lines.append(f"  {sum(s.idle_us for s in sections) / n:>8.1f}  (the chain idle)")
    return lines


def _describe_outside(windows: list[WindowGaps], span_us: float, top: int) -> list[str]:
    """The time no weight product runs (`_outside_weights`) over all windows: its share of the timeline, a round's
    mean where the windows' names say their rounds (`rounds-A-B`), and the `top` kernels filling it."""
    total: defaultdict[str, float] = defaultdict(float)
    for w in windows:
        for name, us in w.outside.items():
            total[name] += us
    if not total or not top:
        return []
    outside = sum(total.values())
    spans = [re.search(r"rounds-(\d+)-(\d+)", w.path.name) for w in windows]
    rounds = sum(int(m[2]) - int(m[1]) + 1 for m in spans if m) if all(spans) else 0
    per = f", {outside / rounds / 1e3:.2f} ms a round of {span_us / rounds / 1e3:.2f}" if rounds else ""
    lines = [f"\nno weight product running: {outside / 1e3:.1f} ms of {span_us / 1e3:.1f} ({outside / span_us:.1%}"
             f"{per}); what runs then, kernels running at once sharing it evenly (the {top} largest):",
             f"  {'ms':>8} {'share':>6}  kernel"]
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {us / 1e3:>8.2f} {us / outside:>6.1%}  {name}")
    return lines
