"""One engine's decode step as pieces the inner scheduler runs in order, and its tokens on their way to the host.

A `DecodeBatch` is one step of one engine's running requests: dense (vanilla: the paged decode graph, one
piece) or sparse (`OffloadStepGraph`: whole, one piece, or split per layer for IRQ, each piece ending at a
layer's planned recall). Split and captured, it may be several steps of the same requests, one after the
other: between two, each row's greedy token is fed back and its position moved on, on the device (their KV
blocks are reserved for their whole output), so the host learns the tokens of all of them at once.
Sampling is greedy, on the device. `HostTokens` brings the step's tokens to the
host without a sync: a non-blocking copy into pinned memory and an event the host polls (with short sleeps,
so pulseio's threads get the GIL meanwhile) instead of synchronizing on it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from ..engine import Engine
from ..kv.recall import PendingRecall
from ..offload_graph import OffloadStepGraph
from ..request import Sequence
from ..upload import to_device_nowait


@dataclass(frozen=True)
class TokenFeed:
    """A step's input ids that are still on the device: row `rows[i]` takes `source[index[i]]` (each [n] int64 on
    the device; `source`: the previous round's greedy tokens), applied after the step's inputs are uploaded."""

    rows: torch.Tensor
    source: torch.Tensor
    index: torch.Tensor

    @classmethod
    def upload(cls, rows: list[int], source: torch.Tensor, index: list[int]) -> TokenFeed:
        """`rows` and `index` sent to `source`'s device in one copy without a host sync (`to_device_nowait`: a
        blocking copy to a GPU waits for the stream, that is for the round in flight)."""
        both = to_device_nowait(torch.tensor(rows + index, dtype=torch.int64), source.device)
        return cls(both[:len(rows)], source, both[len(rows):])

    def __call__(self, input_ids: torch.Tensor) -> None:
        input_ids.index_copy_(0, self.rows, self.source.index_select(0, self.index))


class DecodeBatch:
    """One decode step of `seqs` on `engine`, in `num_pieces` pieces (see the module doc)."""

    def __init__(self, engine: Engine, seqs: Seq[Sequence], *, split: bool, steps: int = 1,
                 feed: TokenFeed | None = None, graph: OffloadStepGraph | None = None,
                 rider_feed: TokenFeed | None = None) -> None:
        """Build it before any batch of the round runs: a split step due for capture is captured here.
        `steps`: decode steps of these requests to run in a row (each must have that many tokens left); a step
        that is not split, or still runs eagerly before its capture on a GPU (`warming`), runs one. `feed`: the
        input ids still on the device (an overlapped round), put in place after the upload. `graph`: the step
        graph, its inputs uploaded (a half of `ModelRunner.offload_halves`; one step); default the engine's own.
        `rider_feed`: its riders' input ids still on the device, the rows counted from the riders' first (the
        tokens then hold the riders' after the batch's own)."""
        self.engine, self.seqs, self.split, self._feed = engine, tuple(seqs), split, feed
        off = engine.offloader
        if graph is None and off is not None:
            graph = engine.runner.offload_step(self.seqs, off, split=split)
        assert graph is None or graph.riders is None or steps == 1, "a step with riders is one step"
        self.graph = graph
        if self.graph is not None and feed is not None:
            feed(self.graph.input_ids)
        if self.graph is not None and rider_feed is not None:
            rider_feed(self.graph.input_ids[len(self.seqs):])
        step_pieces = self.graph.num_pieces if self.graph is not None and split else 1
        if self.graph is not None and split:
            self.graph.prepare_split()
        self.steps = steps if self.graph is not None and split and not self.warming else 1
        self._step_pieces, self.num_pieces = step_pieces, step_pieces * self.steps
        self._fed: torch.Tensor | None = None       # [steps - 1, B] the tokens fed back between steps
        if self.steps > 1:
            self._fed = torch.empty((self.steps - 1, self.size), dtype=torch.int64, device=engine.model.device)
        self._tokens: torch.Tensor | None = None
        self._last = False

    @property
    def warming(self) -> bool:
        """A split step on a GPU that runs eagerly (its batch's first): its kernels may be launched for the first
        time, and a first launch waits for every running kernel, a copier pinned to a later recall included.
        Such a step must not run inside another batch's armed step (see `ServingEngine.step`)."""
        g = self.graph
        return g is not None and self.split and g.capture and not g.captured

    @property
    def size(self) -> int:
        return len(self.seqs)

    def run_piece(self, piece: int) -> PendingRecall | None:
        """Enqueue piece `piece` (in order, 0 first); -> the recall it posted, not waited for (split only)."""
        graph = self.graph
        if graph is None:
            self._tokens = self.engine.runner.decode_nowait(self.seqs, self._feed)
            return None
        if not self.split:
            self._tokens = graph.run().argmax(dim=-1)
            return None
        step, part = divmod(piece, self._step_pieces)
        if part == 0 and step > 0:
            graph.advance_nowait()                      # the previous step's tokens in, positions on
            self._fed[step - 1].copy_(graph.input_ids)  # type: ignore[index]
        pending = graph.run_piece(part)
        self._last = piece == self.num_pieces - 1
        return pending

    def tokens_nowait(self) -> torch.Tensor:
        """[steps * B] int64 greedy tokens on the device, step by step, once the last piece ran (split: the last
        step's argmax is enqueued now, after both batches' steps, so no kernel of it runs inside the other
        batch's step)."""
        if self._tokens is None and self._last and self.graph is not None and self.graph.logits is not None:
            last = self.graph.logits.argmax(dim=-1)
            self._tokens = last if self._fed is None else torch.cat([self._fed.flatten(), last])
        if self._tokens is None:
            raise RuntimeError("the step's last piece has not run (this is a bug in pulseio_engine)")
        return self._tokens


class ClassTokens:
    """One class's requests in a round run as halves (`InnerScheduler.halves`) or as one step with riders
    (`ServingConfig.ride`), as `launch` and `collect` see a batch: their engine, their sequences, and their tokens,
    slices of the steps' (rows [start, stop) of each listed batch's tokens, in order)."""

    steps = 1
    warming = False

    def __init__(self, engine: Engine, seqs: Seq[Sequence], parts: Seq[tuple[DecodeBatch, int, int]]) -> None:
        self.engine, self.seqs, self._parts = engine, tuple(seqs), tuple(parts)
        self._tokens: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return len(self.seqs)

    def tokens_nowait(self) -> torch.Tensor:
        """[B] int64 greedy tokens on the device, once the steps' last pieces ran (gathered once)."""
        if self._tokens is None:
            slices = [batch.tokens_nowait()[start:stop] for batch, start, stop in self._parts]
            self._tokens = slices[0] if len(slices) == 1 else torch.cat(slices)
        return self._tokens


class HostTokens:
    """A step's tokens copied to the host without a host sync (see the module doc). `pinned` [>= B] int64 is
    reused step after step: the caller reads it (`wait_list`) before the next copy into it."""

    def __init__(self, tokens: torch.Tensor, pinned: torch.Tensor | None) -> None:
        self._n = tokens.shape[0]
        self._event: torch.cuda.Event | None = None
        if tokens.is_cuda:
            assert pinned is not None and pinned.is_pinned()
            pinned[:self._n].copy_(tokens, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            self._host = pinned
        else:
            self._host = tokens.clone()      # the step's buffer may be a graph's, which the next step overwrites

    def wait_list(self, nap_s: float = 20e-6) -> list[int]:
        """The tokens, once the copy has run: polls the event (never synchronizes on it)."""
        if self._event is not None:
            while not self._event.query():
                time.sleep(nap_s)
        return self._host[:self._n].tolist()


def pinned_tokens(max_batch: int, device: torch.device) -> torch.Tensor | None:
    """A reusable pinned landing buffer for `HostTokens` on a GPU (None on a CPU)."""
    return torch.empty(max_batch, dtype=torch.int64, pin_memory=True) if device.type == "cuda" else None
