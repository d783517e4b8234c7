"""IRQ, the inner scheduler: the normal and the offload batch's decode steps interleaved layer by layer.

Layer boundaries are the switch points. The offload batch runs a piece, which ends where its layer's recall
is posted (not waited for); then the normal batch runs its next pieces until that recall has landed, at most
an even share of the normal pieces left per offload piece left, then the offload batch runs its next piece
(the layer's attention over the recalled blocks, on to the next recall). The share keeps the normal batch
from running out half-way: on a GPU the host decides ahead of the device, before a recall could have landed,
so without it every early recall took two normal pieces and the later ones none. Each batch keeps its own
state between pieces (layer, activations, metadata: `BatchState` and the step graph's buffers), so either
can pause after any piece.

Detection is semi-synchronous: at each boundary the host checks, never waiting, whether the recall has
landed (`PendingRecall.landed_nowait`, set by pulseio's completion thread from the copier's word in host
memory); it makes the device wait for it (`wait_device`) only when the recall's share of normal pieces ran.
Without a sync nothing tells the host where the GPU is, so on a GPU a `Pacer` keeps the host at most
`ahead` pieces in front of it (events it polls): a decision to run one more normal piece is made while the
GPU is still busy, not long before, when the recall could not have landed yet. `m` counts the normal
pieces run per offload recall; its distribution is the run's record of how much recall time was hidden.

With `StreamPair` (`ServingConfig.two_streams`) the two batches' pieces go to two CUDA streams, the offload
batch's at high priority and the normal batch's at low, both forked from the current stream at the round's
start and joined back at its end. The host still decides as above; the device then runs a normal piece already
enqueued wherever the offload stream stands still (a device wait for a recall, the switch between two pieces'
graphs, a kernel's tail), instead of only at the place the host put it in one stream's order.

`halves` (`ServingConfig.halves`) runs the offload batch as two halves, the normal requests riding in the first
half's step (`StepRiders`): their pieces alternate, so each half's recall flies while the other half computes,
and a round reads the weights twice, as IRQ's does.

`coupled` runs the same batches without interleaving: each whole step, recalls waited for as they come
(the --no-irq and offload-sync baselines).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from .batches import DecodeBatch


class Pacer:
    """Keeps the host at most `ahead` pieces in front of the device: an event after each piece, polled."""

    def __init__(self, ahead: int, nap_s: float = 10e-6) -> None:
        self.ahead, self.nap_s = ahead, nap_s
        self._events = [torch.cuda.Event() for _ in range(ahead + 2)]
        self._launched = 0
        self.waited_s = 0.0          # in `wait_room`, summed

    def launched(self) -> None:
        self._events[self._launched % len(self._events)].record()
        self._launched += 1

    def has_room(self) -> bool:
        """True once the device has finished all but the last `ahead` pieces launched."""
        back = self._launched - self.ahead
        return back <= 0 or self._events[(back - 1) % len(self._events)].query()

    def wait_room(self, until: Callable[[], bool]) -> None:
        """Poll (napping, GIL released) until there is room or `until()` holds."""
        t0 = time.perf_counter()
        while not self.has_room() and not until():
            time.sleep(self.nap_s)
        self.waited_s += time.perf_counter() - t0


class NoPacer:
    """On a CPU the host is the device: every piece has finished when its call returns."""

    waited_s = 0.0

    def launched(self) -> None:
        pass

    def has_room(self) -> bool:
        return True

    def wait_room(self, until: Callable[[], bool]) -> None:
        pass


class StreamPair:
    """The offload batch's stream (high priority) and the normal batch's (low) of IRQ rounds on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.offload = torch.cuda.Stream(device, priority=-1)
        self.normal = torch.cuda.Stream(device, priority=0)

    def on(self, batch: str) -> contextlib.AbstractContextManager:
        """Enqueue on `batch`'s ("offload" or "normal") stream."""
        return torch.cuda.stream(getattr(self, batch))

    @contextlib.contextmanager
    def forked(self) -> Iterator[None]:
        """Both streams start after the work enqueued so far on the current one (the round's inputs), and the
        current one continues after both (the round's tokens): events only, no host sync."""
        main = torch.cuda.current_stream(self.offload.device)
        self.offload.wait_stream(main)
        self.normal.wait_stream(main)
        try:
            yield
        finally:
            main.wait_stream(self.offload)
            main.wait_stream(self.normal)


@dataclass
class InterleaveStatistics:
    """What IRQ did: per offload recall, the normal pieces run while it was in flight (`m`), and how it ended."""

    m: Counter[int] = field(default_factory=Counter)
    seen_landed: int = 0       # recalls the host saw land before the normal batch ran out of pieces
    device_waits: int = 0      # recalls the offload batch then waited for on the device

    @property
    def recalls(self) -> int:
        return self.seen_landed + self.device_waits


class InnerScheduler:
    """Runs one round: a decode step of each batch present, interleaved (`interleave`) or not (`coupled`)."""

    def __init__(self, pacer: Pacer | NoPacer, streams: StreamPair | None = None) -> None:
        self.pacer, self.streams = pacer, streams
        self.stats = InterleaveStatistics()

    def interleave(self, normal: DecodeBatch | None, offload: DecodeBatch | None) -> None:
        """Both batches split in pieces (see the module doc)."""
        with self.streams.forked() if self.streams is not None else contextlib.nullcontext():
            self._interleave(normal, offload)

    def _on(self, batch: str) -> contextlib.AbstractContextManager:
        """Enqueue on `batch`'s stream of the pair, or on the current stream without one."""
        return contextlib.nullcontext() if self.streams is None else self.streams.on(batch)

    def _interleave(self, normal: DecodeBatch | None, offload: DecodeBatch | None) -> None:
        pacer, nxt = self.pacer, 0
        last = 0 if normal is None else normal.num_pieces
        pieces = 0 if offload is None else offload.num_pieces

        def run_normal(piece: int) -> None:
            with self._on("normal"):
                normal.run_piece(piece)                         # type: ignore[union-attr]
                pacer.launched()

        for piece in range(pieces):
            with self._on("offload"):
                pending = offload.run_piece(piece)              # type: ignore[union-attr]
                pacer.launched()
            if pending is None:
                continue
            share = -(-(last - nxt) // (pieces - piece))        # this recall's even share of the normal pieces left
            m = 0
            while nxt < last and m < share and not pending.landed_nowait():
                if not pacer.has_room():
                    pacer.wait_room(until=pending.landed_nowait)
                    continue
                run_normal(nxt)
                nxt, m = nxt + 1, m + 1
            if pending.landed_nowait():
                self.stats.seen_landed += 1
            else:
                with self._on("offload"):
                    pending.wait_device()
                self.stats.device_waits += 1
            self.stats.m[m] += 1
        while nxt < last:
            run_normal(nxt)
            nxt += 1

    def halves(self, first: DecodeBatch, second: DecodeBatch) -> None:
        """Two halves of the offload batch (the normal requests riding in `first`), their pieces alternating: each
        half's piece runs while the other's recall flies, and before a half's next piece its own recall is waited
        for on the device unless the host saw it land (`OffloadStepGraph.run_piece`)."""
        assert first.num_pieces == second.num_pieces, "the halves of one batch have as many pieces"
        for piece in range(first.num_pieces):          # no pacing: the host decides nothing from where the GPU is
            first.run_piece(piece)
            second.run_piece(piece)

    def coupled(self, *batches: DecodeBatch | None) -> None:
        """Each batch's whole step in turn, in the order given, its recalls waited for as they come."""
        for batch in batches:
            if batch is None:
                continue
            for piece in range(batch.num_pieces):
                pending = batch.run_piece(piece)
                if pending is not None:
                    pending.wait_device()
