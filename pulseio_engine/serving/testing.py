"""Test doubles for the serving loop, shipped with it (as `pulseio.testing` ships its own).

`LateRecaller` wraps an offload engine's `Recaller` so that its recalls land late: each posted recall is held
back for a random number of landing checks before it is really posted, so its data truly is not in place
until then, as behind a slow or busy link. The inner scheduler must then run more normal layers, or make the
device wait, and the tokens must not change.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from ..kv.recall import PendingRecall, Recaller


class LateRecaller:
    """A `Recaller` whose recalls land after 0..`max_checks` landing checks (uniform, seeded); a device wait
    before then posts the recall at once and waits for it."""

    def __init__(self, inner: Recaller, *, max_checks: int, seed: int = 0) -> None:
        self.inner = inner
        self.max_checks = max_checks
        self._rng = random.Random(seed)
        self.held_checks = 0                 # landing checks answered "not yet" while a recall was held back

    @property
    def captures(self) -> bool:
        return False                         # eager only: a held-back post cannot sit inside a CUDA graph

    @property
    def blocked_ns(self) -> int:
        return self.inner.blocked_ns

    @property
    def ahead_bytes(self) -> int:
        return self.inner.ahead_bytes

    def post(self, ids: torch.Tensor, dst: torch.Tensor, count: torch.Tensor, *, tag: int) -> _LatePending:
        return _LatePending(self, (ids, dst, count, tag), self._rng.randint(0, self.max_checks))

    def recall(self, ids: torch.Tensor, dst: torch.Tensor, count: torch.Tensor, *, tag: int) -> Any:
        return self.post(ids, dst, count, tag=tag).wait_device()

    def check_landed(self) -> None:
        self.inner.check_landed()


class _LatePending:
    """A `PendingRecall` not posted until its checks run out (or a device wait comes first)."""

    def __init__(self, owner: LateRecaller, args: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int],
                 checks: int) -> None:
        self._owner, self._args, self._checks = owner, args, checks
        self._real: PendingRecall | None = None
        self.tag = args[3]

    def _post(self) -> PendingRecall:
        if self._real is None:
            ids, dst, count, tag = self._args
            self._real = self._owner.inner.post(ids, dst, count, tag=tag)
        return self._real

    def landed_nowait(self) -> bool:
        if self._real is None and self._checks > 0:
            self._checks -= 1
            self._owner.held_checks += 1
            return False
        return self._post().landed_nowait()

    def wait_device(self) -> Any:
        return self._post().wait_device()
