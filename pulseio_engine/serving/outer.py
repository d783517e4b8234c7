"""The outer scheduler: at step boundaries, which arrivals join and in which class, and which requests move.
No torch: decisions on request lengths and the `KVBudget`, carried out by the `ServingEngine`.

Policy:
- Class by length: a request of at least `threshold` tokens is OFFLOAD, a shorter one NORMAL (no threshold:
  every request is NORMAL, the all-on-GPU modes). A NORMAL request that grows to the threshold while it
  decodes moves to OFFLOAD at the next boundary where the budget holds it there (it stays otherwise).
  Moves come before admissions: requests already running go first.
- Admission, FIFO by arrival for what requests share: a waiting request joins when its class's batch has a
  free row and the budget holds its whole reservation (prompt + output). One that waits for GPU bytes (every
  class holds some) stops everyone behind it; one that waits for a row of its batch or for host pool bytes
  (only OFFLOAD holds those) stops its class only, so a short request is never held back by a long one
  waiting for the host pool (head-of-line blocking across classes).
- A request that could never be admitted (its reservation exceeds the caps on its own) is refused when it
  arrives, naming the numbers; the replay checks the whole trace before it starts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import KVBudgetError
from .budget import KVBudget, KVClass, Lack, size


@dataclass(frozen=True)
class Waiting:
    rid: int
    input_len: int
    output_len: int

    @property
    def tokens(self) -> int:
        return self.input_len + self.output_len


@dataclass(frozen=True)
class Decisions:
    """What the engine does at this boundary, in this order: moves, then admissions."""

    moves: tuple[tuple[int, KVClass], ...]
    admits: tuple[tuple[int, KVClass], ...]


class OuterScheduler:
    def __init__(self, budget: KVBudget, *, threshold: int | None, max_batch: int, max_offload: int) -> None:
        """threshold: tokens from which a request is OFFLOAD (None: never); max_batch: rows of each batch;
        max_offload: offload requests the engine holds hot sets for."""
        if threshold is not None and threshold < 1:
            raise ValueError(f"the offload threshold must be >= 1 token, got {threshold!r}")
        self.budget = budget
        self.threshold = threshold
        self.limits = {KVClass.NORMAL: max_batch, KVClass.OFFLOAD: min(max_batch, max_offload)}
        self.waiting: deque[Waiting] = deque()
        self._reserved: dict[int, int] = {}            # running rid -> reserved tokens

    def class_for(self, tokens: int) -> KVClass:
        return KVClass.OFFLOAD if self.threshold is not None and tokens >= self.threshold else KVClass.NORMAL

    def check(self, rid: int, input_len: int, output_len: int) -> None:
        """Refuse a request that could never be admitted, naming its need and the caps."""
        tokens = input_len + output_len
        kv_class = self.class_for(input_len)
        if self.budget.fits_alone(kv_class, tokens):
            return
        fp, b = self.budget.footprint, self.budget
        raise KVBudgetError(
            f"request {rid} ({input_len} + {output_len} tokens, {kv_class.value}) needs "
            f"{size(fp.device_bytes(kv_class, tokens))} of GPU KV and {size(fp.host_bytes(kv_class, tokens))} of host "
            f"pool, more than the caps ({size(b.gpu_bytes)} GPU, {size(b.host_bytes)} host) hold on their own; raise "
            "--gpu-kv-gib (or --host-kv-gib), or clip with --max-input / --max-output")

    def arrive(self, rid: int, input_len: int, output_len: int) -> None:
        self.check(rid, input_len, output_len)
        self.waiting.append(Waiting(rid, input_len, output_len))

    def decide(self, lengths: Mapping[int, int]) -> Decisions:
        """lengths: each running request's tokens now (prompt + generated). Charges the budget for what it decides."""
        moves = []
        for rid, length in lengths.items():
            if self.budget.kv_class(rid) is KVClass.NORMAL and self.class_for(length) is KVClass.OFFLOAD \
                    and self._room(KVClass.OFFLOAD, self._reserved[rid], freeing=rid):
                self.budget.charge(rid, KVClass.OFFLOAD, self._reserved[rid])
                moves.append((rid, KVClass.OFFLOAD))
        admits: list[tuple[int, KVClass]] = []
        stopped: set[KVClass] = set()                           # classes whose oldest waiting request waits
        classes = 1 if self.threshold is None else 2            # classes a request can be in
        kept: deque[Waiting] = deque()
        while self.waiting and len(stopped) < classes:          # once every class waits, the rest waits too
            head = self.waiting.popleft()
            kv_class = self.class_for(head.input_len)
            wait = None if kv_class in stopped else self._waits_for(kv_class, head.tokens)
            if wait == "gpu":                                   # shared by every class: nobody passes it
                self.waiting.appendleft(head)
                break
            if wait is not None or kv_class in stopped:         # a row or host bytes: its class waits
                stopped.add(kv_class)
                kept.append(head)
                continue
            self.budget.charge(head.rid, kv_class, head.tokens)
            self._reserved[head.rid] = head.tokens
            admits.append((head.rid, kv_class))
        kept.extend(self.waiting)
        self.waiting = kept
        return Decisions(tuple(moves), tuple(admits))

    def finish(self, rid: int) -> None:
        self.budget.release(rid)
        del self._reserved[rid]

    def _room(self, kv_class: KVClass, tokens: int, *, freeing: int | None = None) -> bool:
        return self._waits_for(kv_class, tokens, freeing=freeing) is None

    def _waits_for(self, kv_class: KVClass, tokens: int, *, freeing: int | None = None) -> Lack | None:
        """What a request of `kv_class` lacks: "row", "gpu", "host", or None (it fits now, once `freeing`'s charge
        is released)."""
        if self.budget.count(kv_class) >= self.limits[kv_class]:
            return "row"
        return self.budget.lacks(kv_class, tokens, freeing=freeing)
