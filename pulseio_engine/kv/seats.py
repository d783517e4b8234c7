"""Seats: every running request's per-layer state in rows of persistent [L, R, ...] tensors, so that a decode
batch of B requests is always the first B rows (or, for a second batch beside it, the B rows after the first
batch's), at the same addresses whatever requests it holds.

A captured decode step (`OffloadStepGraph`) reads and updates its batch's state through pointers fixed at
capture. If each batch stacked its requests' state afresh, every change of the batch's members (a request
finishing, one arriving) would need a new capture, which costs far more than the steps between two changes in
a serving loop. Here a request's tensors (its `SelectionState`, its `OffloadSeq` maps) are views of its row,
a batch's are `[:, :B]` views of the whole, and `arrange(keys)` moves rows (one gather per tensor) so that
keys[i] sits in row i: a step graph captured for B rows stays valid for any B requests, until the storage
grows (`generation` counts that). A request that leaves frees its row without moving the others (what the
last batch read stays readable until the next `arrange`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import torch

from ..upload import to_device_nowait


class Seats:
    """Named [L, R, ...] tensors on one device; rows seated by key. `seat` takes a request's own tensors (each
    [L, ...] of its name's trailing shape and dtype) and makes them views of a free row; `unseat` frees it."""

    def __init__(self, rows: int) -> None:
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        self._capacity = rows
        self._storage: dict[str, torch.Tensor] = {}
        self._keys: list[Hashable | None] = []                     # row -> key (None: free); rows past it free
        self._parts: dict[Hashable, Mapping[str, torch.Tensor]] = {}
        self.generation = 0                                        # bumped whenever the storage moves

    def __len__(self) -> int:
        return len(self._parts)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._parts

    def row(self, key: Hashable) -> int:
        return self._keys.index(key)

    def seat(self, key: Hashable, parts: Mapping[str, torch.Tensor]) -> None:
        """Copy `parts` into a new row and make each a view of it (a request's state from now on)."""
        if key in self._parts:
            raise KeyError(f"{key!r} is seated already")
        if not self._storage:
            self._storage = {name: torch.empty((t.shape[0], self._capacity, *t.shape[1:]), dtype=t.dtype,
                                               device=t.device) for name, t in parts.items()}
        if set(parts) != set(self._storage):
            raise ValueError(f"parts {sorted(parts)}, the seats hold {sorted(self._storage)}")
        if None in self._keys:
            row = self._keys.index(None)
        else:
            if len(self._keys) == self._capacity:
                self._grow()
            row = len(self._keys)
            self._keys.append(None)
        for name, part in parts.items():
            self._storage[name][:, row].copy_(part)
        self._keys[row] = key
        self._parts[key] = parts
        self._view(key, row)

    def unseat(self, key: Hashable) -> None:
        """Free `key`'s row; its tensors become copies of their own. No other row moves."""
        row = self._keys.index(key)
        parts = self._parts.pop(key)
        for name, part in parts.items():
            part.set_(self._storage[name][:, row].clone())  # type: ignore[call-overload]  # stub lacks set_(Tensor)
        self._keys[row] = None
        while self._keys and self._keys[-1] is None:
            self._keys.pop()

    def arrange(self, keys: Sequence[Hashable]) -> None:
        """Move rows so that keys[i] holds row i (the other seated keys follow, in their order)."""
        if self.holds(keys):
            return
        missing = [k for k in keys if k not in self._parts]
        if missing or len(set(keys)) != len(keys):
            raise KeyError(f"arrange {list(keys)}: not seated {missing}" if missing else
                           f"arrange {list(keys)}: a key twice")
        chosen = set(keys)
        order = list(keys) + [k for k in self._keys if k is not None and k not in chosen]
        n = len(order)
        device = next(iter(self._storage.values())).device
        row_of = {k: row for row, k in enumerate(self._keys) if k is not None}
        perm = to_device_nowait(torch.tensor([row_of[k] for k in order], dtype=torch.int64), device)
        for t in self._storage.values():
            t[:, :n] = t.index_select(1, perm)
        self._keys = order
        for row, key in enumerate(order):
            if row_of[key] != row:
                self._view(key, row)

    def holds(self, keys: Sequence[Hashable], first: int = 0) -> bool:
        """Whether keys[i] sits in row first + i for every i."""
        return list(keys) == self._keys[first:first + len(keys)]

    def batch(self, name: str, size: int, first: int = 0) -> torch.Tensor:
        """[L, size, ...]: rows [first, first + size) of `name`, the state of the batch `arrange` put there."""
        return self._storage[name][:, first:first + size]

    def _view(self, key: Hashable, row: int) -> None:
        for name, part in self._parts[key].items():
            t = self._storage[name]
            view = t[:, row]
            part.set_(t.untyped_storage(), t.storage_offset() + row * t.stride(1), view.shape, view.stride())

    def _grow(self) -> None:
        """Twice the rows; every seated view moves with its storage (graphs over the old storage are stale)."""
        self._capacity *= 2
        old = self._storage
        self._storage = {}
        for name, t in old.items():
            grown = torch.empty((t.shape[0], self._capacity, *t.shape[2:]), dtype=t.dtype, device=t.device)
            grown[:, :t.shape[1]].copy_(t)
            self._storage[name] = grown
        for row, key in enumerate(self._keys):
            if key is not None:
                self._view(key, row)
        self.generation += 1
