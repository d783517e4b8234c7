"""Seats: requests' state in rows of persistent tensors. Under random arrivals, departures and batches, every
request's tensors keep their values bit for bit, a batch's rows hold its requests in its order at the same
addresses (what a captured step relies on), writes through a batch reach the requests, and a departure moves
no other row."""

from __future__ import annotations

import random

import pytest
import torch

from pulseio_engine.kv.seats import Seats

L, S, NB = 3, 2, 5


def _parts(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"mask": torch.randint(0, 2, (L, S, NB), generator=g, dtype=torch.uint8),
            "owner": torch.randint(-1, 1000, (L, S, 4), generator=g, dtype=torch.int64)}


def test_random_churn_keeps_every_request_state_and_batches_hold_their_rows_in_order() -> None:
    rng = random.Random(0)
    seats = Seats(2)
    live: dict[int, dict[str, torch.Tensor]] = {}   # key -> its tensors (views once seated)
    want: dict[int, dict[str, torch.Tensor]] = {}   # key -> what they must hold
    next_key, generations = 0, set()
    for _ in range(300):
        op = rng.random()
        if op < 0.35 or not live:
            parts = _parts(next_key)
            want[next_key] = {n: t.clone() for n, t in parts.items()}
            seats.seat(next_key, parts)
            live[next_key] = parts
            next_key += 1
        elif op < 0.55:
            key = rng.choice(sorted(live))
            seats.unseat(key)
            parts = live.pop(key)
            for name, t in parts.items():               # its own copy now: still its values, in no row
                assert torch.equal(t, want[key][name])
            del want[key]
        else:
            batch = rng.sample(sorted(live), rng.randint(1, len(live)))
            seats.arrange(batch)
            generations.add(seats.generation)
            before = {n: seats.batch(n, len(batch)).data_ptr() for n in want[batch[0]]}
            seats.arrange(batch)                        # already in place: nothing moves
            for name in before:
                view = seats.batch(name, len(batch))
                assert view.data_ptr() == before[name]
                for row, key in enumerate(batch):
                    assert torch.equal(view[:, row], want[key][name]), (key, name)
            view = seats.batch("owner", len(batch))
            view.add_(1)                                 # a step updating its batch in place ...
            for key in batch:
                want[key]["owner"] += 1                  # ... updates its requests' tensors
        for key, parts in live.items():
            for name, t in parts.items():
                assert torch.equal(t, want[key][name]), (key, name)
    assert len(seats) == len(live)
    assert max(generations) >= 1, "the churn should have grown the seats at least once"


def _seated(capacity: int, keys: int) -> Seats:
    """Seats holding keys 0..keys-1, the first three arranged into rows 0-2."""
    seats = Seats(capacity)
    for key in range(keys):
        seats.seat(key, _parts(key))
    seats.arrange([0, 1, 2])
    return seats


def test_a_batch_of_b_rows_sits_at_the_same_addresses_whichever_requests_it_holds() -> None:
    seats = _seated(8, 6)
    ptr = seats.batch("mask", 3).data_ptr()
    seats.arrange([5, 3, 1])
    assert seats.batch("mask", 3).data_ptr() == ptr and seats.generation == 0
    assert torch.equal(seats.batch("owner", 3)[:, 0], _parts(5)["owner"])


def test_a_departure_moves_no_other_row() -> None:
    seats = _seated(4, 3)
    snapshot = seats.batch("owner", 3).clone()
    seats.unseat(0)
    assert torch.equal(seats.batch("owner", 3)[:, 1:], snapshot[:, 1:])   # what the last batch read is intact
    seats.seat(9, _parts(9))                                              # takes the free row
    assert seats.row(9) == 0 and len(seats) == 3


def test_mistakes_are_refused_by_name() -> None:
    seats = Seats(2)
    seats.seat(1, _parts(1))
    with pytest.raises(KeyError, match="seated already"):
        seats.seat(1, _parts(1))
    with pytest.raises(KeyError, match=r"not seated \[7\]"):
        seats.arrange([1, 7])
    with pytest.raises(KeyError, match="a key twice"):
        seats.arrange([1, 1])
    with pytest.raises(ValueError, match="parts"):
        seats.seat(2, {"mask": _parts(2)["mask"]})
