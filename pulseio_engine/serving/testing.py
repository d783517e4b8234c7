"""Test doubles for the serving loop, shipped with it (as `pulseio.testing` ships its own).

`LateRecaller` wraps an offload engine's `Recaller` so that its recalls land late: each posted recall is held
back for a random number of landing checks before it is really posted, so its data truly is not in place
until then, as behind a slow or busy link. The inner scheduler must then run more normal layers, or make the
device wait, and the tokens must not change.

`LateLoads` does the same to an engine's handed-in KV (`HandoffLoads`): each load starts only after a random
number of landing checks, or when a step must wait for it, so its request sits steps out or joins by a device
wait, and a request stepped before its KV is in would change its tokens.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from ..kv.handoff_loads import HandoffLoads, Landing
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


class LateLoads(HandoffLoads):
    """`HandoffLoads` whose loads start only after 1..`max_checks` landing checks (uniform, seeded), so a request's
    KV truly is not in place before then, or when `take` makes the stream wait for it (the load starts there).
    Counts the checks answered "not yet" (`held_checks`) and the loads taken before their count ran out
    (`taken_early`)."""

    def __init__(self, device: torch.device, *, max_checks: int, seed: int = 0) -> None:
        super().__init__(device)
        self.max_checks = max_checks
        self._rng = random.Random(seed)
        self.held_checks = 0
        self.taken_early = 0

    def start(self, request_id: int, load: Callable[[], None]) -> bool:
        self._events[request_id] = _LateLanding(self, load, self._rng.randint(1, self.max_checks))
        return True


class _LateLanding:
    def __init__(self, loads: LateLoads, load: Callable[[], None], checks: int) -> None:
        self.loads, self.checks = loads, checks
        self.load: Callable[[], None] | None = load
        self.inner: Landing | None = None

    def _started(self) -> Landing | None:
        if self.load is not None:
            self.inner, self.load = self.loads._launch(self.load), None
        return self.inner

    def query(self) -> bool:
        if self.checks > 0:
            self.checks -= 1
            self.loads.held_checks += 1
            return False
        inner = self._started()
        return inner is None or inner.query()

    def wait(self, stream: torch.cuda.Stream | None = None) -> None:
        self.loads.taken_early += self.checks > 0
        inner = self._started()
        if inner is not None:
            inner.wait(stream)
