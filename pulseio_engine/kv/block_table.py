"""Logical -> physical KV block ids: a free-list allocator and a per-sequence block table.

CPU-only bookkeeping (no torch). Block 0 is reserved: CUDA-graph padding rows read and write it.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

PAD_BLOCK = 0


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `num_tokens` tokens."""
    return -(-num_tokens // block_size)


@dataclass(frozen=True)
class AllocatorStatistics:
    num_blocks: int
    num_free: int
    num_used: int


class BlockAllocator:
    """Hands out physical block ids 1..num_blocks-1 (0 is the padding block)."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the padding block), got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))

    @property
    def capacity(self) -> int:
        """Blocks a single sequence could ever get."""
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} KV blocks with {len(self._free)} free; "
                               "check can_allocate() first (this is a bug in pulseio_engine)")
        return [self._free.popleft() for _ in range(n)]

    def free(self, block_ids: Iterable[int]) -> None:
        self._free.extend(block_ids)

    def statistics(self) -> AllocatorStatistics:
        return AllocatorStatistics(self.num_blocks, self.num_free, self.capacity - self.num_free)


class BlockTable:
    """One sequence's physical block ids, in logical order. They are set whole (the scheduler reserves a request's
    blocks at once) and read-only in between, so `packed`, the int32 copy a decode step's block table is filled
    from, is made once per setting: built from the Python ints every step, a batch of 32K-token requests spent
    ~30 us a request of host time on it."""

    __slots__ = ("_ids", "_packed")

    def __init__(self) -> None:
        self._ids: tuple[int, ...] = ()
        self._packed: array[int] | None = None

    @property
    def block_ids(self) -> tuple[int, ...]:
        return self._ids

    @block_ids.setter
    def block_ids(self, ids: Iterable[int]) -> None:
        self._ids = tuple(ids)
        self._packed = None

    def packed(self) -> array[int]:
        """The ids as C ints (`array` typecode "i"), made once per setting of `block_ids`."""
        if self._packed is None:
            self._packed = array("i", self._ids)
        return self._packed

    def __len__(self) -> int:
        return len(self._ids)

    def slot(self, position: int, block_size: int) -> int:
        """Flat cache slot (block * block_size + offset) of token `position`."""
        return self.block_ids[position // block_size] * block_size + position % block_size
