"""What a serving user measures, recorded as a replay runs. No torch.

Per request: arrival, admission (its class then), the time of each round that gave it a token, finish.
TPOT of a request is (last token - first token) / (tokens - 1), the time between its tokens while it
decodes (the first token's wait, in the queue and in the round that admitted it, is not part of it: this is
the decode instance of a disaggregated deployment, and its first token came with the handed-in KV). TPOT
is summarised per input-length bucket (p50, p99 over requests). Throughput is output tokens over the
replay's span; over time, in bins. Rounds record the batch sizes; the host's resident memory is sampled.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

BUCKETS = (("<8K", 0, 8192), ("8K-32K", 8192, 32768), (">=32K", 32768, None))


def bucket_of(input_len: int) -> str:
    for name, lo, hi in BUCKETS:
        if input_len >= lo and (hi is None or input_len < hi):
            return name
    raise AssertionError(input_len)


@dataclass
class RequestRecord:
    rid: int
    arrival_s: float
    input_len: int
    output_len: int
    origin: str
    kv_class: str | None = None        # at admission
    admitted_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finished_s: float | None = None
    tokens: int = 0
    moves: int = 0

    @property
    def tpot_s(self) -> float | None:
        if self.tokens < 2 or self.first_token_s is None or self.last_token_s is None:
            return None
        return (self.last_token_s - self.first_token_s) / (self.tokens - 1)

    def to_dict(self) -> dict:
        tpot = self.tpot_s
        return {"id": self.rid, "arrival_s": self.arrival_s, "input_len": self.input_len,
                "output_len": self.output_len, "origin": self.origin, "class": self.kv_class,
                "admitted_s": self.admitted_s, "first_token_s": self.first_token_s, "finished_s": self.finished_s,
                "tokens": self.tokens, "moves": self.moves, "tpot_ms": None if tpot is None else tpot * 1e3}


@dataclass(frozen=True)
class RoundSample:
    t_s: float            # the round's end, replay clock
    dt_s: float           # its duration
    normal: int           # batch sizes
    offload: int
    tokens: int           # tokens it produced
    gc_s: float = 0.0     # garbage collections' pauses since the round before (wall time)


class Recorder:
    """Everything the replay's report needs, fed as it runs (see the module doc)."""

    def __init__(self) -> None:
        self.requests: dict[int, RequestRecord] = {}
        self.rounds: list[RoundSample] = []
        self.rss: list[tuple[float, int]] = []          # (t, bytes) samples of the host's resident memory
        self.busy: float | None = None                    # the GPU's busy fraction (gpu_busy.py), None on a CPU
        self.idle_s = 0.0                                 # waiting for arrivals with no request to serve

    def arrived(self, rid: int, arrival_s: float, input_len: int, output_len: int, origin: str) -> None:
        self.requests[rid] = RequestRecord(rid, arrival_s, input_len, output_len, origin)

    def admitted(self, rid: int, t: float, kv_class: str) -> None:
        record = self.requests[rid]
        record.admitted_s, record.kv_class = t, kv_class

    def moved(self, rid: int) -> None:
        self.requests[rid].moves += 1

    def round(self, t: float, dt: float, normal: int, offload: int, produced: dict[int, int],
              finished: dict[int, tuple[int, ...]], *, gc_s: float = 0.0) -> None:
        for rid, n in produced.items():
            record = self.requests[rid]
            if record.first_token_s is None:
                record.first_token_s = t
            record.last_token_s = t
            record.tokens += n
        for rid in finished:
            self.requests[rid].finished_s = t
        self.rounds.append(RoundSample(t, dt, normal, offload, sum(produced.values()), gc_s))

    def sample_rss(self, t: float) -> None:
        rss = resident_bytes()
        if rss is not None:
            self.rss.append((t, rss))

    # ---- summaries -----------------------------------------------------------------------------------

    def tpot_by_bucket(self) -> dict[str, dict]:
        """bucket (and "all") -> {"requests", "p50_ms", "p99_ms", "mean_ms"} over requests with >= 2 tokens."""
        groups: dict[str, list[float]] = {name: [] for name, _, _ in BUCKETS}
        for r in self.requests.values():
            if r.tpot_s is not None:
                groups[bucket_of(r.input_len)].append(r.tpot_s * 1e3)
        groups["all"] = [x for name, _, _ in BUCKETS for x in groups[name]]
        return {name: _spread(values) for name, values in groups.items()}

    def span_s(self) -> float:
        """First arrival to last token."""
        ends = [r.finished_s for r in self.requests.values() if r.finished_s is not None]
        starts = [r.arrival_s for r in self.requests.values()]
        return max(ends) - min(starts) if ends and starts else 0.0

    def timeline(self, bins: int = 200) -> dict[str, list[float]]:
        """Throughput (tokens/s) and mean batch sizes in `bins` equal time bins, and the RSS samples."""
        if not self.rounds:
            return {"t_s": [], "throughput_tok_s": [], "normal_batch": [], "offload_batch": [], "rss_t_s": [],
                    "rss_bytes": []}
        end = self.rounds[-1].t_s
        width = max(end / bins, 1e-3)
        n = int(np.ceil(end / width)) or 1
        tokens, busy, normal, offload = (np.zeros(n) for _ in range(4))
        for r in self.rounds:
            i = min(int(r.t_s / width), n - 1)
            tokens[i] += r.tokens
            busy[i] += r.dt_s
            normal[i] += r.normal * r.dt_s
            offload[i] += r.offload * r.dt_s
        weight = np.where(busy > 0, busy, 1.0)
        return {"t_s": [round(float((i + 1) * width), 6) for i in range(n)],
                "throughput_tok_s": [float(x) for x in tokens / width],
                "normal_batch": [float(x) for x in normal / weight],
                "offload_batch": [float(x) for x in offload / weight],
                "rss_t_s": [t for t, _ in self.rss], "rss_bytes": [b for _, b in self.rss]}

    def longest_gaps(self, n: int = 8) -> list[dict]:
        """The `n` longest stretches between two rounds' ends, longest first: where the replay ended each (`t_s`), its
        length, the round's own run inside it, the garbage collections' pauses inside it and the requests admitted
        and finished in it. A stretch far longer than its round is the host's (admission, a collection, a wait)."""
        gaps = sorted(range(1, len(self.rounds)), key=lambda i: self.rounds[i].t_s - self.rounds[i - 1].t_s,
                      reverse=True)[:n]
        events = [(q.admitted_s, q.finished_s) for q in self.requests.values()]
        out = []
        for i in gaps:
            before, r = self.rounds[i - 1].t_s, self.rounds[i]
            out.append({"t_s": r.t_s, "gap_ms": (r.t_s - before) * 1e3, "round_ms": r.dt_s * 1e3,
                        "gc_ms": r.gc_s * 1e3,
                        "admitted": sum(a is not None and before < a <= r.t_s for a, _ in events),
                        "finished": sum(f is not None and before < f <= r.t_s for _, f in events)})
        return out

    def batch_histogram(self) -> dict[str, dict[str, int]]:
        """class -> batch size -> rounds."""
        out = {}
        for name, pick in (("normal", lambda r: r.normal), ("offload", lambda r: r.offload)):
            out[name] = {str(k): v for k, v in sorted(Counter(pick(r) for r in self.rounds).items())}
        return out


def _spread(values: list[float]) -> dict:
    if not values:
        return {"requests": 0, "p50_ms": None, "p99_ms": None, "mean_ms": None}
    a = np.asarray(values)
    return {"requests": len(values), "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "mean_ms": float(a.mean())}


def counter_mean(counts: Counter[int]) -> float | None:
    """The mean of the values a Counter counts (value -> times), None when it counts nothing."""
    total = sum(counts.values())
    return sum(value * times for value, times in counts.items()) / total if total else None


def m_summary(m: Counter[int], seen_landed: int, device_waits: int) -> dict:
    """IRQ's m (normal layers run per offload recall, over the rounds where both batches decode; an offload batch
    alone runs its whole step): its histogram, mean and p50/p99, and how recalls ended."""
    total = sum(m.values())
    values = np.repeat(np.array(sorted(m), dtype=float), [m[k] for k in sorted(m)]) if total else np.zeros(0)
    return {"recalls": total, "histogram": {str(k): m[k] for k in sorted(m)},
            "mean": counter_mean(m),
            "p50": float(np.percentile(values, 50)) if total else None,
            "p99": float(np.percentile(values, 99)) if total else None,
            "seen_landed": seen_landed, "device_waits": device_waits}


def resident_bytes() -> int | None:
    """This process's resident memory (Linux /proc), or None."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    import resource

    return pages * resource.getpagesize()
