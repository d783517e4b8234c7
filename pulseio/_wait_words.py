"""WaitWords: one int64 per doorbell request in pinned, device-mapped host memory; what device waits wait on.

Request seq owns word (seq - 1) % slots, and the word reaches seq once the request has landed or failed.
Whoever learns that first sets it, with a plain store: the resident copy kernel when the task lands (a
system-scope store), a pulseio thread when it sees a copy land or a request fail, the watchdog when it
gives up on a wait, close. A stream waits with the wait kernel (`pulseio._cuda.wait_kernel`: word >= seq).

Why host memory and not device memory: setting a word must never need a driver call. A driver call can
queue behind another thread's call that waits for the whole device (a kernel module loaded on first
launch, a cudaFree, a device synchronize), which waits for the stream that waits for the word: a
deadlock. A CPU store cannot. Each word has one value per round (seq, then seq + slots, ...), so the
writers need no atomics; the Runtime admits request seq + slots only once seq has finished.
"""

from __future__ import annotations

import numpy as np

from .backend import HostMemory
from .errors import ConfigError

RELEASED = 1 << 62  # at close: every wait, whatever its seq, is released (the wait compares cyclically)


class WaitWords:
    """`slots` int64 words in `memory` (pinned, device-mapped on a GPU backend); see the module doc."""

    def __init__(self, memory: HostMemory, slots: int) -> None:
        if slots < 1:
            raise ConfigError(f"WaitWords needs at least one slot, got {slots}")
        self._memory: HostMemory | None = memory
        self.slots = slots
        self._words = memory.tensor.numpy().view(np.int64)[:slots]  # [slots] int64, host
        self._words[:] = 0
        self.base = memory.device_ptr  # the address kernels and stream waits use (UVA)

    def address(self, seq: int) -> int:
        """The device address of request seq's word."""
        return self.base + 8 * ((seq - 1) % self.slots)

    def set(self, seq: int) -> None:
        """Request seq has landed or failed: release every wait on it (one aligned 8-byte store)."""
        self._words[(seq - 1) % self.slots] = seq

    def reached(self, seq: int) -> bool:
        return bool(self._words[(seq - 1) % self.slots] >= seq)

    def value(self, seq: int) -> int:
        """The current value of request seq's word (a snapshot, for error reports)."""
        return int(self._words[(seq - 1) % self.slots])

    def release_all(self) -> None:
        """Release every wait, for any seq (close)."""
        self._words[:] = RELEASED

    def close(self) -> None:
        """Free the words. Only once no stream can still wait on them (the Runtime ensures that)."""
        if self._memory is not None:
            self._memory.close()
            self._memory = None
