"""Continuous batching: which sequences run in the next step, decided on the host (no torch).

Policy (one step is either a prefill step or a decode step):
- Admission, FIFO: a waiting sequence joins when a running slot is free and the allocator holds
  blocks for its whole life (prompt + max_new_tokens). Reserving up front means a running sequence
  never runs out of KV, so there is no preemption; the cost is blocks reserved for tokens that an
  early EOS never writes.
- Prefill first: any running sequence with more than one uncomputed token gets a chunk; chunks
  fill a budget of `max_prefill_tokens` tokens per step (long prompts take several steps).
- Otherwise decode: every running sequence has exactly one uncomputed token (its last sampled one,
  or the token after KV handed in by a prefill instance) and all of them advance by one.
- A running sequence in `loading` (its handed-in KV still on its way in: `HandoffLoads`) sits steps out.
Requests join and leave between steps: `add` and finished sequences take effect at the next `schedule`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .config import SchedulerConfig
from .errors import KVBudgetError
from .kv.block_table import BlockAllocator, blocks_for
from .request import Sequence, Status


@dataclass(frozen=True)
class PrefillChunk:
    seq: Sequence
    start: int      # first position computed in this chunk (== seq.num_computed)
    length: int     # tokens in this chunk

    @property
    def samples(self) -> bool:
        """True when the chunk reaches the end of the prefill, so its logits give the next token."""
        return self.start + self.length == self.seq.prefill_stop


@dataclass(frozen=True)
class ScheduledStep:
    admitted: tuple[Sequence, ...]        # joined this step: handed-in KV must be written first
    prefill: tuple[PrefillChunk, ...]     # non-empty for a prefill step
    decode: tuple[Sequence, ...]          # non-empty for a decode step

    @property
    def is_empty(self) -> bool:
        return not self.prefill and not self.decode


@dataclass(frozen=True)
class SchedulerStatistics:
    num_waiting: int
    num_running: int
    num_free_blocks: int


class Scheduler:
    def __init__(self, config: SchedulerConfig, allocator: BlockAllocator, block_size: int) -> None:
        self.config = config
        self.allocator = allocator
        self.block_size = block_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.loading: set[int] = set()      # request ids of running sequences not stepped until their KV is in

    def add(self, seq: Sequence) -> None:
        """Queue a sequence; refuses one that could never fit in the cache."""
        need = blocks_for(seq.max_len, self.block_size)
        if need > self.allocator.capacity:
            raise KVBudgetError(
                f"request {seq.request_id}: prompt ({seq.prompt_len} tokens) + max_new_tokens "
                f"({seq.sampling.max_new_tokens}) needs {need} KV blocks of {self.block_size} tokens, but "
                f"the KV cache holds {self.allocator.capacity} blocks "
                f"({self.allocator.capacity * self.block_size} tokens); shorten the request or give the "
                f"cache more blocks (CacheConfig.num_blocks)"
            )
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        """Admit (`admit`), then plan the step (`plan`)."""
        return self.plan(self.admit())

    def plan(self, admitted: tuple[Sequence, ...] = ()) -> ScheduledStep:
        """The next step of the running sequences, admitting none; `admitted`: those `admit` just let in."""
        prefill = self._prefill_chunks()
        decode = () if prefill else tuple(s for s in self.running       # not finishing, not loading
                                          if s.finish_reason is None and s.request_id not in self.loading)
        return ScheduledStep(admitted, prefill, decode)

    def finish(self, seq: Sequence) -> None:
        """Return a finished sequence's blocks; it leaves the running set."""
        seq.set_status(Status.FINISHED)
        self.running.remove(seq)
        self.allocator.free(seq.block_table.block_ids)
        seq.block_table.block_ids = []

    def remove(self, seq: Sequence) -> None:
        """Drop a waiting or running sequence unfinished (its blocks returned): it was moved elsewhere."""
        if seq in self.waiting:
            self.waiting.remove(seq)
            return
        self.running.remove(seq)
        self.loading.discard(seq.request_id)
        self.allocator.free(seq.block_table.block_ids)
        seq.block_table.block_ids = []

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics(len(self.waiting), len(self.running), self.allocator.num_free)

    def admit(self) -> tuple[Sequence, ...]:
        """Admit waiting sequences now, FIFO, as `schedule` does first; -> those admitted."""
        admitted = []
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            need = blocks_for(seq.max_len, self.block_size)
            if not self.allocator.can_allocate(need):
                break
            self.waiting.popleft()
            seq.block_table.block_ids = self.allocator.allocate(need)
            seq.set_status(Status.RUNNING)
            self.running.append(seq)
            admitted.append(seq)
        return tuple(admitted)

    def _prefill_chunks(self) -> tuple[PrefillChunk, ...]:
        budget = self.config.max_prefill_tokens
        chunks = []
        for seq in self.running:
            if seq.prefill_stop - seq.num_computed <= 1 or budget == 0 or seq.request_id in self.loading:
                continue
            length = min(seq.prefill_stop - seq.num_computed, budget)
            chunks.append(PrefillChunk(seq, seq.num_computed, length))
            budget -= length
        return tuple(chunks)
