"""Transformations of a `Trace`; each returns a new trace whose last note says what changed."""

from __future__ import annotations

from dataclasses import replace

from .records import Trace


def take_window(trace: Trace, *, start_s: float = 0.0, duration_s: float | None = None,
                max_requests: int | None = None) -> Trace:
    """The requests arriving in [start_s, start_s + duration_s), at most the first `max_requests`, their
    arrivals rebased so `start_s` is 0."""
    end = float("inf") if duration_s is None else start_s + duration_s
    kept = [r for r in trace.requests if start_s <= r.arrival_s < end][:max_requests]
    rebased = tuple(replace(r, arrival_s=r.arrival_s - start_s) for r in kept)
    until = "the end" if duration_s is None else f"{end:g} s"
    first = "" if max_requests is None else f", the first {max_requests}"
    return trace.with_requests(rebased, f"window from {start_s:g} s to {until}{first}: {len(kept)} of {len(trace)} "
                                        f"requests kept, times rebased to start at 0")


def scale_time(trace: Trace, factor: float) -> Trace:
    """Arrival times multiplied by `factor` (< 1: the same requests arrive faster)."""
    if not factor > 0:
        raise ValueError(f"a time scale must be > 0, got {factor!r}")
    scaled = tuple(replace(r, arrival_s=r.arrival_s * factor) for r in trace.requests)
    return trace.with_requests(scaled, f"arrival times x{factor:g}: span {trace.span_s:.1f} s -> "
                                       f"{trace.span_s * factor:.1f} s")


def clip_lengths(trace: Trace, *, max_input: int | None = None, max_output: int | None = None) -> Trace:
    """Input and output lengths cut to at most `max_input` / `max_output` tokens."""
    out = trace
    for field, limit in (("input_len", max_input), ("output_len", max_output)):
        if limit is None:
            continue
        if limit < 1:
            raise ValueError(f"a length limit must be >= 1, got {limit!r}")
        cut = sum(getattr(r, field) > limit for r in out.requests)
        clipped = tuple(replace(r, **{field: min(getattr(r, field), limit)}) for r in out.requests)
        what = "input" if field == "input_len" else "output"
        out = out.with_requests(clipped, f"{what} lengths clipped to {limit:,} tokens: {cut} of {len(out)} "
                                         "requests shortened")
    return out
