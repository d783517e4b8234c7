"""The host half of the resident copier's handshake (`pulseio/_cuda/resident_kernel.py`).

`post` publishes a task word and promises it, then reads whether the kernel has offered to stop:
the store of the promise and the load of the stop word are separated by a full fence, which is
what makes the Dekker handshake with the kernel sound (x86 may otherwise let the load pass the
store). `wait_at_least` spins on a word the GPU writes, GIL released.
"""

from __future__ import annotations

from .atomics import NATIVE, fence_seq_cst, load_acquire, store_release


def _post(entry_addr, word, promised_addr, seq, stopped_addr):
    """Publish `word` at entry_addr (0: none, a stream will write it), promise `seq`; returns the stop word."""
    if entry_addr != 0:
        store_release(entry_addr, word)
    store_release(promised_addr, seq)
    fence_seq_cst()
    return load_acquire(stopped_addr)


def _wait_at_least(addr, value, iterations):
    """Spin up to `iterations` loads until the int64 at addr is >= value; 1 if it is, else 0."""
    for _ in range(iterations):
        if load_acquire(addr) >= value:
            return 1
    return 0


if NATIVE:
    from numba import njit

    post = njit(nogil=True, cache=True)(_post)
    wait_at_least = njit(nogil=True, cache=True)(_wait_at_least)
else:  # pragma: no cover - exercised where numba is absent
    post, wait_at_least = _post, _wait_at_least

__all__ = ["post", "wait_at_least"]
