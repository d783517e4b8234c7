"""Open a trace from the command line's options: a file or a shipped sample, read or drawn, then windowed,
time-scaled and clipped, in that order (each step noted in `Trace.notes`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from importlib import resources
from pathlib import Path

from .mooncake import read_mooncake
from .records import Trace, TraceError
from .servegen import client_pairs, draw_requests, read_client
from .transform import clip_lengths, scale_time, take_window


class TraceFormat(Enum):
    """How a trace file is read (AUTO: by its name)."""

    AUTO = "auto"
    MOONCAKE = "mooncake"      # JSONL request records
    SERVEGEN = "servegen"      # a client's trace.csv + dataset.json, or a directory of clients


SAMPLES = {"mooncake-sample": "mooncake/conversation_trace_head400.jsonl",
           "servegen-sample": "servegen/deepseek-r1/chunk-3-trace.csv",     # one client: short prompts
           "servegen-mix": "servegen/deepseek-r1"}                          # clients 3, 15, 30: half of them long


def sample_path(name: str) -> Path:
    """A shipped sample's file (`pulseio_engine/data/traces`, with its source and licence in the README there)."""
    return Path(str(resources.files("pulseio_engine") / "data" / "traces" / SAMPLES[name]))


@dataclass(frozen=True)
class TraceOptions:
    """What to replay: `spec` is a path or a shipped sample's name (`SAMPLES`). The window (`start_s`,
    `duration_s`, `max_requests`) is taken first, in the trace's own time; then arrivals scale by
    `time_scale`; then lengths are clipped. ServeGen draws its requests in the window, with `seed`."""

    spec: str
    format: TraceFormat = TraceFormat.AUTO
    seed: int = 0
    start_s: float | None = None
    duration_s: float | None = None
    max_requests: int | None = None
    time_scale: float = 1.0
    max_input: int | None = None
    max_output: int | None = None

    def __post_init__(self) -> None:
        for name in ("start_s", "duration_s", "max_requests", "max_input", "max_output"):
            value = getattr(self, name)
            if value is not None and not value >= (0 if name == "start_s" else 1e-9):
                raise ValueError(f"TraceOptions.{name} must be {'>= 0' if name == 'start_s' else '> 0'}, "
                                 f"got {value!r}")
        if not self.time_scale > 0:
            raise ValueError(f"TraceOptions.time_scale must be > 0, got {self.time_scale!r}")


def open_trace(options: TraceOptions) -> Trace:
    """The requests `options` describe (see `TraceOptions`), each step from the file noted; raises TraceError
    naming the file and line of a bad record, or saying which step left no request."""
    path, source = _resolve(options.spec)
    fmt = options.format if options.format is not TraceFormat.AUTO else _guess(path)
    if fmt is TraceFormat.MOONCAKE:
        trace = read_mooncake(path, source=source)
        if options.start_s or options.duration_s is not None or options.max_requests is not None:
            trace = take_window(trace, start_s=options.start_s or 0.0, duration_s=options.duration_s,
                                max_requests=options.max_requests)
    else:
        clients = [read_client(csv, dataset) for csv, dataset in client_pairs(path)]
        trace = draw_requests(clients, seed=options.seed, start_s=options.start_s, duration_s=options.duration_s,
                              max_requests=options.max_requests, source=source)
    if options.time_scale != 1.0:
        trace = scale_time(trace, options.time_scale)
    if options.max_input is not None or options.max_output is not None:
        trace = clip_lengths(trace, max_input=options.max_input, max_output=options.max_output)
    if not trace.requests:
        raise TraceError(f"{source}: no requests left after: {'; '.join(trace.notes)}; widen the window")
    return trace


def _resolve(spec: str) -> tuple[Path, str]:
    if spec in SAMPLES and not Path(spec).exists():
        return sample_path(spec), f"{spec} (shipped: {SAMPLES[spec]})"
    path = Path(spec)
    if not path.exists():
        raise TraceError(f"--trace {spec}: no such file or directory; pass a Mooncake .jsonl, a ServeGen "
                         f"chunk-<client>-trace.csv or directory, or a shipped sample ({', '.join(SAMPLES)})")
    return path, str(path)


def _guess(path: Path) -> TraceFormat:
    if path.is_dir() or path.suffix == ".csv":
        return TraceFormat.SERVEGEN
    if path.suffix in (".jsonl", ".json"):
        return TraceFormat.MOONCAKE
    raise TraceError(f"{path}: cannot tell the format from the name; pass --format mooncake or servegen")
