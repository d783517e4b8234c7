"""ServeGen (alibaba/ServeGen): per-client distributions, from which requests are drawn, seeded.

ServeGen publishes no request records. Each client has a pair of files:

- `chunk-<c>-trace.csv`, no header, one line per 10-minute window:
  `window_start_s, rate, cv, pattern, shape, scale` (pattern Gamma or Weibull, empty for a window without
  requests; shape and scale in scipy's convention, seconds);
- `chunk-<c>-dataset.json`: per 6-hour window start, `input_tokens` and `output_tokens` PMFs, each a string
  holding a Python dict literal `{tokens: probability}`.

Drawing follows ServeGen's generator: per window with requests, n = ceil(rate x 600) gaps from the fitted
distribution, rescaled to sum to 600 s; arrivals are their cumulative sums inside the window; each arrival
takes its 6-hour window's PMFs and draws input and output lengths independently by inverse CDF. Clients are
merged and sorted. A bad line is an error naming the file and line (for the JSON, the line of its window).
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .records import Trace, TraceError, TraceRequest

WINDOW_S = 600            # arrival process windows
LENGTH_WINDOW_S = 21600   # length distribution windows
PATTERNS = ("Gamma", "Weibull")


@dataclass(frozen=True)
class ArrivalWindow:
    start_s: int
    rate: float              # requests/s
    pattern: str             # "Gamma", "Weibull" or "" (no requests)
    shape: float
    scale: float
    origin: str              # file name:line


@dataclass(frozen=True)
class LengthPMF:
    """A PMF over token counts: values ascending, cdf their cumulative probability (last = 1)."""

    values: np.ndarray       # [n] int64
    cdf: np.ndarray          # [n] float64

    def draw(self, u: np.ndarray) -> np.ndarray:
        """u: [k] uniforms in [0, 1) -> [k] int64 lengths (inverse CDF)."""
        return self.values[np.minimum(np.searchsorted(self.cdf, u, side="right"), len(self.values) - 1)]


@dataclass(frozen=True)
class Client:
    name: str                                        # "chunk-3"
    windows: tuple[ArrivalWindow, ...]
    lengths: dict[int, tuple[LengthPMF, LengthPMF]]  # 6-h window start -> (input, output); empty windows absent


def client_pairs(path: Path) -> list[tuple[Path, Path]]:
    """(trace.csv, dataset.json) pairs: of one `chunk-<c>-trace.csv` file, or of every client in a directory."""
    csvs = sorted(path.glob("chunk-*-trace.csv")) if path.is_dir() else [path]
    if not csvs:
        raise TraceError(f"{path}: no chunk-<client>-trace.csv files; a ServeGen directory holds pairs of "
                         "chunk-<client>-trace.csv and chunk-<client>-dataset.json")
    pairs = []
    for csv in csvs:
        if not csv.name.endswith("-trace.csv"):
            raise TraceError(f"{csv}: a ServeGen arrival file is named chunk-<client>-trace.csv")
        dataset = csv.with_name(csv.name.removesuffix("-trace.csv") + "-dataset.json")
        if not dataset.is_file():
            raise TraceError(f"{csv}: its length distributions {dataset} are missing; ServeGen ships each client's "
                             "trace.csv with its dataset.json")
        pairs.append((csv, dataset))
    return pairs


def read_client(csv: Path, dataset: Path) -> Client:
    return Client(csv.name.removesuffix("-trace.csv"), read_arrivals(csv), read_lengths(dataset))


def read_arrivals(path: Path) -> tuple[ArrivalWindow, ...]:
    windows: list[ArrivalWindow] = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().rstrip("\n").split("\n")
    for number, line in enumerate(lines, start=1):
        windows.append(_window(line, f"{path}:{number}", f"{path.name}:{number}"))
        if len(windows) > 1 and windows[-1].start_s <= windows[-2].start_s:
            raise TraceError(f"{path}:{number}: window start {windows[-1].start_s} s does not follow "
                             f"{windows[-2].start_s} s; windows are listed in time order")
    return tuple(windows)


def _window(line: str, where: str, origin: str) -> ArrivalWindow:
    cols = line.split(",")
    if len(cols) != 6:
        raise TraceError(f"{where}: {len(cols)} columns ({line[:80]!r}), expected 6: "
                         "window_start_s,rate,cv,pattern,shape,scale")
    try:
        start, rate, cv, shape, scale = float(cols[0]), float(cols[1]), float(cols[2]), float(cols[4]), float(cols[5])
    except ValueError:
        raise TraceError(f"{where}: a number is not a number in {line[:80]!r}; expected "
                         "window_start_s,rate,cv,pattern,shape,scale") from None
    pattern = cols[3].strip()
    if not all(math.isfinite(x) and x >= 0 for x in (start, rate, cv, shape, scale)) or start != int(start):
        raise TraceError(f"{where}: window start, rate, cv, shape and scale must be finite and >= 0 (the start "
                         f"whole seconds), got {line[:80]!r}")
    if pattern not in ("", *PATTERNS):
        raise TraceError(f"{where}: pattern {pattern!r}, expected one of {PATTERNS} or empty")
    if rate > 0 and (not pattern or shape <= 0 or scale <= 0):
        raise TraceError(f"{where}: rate {rate} req/s needs a pattern with shape and scale > 0, got {line[:80]!r}")
    return ArrivalWindow(int(start), rate, pattern, shape, scale, origin)


def read_lengths(path: Path) -> dict[int, tuple[LengthPMF, LengthPMF]]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise TraceError(f"{path}:1: a JSON {type(data).__name__}, expected an object keyed by 6-h window start")
    out = {}
    for key, fields in data.items():
        where = f"{path}:{_line_of(text, key)} (window {key!r})"
        if not key.isdigit() or int(key) % LENGTH_WINDOW_S:
            raise TraceError(f"{where}: window key must be a multiple of {LENGTH_WINDOW_S} s")
        if not isinstance(fields, dict) or not {"input_tokens", "output_tokens"} <= set(fields):
            raise TraceError(f"{where}: expected an object with input_tokens and output_tokens")
        pmfs = [_pmf(fields[name], f"{where} {name}") for name in ("input_tokens", "output_tokens")]
        if pmfs[0] is not None and pmfs[1] is not None:
            out[int(key)] = (pmfs[0], pmfs[1])
        elif (pmfs[0] is None) != (pmfs[1] is None):
            raise TraceError(f"{where}: one of input_tokens and output_tokens is empty and the other not")
    return out


def _line_of(text: str, key: str) -> int:
    match = re.search(rf'^\s*"{re.escape(key)}"\s*:', text, flags=re.M)
    return 1 if match is None else text.count("\n", 0, match.start()) + 1


def _pmf(literal: object, where: str) -> LengthPMF | None:
    """None for an empty PMF (a window without length data)."""
    try:
        pmf = ast.literal_eval(literal) if isinstance(literal, str) else None
    except (ValueError, SyntaxError):
        pmf = None
    if not isinstance(pmf, dict) or not all(isinstance(k, int) and k >= 0 and isinstance(p, (int, float)) and p >= 0
                                            for k, p in pmf.items()):
        raise TraceError(f"{where}: expected a string holding a dict literal {{tokens: probability}} with tokens "
                         f"and probabilities >= 0, got {str(literal)[:60]!r}")
    if not pmf:
        return None
    values = np.array(sorted(pmf), dtype=np.int64)
    cdf = np.cumsum([float(pmf[int(v)]) for v in values])
    if cdf[-1] <= 0:
        raise TraceError(f"{where}: probabilities sum to 0")
    return LengthPMF(values, cdf / cdf[-1])


def draw_requests(clients: list[Client], *, seed: int, start_s: float | None = None, duration_s: float | None = None,
                  max_requests: int | None = None, source: str) -> Trace:
    """Requests drawn from `clients` over [start, start + duration), times rebased so `start` is 0.
    start_s None: the first window in which some client has requests and length data. Drawing stops at the
    end of the duration or once `max_requests` are drawn (whole windows, then the earliest kept); with neither,
    one 10-minute window. Deterministic in `seed`: a window's draws depend only on the seed, the client and
    the window, never on which other windows were drawn."""
    start = _first_active(clients) if start_s is None else start_s
    if duration_s is None and max_requests is None:
        duration_s = WINDOW_S
    end = math.inf if duration_s is None else start + duration_s
    last = max((w.start_s for c in clients for w in c.windows), default=0) + WINDOW_S
    drawn: list[TraceRequest] = []
    dropped = zero = 0
    w0 = int(start // WINDOW_S) * WINDOW_S
    while w0 < min(end, last) and (max_requests is None or len(drawn) < max_requests):
        for index, client in enumerate(clients):
            got, lost, zeros = _draw_window(client, index, w0, seed, start, end)
            drawn.extend(got)
            dropped, zero = dropped + lost, zero + zeros
        w0 += WINDOW_S
    drawn.sort(key=lambda r: r.arrival_s)
    drawn = drawn[:max_requests] if max_requests is not None else drawn
    names = ", ".join(c.name for c in clients)
    span = "to the end" if end == math.inf else f"to {end:.0f} s"
    notes = [f"drew {len(drawn)} requests from ServeGen {names} (seed {seed}), from {start:.0f} s {span} of the "
             f"trace's day, times rebased to start at 0"]
    if max_requests is not None:
        notes[0] += f", the first {max_requests} kept"
    if dropped:
        notes.append(f"{dropped} arrivals fell in 6-hour windows without length data and were not drawn")
    if zero:
        notes.append(f"{zero} drawn lengths of 0 tokens were raised to 1")
    return Trace(tuple(drawn), source, "servegen", tuple(notes))


def _first_active(clients: list[Client]) -> float:
    starts = [w.start_s for c in clients for w in c.windows
              if w.rate > 0 and (w.start_s // LENGTH_WINDOW_S) * LENGTH_WINDOW_S in c.lengths]
    if not starts:
        raise TraceError(f"ServeGen clients {[c.name for c in clients]} have no window with requests and length data")
    return float(min(starts))


def _draw_window(client: Client, index: int, w0: int, seed: int, start: float, end: float
                 ) -> tuple[list[TraceRequest], int, int]:
    """-> (requests of client's window at w0 within [start, end), arrivals without length data, zero lengths)."""
    window = next((w for w in client.windows if w.start_s == w0), None)
    if window is None or window.rate <= 0:
        return [], 0, 0
    rng = np.random.default_rng([seed, index, w0])
    n = math.ceil(window.rate * WINDOW_S)
    if window.pattern == "Gamma":
        gaps = rng.gamma(window.shape, window.scale, n)
    else:
        gaps = window.scale * rng.weibull(window.shape, n)
    times = w0 + np.cumsum(gaps * (WINDOW_S / gaps.sum()))
    times = times[(times < w0 + WINDOW_S) & (times >= start) & (times < end)]
    pmfs = client.lengths.get((w0 // LENGTH_WINDOW_S) * LENGTH_WINDOW_S)
    if pmfs is None:
        return [], len(times), 0
    inputs, outputs = pmfs[0].draw(rng.random(len(times))), pmfs[1].draw(rng.random(len(times)))
    zeros = int((inputs == 0).sum() + (outputs == 0).sum())
    origin = f"{client.name} window {w0} s ({window.origin})"
    return [TraceRequest(float(t - start), max(1, int(i)), max(1, int(o)), origin)
            for t, i, o in zip(times, inputs, outputs)], 0, zeros
