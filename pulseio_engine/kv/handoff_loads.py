"""Handed-in KV loaded beside the decode steps, not before them.

An offload request's handed-in KV goes to the host pool over the bus (`Offloader.load_handoff`): ~100 ms for a
16K-token prompt of a 14B model. Loaded in stream order, every decode step enqueued after it waits that long, and
the running requests stall. `HandoffLoads` runs each load on a stream of its own instead (after the work already
enqueued, whose tensors it may read), and tells at step boundaries, without blocking, which loads have landed: a
request decodes from the first step after its load landed. Where nothing else can run, `take` makes the model's
stream wait on the device for a load instead.

Without a CUDA device a load runs at once: `start` says it is not in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch


class Landing(Protocol):
    """A load's end, as `torch.cuda.Event` tells it."""

    def query(self) -> bool:
        """Whether the load has finished (never blocks)."""
        ...

    def wait(self, stream: torch.cuda.Stream | None = None) -> None:
        """Make the work enqueued next on `stream` wait on the device for the load."""
        ...


@dataclass(frozen=True)
class HandoffLoadStatistics:
    """Loads run beside the steps: found landed at a step boundary (their requests sat steps out, nothing waited),
    and waited for on the device (nothing else would run, or the request left). Loads run at once (a CPU) count in
    neither."""

    landed: int
    waited: int


class HandoffLoads:
    """The loads in flight, by request id (see the module doc)."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._events: dict[int, Landing] = {}
        self._landed = self._waited = 0

    def start(self, request_id: int, load: Callable[[], None]) -> bool:
        """Run `load` (its kernels) after the work enqueued so far on the current stream, beside what comes next;
        -> whether it is in flight (False: it ran here, on the CPU)."""
        landing = self._launch(load)
        if landing is not None:
            self._events[request_id] = landing
        return landing is not None

    def _launch(self, load: Callable[[], None]) -> Landing | None:
        if self.stream is None:
            load()
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            load()
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._events

    def landed_nowait(self) -> list[int]:
        """The requests whose loads have finished (never blocks); each is forgotten, the current stream ordered
        after its load."""
        done = [rid for rid, event in self._events.items() if event.query()]
        for rid in done:
            self._forget(rid)
        self._landed += len(done)
        return done

    def take(self, request_id: int) -> None:
        """Forget a request's load, the current stream waiting on the device for it to finish (no host wait)."""
        self._forget(request_id)
        self._waited += 1

    def statistics(self) -> HandoffLoadStatistics:
        return HandoffLoadStatistics(self._landed, self._waited)

    def _forget(self, request_id: int) -> None:
        stream = None if self.stream is None else torch.cuda.current_stream(self.stream.device)
        self._events.pop(request_id).wait(stream)
