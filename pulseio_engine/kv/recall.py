"""Carry out one layer's recall plan through a `pulseio.Runtime`: a handful of calls, no per-block loop.

The plan's rows are padded; `compact` packs the needed (host unit, device slot) pairs first, in
fixed-size tensors, and counts them on the device. Then:

- DOORBELL: `post_recall(host_ids=ids, device_slots=slots, count=count)` publishes ids and count as they lie (decided on
  the device: no host sync), and `device_wait()` orders the layer's attention after the copy. `recall` does
  both; `post` only publishes and hands back a `PendingRecall`, whose `landed_nowait()` says (never waiting)
  whether the data is in place and whose `wait_device()` is the device wait, for a caller that runs other
  work meanwhile (the serving loop's IRQ: another batch's layers while this recall lands). A request
  that fails later (pulseio's watchdog lets a stream go on unwritten slots rather than hang) is only known
  once the step is over: `check_landed`, called when the step's tokens reach the host, raises for it.
  Captured in a CUDA graph (`captures`), the same publish and wait are `pulseio.RecallGraph` posts, and
  `arm` is the host's whole part of a replay's recalls.
- SYNC (the ArkVale-like baseline): the count and ids come to the host (a device sync), the host
  calls `recall(host_ids=, device_slots=)` and waits for it before the layer goes on.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import pulseio

from ..config import RecallMode
from ..errors import EngineError


class RecallError(EngineError, RuntimeError):
    """A recall did not land (pulseio reported it failed, or it timed out)."""


AHEAD_TAG = 1 << 30   # in a recall's tag beside its layer: a recall ahead (`OffloadConfig.ahead`), counted apart
FLIGHT_SAMPLE_EVERY = 8     # `check_landed` samples the recalls of one step in this many (`RecallFlights`)
FLIGHT_KINDS = ("own", "ahead")  # the flights sampled apart: a layer's own recalls, and those ahead of it
FLIGHT_SAMPLES = 4096       # the latencies a `RecallFlights` keeps, the last ones


@dataclass
class RecallFlights:
    """Sampled doorbell recalls of one kind, a layer's own or ahead of it, that carry the copier's device stamps
    (RESIDENT): how many, their bytes, how many landed early (every copy CTA copied its part from the ids mirror
    before the task came, which is when a captured device wait ends), and on the device's clock publish -> landed
    early and publish -> landed by the task, over the last FLIGHT_SAMPLES. pulseio's statistics mix both kinds;
    a layer's own recall is the one its attention waits for."""

    stamped: int = 0
    nbytes: int = 0
    landed_early: int = 0
    to_early_ns: deque[int] = field(default_factory=lambda: deque(maxlen=FLIGHT_SAMPLES))
    to_landed_ns: deque[int] = field(default_factory=lambda: deque(maxlen=FLIGHT_SAMPLES))

    def add(self, done: Any) -> None:
        """A landed recall's Completion; one without both device stamps is not counted."""
        published, landed = done.published_ns, done.landed_ns
        if published is None or landed is None:
            return
        self.stamped += 1
        self.nbytes += done.nbytes or 0
        self.to_landed_ns.append(landed - published)
        if done.early_landed_ns is not None:
            self.landed_early += 1
            self.to_early_ns.append(done.early_landed_ns - published)

    def summary(self) -> dict:
        """The counters, and each latency as a `pulseio.LatencySummary` (as pulseio's own statistics give them)."""
        return {"stamped": self.stamped, "bytes": self.nbytes, "landed_early": self.landed_early,
                "publish_to_early_landed": pulseio.LatencySummary.of(list(self.to_early_ns)),
                "publish_to_landed": pulseio.LatencySummary.of(list(self.to_landed_ns))}


def tag_name(tag: int | None) -> str:
    """What a recall's tag says in messages: 'layer 7', 'layer 7 (ahead)', or 'no layer' (untagged)."""
    if tag is None:
        return "no layer"
    return f"layer {tag & ~AHEAD_TAG}" + (" (ahead)" if tag & AHEAD_TAG else "")


def compact(host_units: torch.Tensor, slots: torch.Tensor, need: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """host_units, slots: [R, K] int64; need: [R, K] bool -> (ids [R*K], dst [R*K], count [1]) int64
    with the needed pairs first, in row order."""
    order = torch.argsort((~need).reshape(-1).long(), stable=True)       # [R*K]
    return (host_units.reshape(-1)[order].contiguous(), slots.reshape(-1)[order].contiguous(),
            need.sum().reshape(1))


class Recaller:
    def __init__(self, runtime: Any, mode: RecallMode, *, timeout_s: float = 30.0) -> None:
        """runtime: an open `pulseio.Runtime` whose pools hold the host units and hot slots."""
        self.runtime = runtime
        self.mode = mode
        self.timeout_s = timeout_s
        self.blocked_ns = 0      # main-thread time spent waiting: sync's ids and copies, a doorbell's full ring
        self.ahead_bytes = 0     # bytes the doorbell recalls tagged AHEAD_TAG moved, as check_landed saw them land
        self.flights = {kind: RecallFlights() for kind in FLIGHT_KINDS}     # one step in FLIGHT_SAMPLE_EVERY's
        self._checks = 0
        self._posted: list[tuple[int | None, Any]] = []     # (tag, completion) of doorbell recalls since check_landed

    def reset_flights(self) -> None:
        """Sample the flights from zero again (`flights`)."""
        self.flights = {kind: RecallFlights() for kind in self.flights}

    @property
    def captures(self) -> bool:
        """Whether a CUDA graph can hold this recaller's recalls (doorbell recalls on a GPU runtime)."""
        return self.mode is RecallMode.DOORBELL and self.runtime.backend.device.type == "cuda"

    def recall_graph(self) -> Any:
        """A `pulseio.RecallGraph` to capture a step's recalls into (see `captures`)."""
        return self.runtime.recall_graph()

    def arm(self, recalls: Any) -> list[Any]:
        """Before a replay of a graph holding `recalls`: their Completions, watched by `check_landed`. Waits
        (counted in blocked_ns) only when the ring or the outstanding requests have no room for them."""
        try:
            done = recalls.arm_nowait()
        except pulseio.WouldBlock:
            start = time.perf_counter_ns()
            done = recalls.arm(timeout=self.timeout_s)
            self.blocked_ns += time.perf_counter_ns() - start
        self._posted.extend((c.tag, c) for c in done)
        return done

    def recall(self, ids: torch.Tensor, dst: torch.Tensor, count: torch.Tensor, *, tag: int) -> Any:
        """Copy host units ids[:count] to device slots dst[:count] (from `compact`); returns once later
        device work sees them, with the request's pulseio handle (None: nothing to copy).
        ids, dst: [N] int64, count: [1] int64, on the model's device."""
        return self.post(ids, dst, count, tag=tag).wait_device()

    def post(self, ids: torch.Tensor, dst: torch.Tensor, count: torch.Tensor, *, tag: int) -> PendingRecall:
        """Start the recall of `recall` and return without the device wait: DOORBELL publishes it (waiting only
        when the ring or the outstanding requests are full, counted in blocked_ns); SYNC carries it out whole
        (its pending recall has landed). The buffers must not change until `wait_device`."""
        if self.mode is not RecallMode.DOORBELL:
            return PendingRecall(self._sync(ids, dst, count, tag), tag)
        try:
            done = self.runtime.post_recall_nowait(host_ids=ids, device_slots=dst, count=count, tag=tag)
        except pulseio.WouldBlock:
            start = time.perf_counter_ns()
            done = self.runtime.post_recall(host_ids=ids, device_slots=dst, count=count, tag=tag,
                                            timeout=self.timeout_s)
            self.blocked_ns += time.perf_counter_ns() - start
        self._posted.append((tag, done))
        return PendingRecall(done, tag, waiter=done.device_wait)

    def check_landed(self) -> None:
        """After a step's results reached the host: raise RecallError if a doorbell recall since the last
        check failed (its layer attended slots that were not written). One whose completion pulseio has not
        marked yet (its data is in place: the step is over) is looked at again next time. Counts the bytes of those
        recalled ahead (`ahead_bytes`), and samples the flights of one call's recalls in FLIGHT_SAMPLE_EVERY
        (`flights`)."""
        pending, failed = [], []
        self._checks += 1
        sample = self._checks % FLIGHT_SAMPLE_EVERY == 0
        for tag, done in self._posted:
            if not done.done():
                pending.append((tag, done))
            elif (error := done.exception()) is not None:
                failed.append((tag, error))
            else:
                ahead = tag is not None and (tag & AHEAD_TAG) != 0
                if ahead:
                    self.ahead_bytes += done.nbytes or 0
                if sample:
                    self.flights["ahead" if ahead else "own"].add(done)
        self._posted = pending
        if failed:
            tag, error = failed[0]
            raise RecallError(f"{len(failed)} recalls of this step failed, so its output is wrong; the first, "
                              f"for {tag_name(tag)}: {error}") from error

    def _sync(self, ids: torch.Tensor, dst: torch.Tensor, count: torch.Tensor, tag: int) -> Any:
        """Waits for the ids (a device sync) and for the copy (counted in blocked_ns)."""
        start = time.perf_counter_ns()
        try:
            return self._sync_wait(ids, dst, count, tag)
        finally:
            self.blocked_ns += time.perf_counter_ns() - start

    def _sync_wait(self, ids: torch.Tensor, dst: torch.Tensor, count: torch.Tensor, tag: int) -> Any:
        n = int(count)                                     # the baseline's sync: ids go to the host
        if n == 0:
            return None
        done = self.runtime.recall(host_ids=ids[:n].cpu(), device_slots=dst[:n].cpu(), tag=tag)
        try:
            done.wait(self.timeout_s)
        except pulseio.WaitTimeout as exc:
            raise RecallError(f"a synchronous recall of {n} units for {tag_name(tag)} did not land within "
                              f"{self.timeout_s} s") from exc
        except pulseio.PulseError as exc:
            raise RecallError(f"the recall for {tag_name(tag)} failed: {exc}") from exc
        return done


class PendingRecall:
    """One layer's recall, posted and not yet waited for on the device (`Recaller.post`, or a captured
    publish of `OffloadStepGraph`'s pieces). `landed_nowait()` never waits; `wait_device()` orders later work
    on the current stream after the data (once; a recall that failed raises RecallError there)."""

    __slots__ = ("handle", "tag", "_waiter", "_waited")

    def __init__(self, handle: Any, tag: int, *, waiter: Callable[[], object] | None = None) -> None:
        """handle: the pulseio Completion (None: nothing to copy); waiter: its device wait (None: none needed)."""
        self.handle, self.tag, self._waiter, self._waited = handle, tag, waiter, waiter is None

    def landed_nowait(self) -> bool:
        """True once the data is in place or the recall failed (`wait_device` then raises). Never waits."""
        return self.handle is None or self.handle.done()

    def wait_device(self) -> Any:
        """Later device work sees the data; returns the pulseio handle. A device wait, not a host one (on the
        CPU backend the host waits). Raises the request's pulseio error if it had failed by the wait, and
        RecallError if it had failed by the time the wait returns (as `Recaller.recall` always has)."""
        if not self._waited:
            self._waited = True
            self._waiter()                     # type: ignore[misc]  # raises a request that failed already
        done = self.handle
        if done is not None and done.done() and done.exception() is not None:
            raise RecallError(f"the recall for {tag_name(self.tag)} failed: {done.exception()}") from done.exception()
        return done
