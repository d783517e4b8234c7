"""The integration's Quest selection and hot-set planning, against brute force (CPU, no transformers)."""

from __future__ import annotations

import itertools

import pytest
import torch

from pulseio.integrations.transformers import block_digests, block_scores, select_blocks
from pulseio.integrations.transformers.hot_set import HotSet
from pulseio.integrations.transformers.selection import selected_tokens


def test_digests_are_each_blocks_key_max_and_min_over_its_tokens_only() -> None:
    keys = torch.randn(2, 3, 37, 8)                                  # 37 tokens: the last block of 5 is partial
    dmax, dmin = block_digests(keys, 16)
    assert dmax.shape == (2, 3, 3, 8)
    for j in range(3):
        block = keys[:, :, 16 * j:16 * (j + 1)]
        assert torch.equal(dmax[:, :, j], block.amax(2)) and torch.equal(dmin[:, :, j], block.amin(2))


@pytest.mark.parametrize("head", [None, 1])
def test_scores_are_the_quest_bound_summed_over_each_gqa_group(head: int | None) -> None:
    b, hkv, g, nb, d = 2, 3, 2, 5, 8
    q = torch.randn(b, hkv * g, d, dtype=torch.float64)
    dmin, dmax = torch.randn(2, b, hkv, nb, d, dtype=torch.float64).sort(0).values  # M >= m, any values
    heads = range(hkv) if head is None else [head]
    dmax_rows, dmin_rows = dmax[:, list(heads)], dmin[:, list(heads)]
    scores = block_scores(q, hkv, head, dmax_rows, dmin_rows)
    for i, (s, h), j in itertools.product(range(b), enumerate(heads), range(nb)):
        qs = q[i, h * g:(h + 1) * g]                                                  # [G, D]
        bound = torch.maximum(qs * dmax[i, h, j], qs * dmin[i, h, j]).sum()
        assert scores[i, s, j].item() == pytest.approx(bound.item(), rel=1e-5, abs=1e-5)


def test_selection_keeps_sink_and_local_then_the_best_ascending() -> None:
    scores = torch.tensor([[[0.0, 9.0, 1.0, 8.0, 2.0, 7.0, -5.0, -6.0]]])
    chosen = select_blocks(scores, 5, sink=1, local=2)
    assert chosen.tolist() == [[[0, 1, 3, 6, 7]]]                                    # sink 0, local 6 7, best 1 3
    assert select_blocks(scores[..., :3], 5, sink=1, local=2).tolist() == [[[0, 1, 2, -1, -1]]]


def test_selection_breaks_ties_to_the_lower_block() -> None:
    chosen = select_blocks(torch.zeros(1, 1, 10), 4, sink=1, local=1)
    assert chosen.tolist() == [[[0, 1, 2, 9]]]


@pytest.mark.parametrize("n", [1, 15, 16, 17, 100, 128, 129, 1000])
def test_the_selected_blocks_tokens_are_a_prefix_of_known_length(n: int) -> None:
    bs, budget = 16, 4
    nb = -(-n // bs)
    chosen = select_blocks(torch.randn(1, 1, nb), budget, sink=1, local=2)[0, 0].tolist()
    tokens = sum(min(bs, n - j * bs) for j in chosen if j >= 0)
    assert tokens == selected_tokens(n, budget, bs)
    real = [j for j in chosen if j >= 0]
    assert real == sorted(real) and chosen[:len(real)] == real and real[-1] == nb - 1  # partial block last


def _hot_set(rows: int = 2, entries: int = 4, max_blocks: int = 12) -> HotSet:
    return HotSet(torch.arange(rows) * 100, torch.arange(rows) * entries, entries, max_blocks)


def _resident(hot: HotSet) -> list[dict[int, int]]:
    """Per row: block -> entry, from both maps (which must agree)."""
    out = []
    for r in range(hot.resident.shape[0]):
        by_entry = {int(blk): e for e, blk in enumerate(hot.resident[r, :-1].tolist()) if blk >= 0}
        by_block = {blk: int(e) for blk, e in enumerate(hot.where[r, :-1].tolist()) if e >= 0}
        assert by_entry == by_block
        out.append(by_entry)
    return out


def test_hot_set_recalls_only_what_is_missing_into_free_entries_and_keeps_the_rest() -> None:
    hot = _hot_set()
    first = hot.plan(torch.tensor([[0, 3, 5, -1], [1, 2, 7, 9]]))
    count = int(first.count)
    assert count == 7
    pairs = sorted(zip(first.host_ids[:count].tolist(), first.device_slots[:count].tolist()))
    assert pairs == [(0, 0), (3, 1), (5, 2), (101, 4), (102, 5), (107, 6), (109, 7)]   # row r: unit 100 r, slot 4 r
    before = _resident(hot)
    second = hot.plan(torch.tensor([[0, 4, 5, 11], [2, 3, 7, 9]]))
    count = int(second.count)
    needed = sorted(zip(second.host_ids[:count].tolist(), second.device_slots[:count].tolist()))
    assert [h for h, _ in needed] == [4, 11, 103]                                    # 4 and 11 in row 0, 3 in row 1
    after = _resident(hot)
    for r, kept in ((0, (0, 5)), (1, (2, 7, 9))):
        assert all(after[r][blk] == before[r][blk] for blk in kept), "a block selected again stays in its entry"
    assert set(after[0]) == {0, 4, 5, 11} and set(after[1]) == {2, 3, 7, 9}
    slots = second.slots.tolist()
    assert slots[0] == [after[0][b] for b in (0, 4, 5, 11)]
    assert slots[1] == [4 + after[1][b] for b in (2, 3, 7, 9)]


def test_hot_set_keeps_an_unselected_block_until_its_entry_is_needed() -> None:
    hot = _hot_set(rows=1, entries=3)
    hot.plan(torch.tensor([[0, 1, 2]]))
    hot.plan(torch.tensor([[0, 1, -1]]))                  # block 2 is not selected but stays resident
    assert 2 in _resident(hot)[0]
    again = hot.plan(torch.tensor([[0, 1, 2]]))
    assert int(again.count) == 0                          # picked up again without a recall
    hot.plan(torch.tensor([[0, 5, 6]]))                   # two new blocks: 1 and 2 give their entries
    assert set(_resident(hot)[0]) == {0, 5, 6}
