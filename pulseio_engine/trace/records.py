"""A serving trace: requests with an arrival time, a prompt length and an output length. No torch.

A `Trace` is immutable; every transformation (`transform.py`) returns a new one with a note that says what
it did, so a replay can print exactly what it ran. Each request keeps its `origin` (file:line, or the
ServeGen client and window it was drawn from) so a result can be traced back to the input.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import EngineError


class TraceError(EngineError, ValueError):
    """A trace file that cannot be read: the message names the file and line, what was found and what was
    expected."""


@dataclass(frozen=True)
class TraceRequest:
    """One request: it arrives at `arrival_s` with `input_len` prompt tokens and decodes `output_len` tokens."""

    arrival_s: float
    input_len: int
    output_len: int
    origin: str          # "conversation_trace.jsonl:12", or "chunk-3 window 6600 s"


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival, where they came from, and the transformations applied, in order."""

    requests: tuple[TraceRequest, ...]
    source: str                     # what was read: a path, a shipped sample's name
    format: str                     # "mooncake" or "servegen"
    notes: tuple[str, ...] = ()     # one line per step from the file to these requests

    def __post_init__(self) -> None:
        times = [r.arrival_s for r in self.requests]
        if times != sorted(times):
            raise ValueError("Trace.requests must be sorted by arrival_s (this is a bug in pulseio_engine)")

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def span_s(self) -> float:
        """Seconds from the first arrival to the last (0 for fewer than two requests)."""
        return self.requests[-1].arrival_s - self.requests[0].arrival_s if self.requests else 0.0

    def with_requests(self, requests: tuple[TraceRequest, ...], note: str) -> Trace:
        return replace(self, requests=requests, notes=(*self.notes, note))

    def describe(self) -> str:
        """One line: how many requests, over how long, and their lengths (p50 / max)."""
        if not self.requests:
            return f"{self.source}: no requests"
        ins = sorted(r.input_len for r in self.requests)
        outs = sorted(r.output_len for r in self.requests)
        return (f"{len(self)} requests over {self.span_s:.1f} s; input p50 {ins[len(ins) // 2]:,} max {ins[-1]:,}, "
                f"output p50 {outs[len(outs) // 2]:,} max {outs[-1]:,} tokens")
