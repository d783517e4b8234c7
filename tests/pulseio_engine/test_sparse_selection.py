"""Block digests, scores, top-k selection and selected-minus-resident, each against a plain-Python
loop over the same definition (tests/pulseio_engine/sparse_reference.py)."""

from __future__ import annotations

import pytest
import torch
from sparse_reference import ref_digest, ref_recall, ref_scores, ref_select

from pulseio_engine.attention import paged_decode_attention, paged_decode_attention_reference
from pulseio_engine.config import GroupScore, SparseConfig, SparseMode
from pulseio_engine.kv.digests import BlockDigests
from pulseio_engine.kv.residency import apply_recall, plan_recall, touch
from pulseio_engine.kv.retrieval_heads import RetrievalHeads
from pulseio_engine.kv.selection import block_scores, select_blocks, select_for_layer

BS = 16
HKV, G, D = 2, 3, 8


def _digests(heads: tuple[int, ...] | None = None, num_blocks: int = 12) -> BlockDigests:
    return BlockDigests(num_layers=2, num_blocks=num_blocks, num_kv_heads=HKV, head_dim=D, block_size=BS,
                        dtype=torch.float32, device="cpu", heads=heads)


def _append(digests: BlockDigests, keys: dict[int, list[torch.Tensor]], table: list[int],
            start: int, n: int, gen: torch.Generator) -> None:
    """Append n tokens at positions start.. of one sequence (physical blocks `table`), both layers."""
    k = torch.randn((n, HKV, D), generator=gen)
    slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(start, start + n)])
    for layer in range(2):
        digests.update(layer, k * (layer + 1), slots)
    for i, p in enumerate(range(start, start + n)):
        keys.setdefault(table[p // BS], []).append(k[i])
        if p % BS == 0:
            keys[table[p // BS]] = [k[i]]   # a block's first token starts it afresh


@pytest.mark.parametrize("heads", [None, (1, 0)])
def test_digests_cover_exactly_the_filled_tokens(heads: tuple[int, ...] | None) -> None:
    """Chunked prefill (7, 20 tokens), then decode one token at a time; two sequences interleaved; then
    a freed block is reused by a third sequence and must forget its old keys."""
    gen = torch.Generator().manual_seed(0)
    digests, keys = _digests(heads), {}
    tables = {0: [3, 5, 9], 1: [4, 1, 7]}
    lens = {0: 0, 1: 0}
    for sid, n in [(0, 7), (1, 20), (0, 20), (1, 1), (0, 1), (0, 1), (1, 13), (0, 5)]:
        _append(digests, keys, tables[sid], lens[sid], n, gen)
        lens[sid] += n
        for block in tables[sid][: -(-lens[sid] // BS)]:
            for layer in range(2):
                want_max, want_min = ref_digest(keys[block], heads, layer)
                assert torch.equal(digests.max[layer, block], want_max * (layer + 1)), (sid, block, layer)
                assert torch.equal(digests.min[layer, block], want_min * (layer + 1)), (sid, block, layer)
    _append(digests, keys, [5], 0, 3, gen)          # block 5 (sequence 0's second block) is reused
    want_max, _ = ref_digest(keys[5], heads, 0)
    assert len(keys[5]) == 3 and torch.equal(digests.max[0, 5], want_max)
    assert digests.width == (HKV if heads is None else 1)


@pytest.mark.parametrize("rule", list(GroupScore))
def test_scores_equal_the_quest_formula_combined_over_the_group(rule: GroupScore) -> None:
    """Requests of 10, 7 and 3 blocks in 10 block columns: padding columns hold larger digests than any
    real block, which must not move a head's best (MAX_NORM) nor any real block's score."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn((3, HKV * G, D), generator=gen)
    a, b = torch.randn((2, 3, 10, HKV, D), generator=gen)
    dmax, dmin = torch.maximum(a, b), torch.minimum(a, b)
    real = [10, 7, 3]
    for i, n in enumerate(real):
        dmax[i, n:], dmin[i, n:] = 50.0, -50.0
    num_tokens = torch.tensor([n * BS - 3 for n in real])          # the last block partly filled
    for head in (None, 0, 1):
        heads = list(range(HKV)) if head is None else [head]
        got = block_scores(q, HKV, head, dmax[:, :, heads], dmin[:, :, heads], num_tokens, BS, rule)
        want = ref_scores(q, dmax, dmin, HKV, heads, rule, real)
        for i, n in enumerate(real):
            torch.testing.assert_close(got[i, :, :n], want[i, :, :n], rtol=1e-5, atol=1e-5)


def test_max_norm_keeps_the_block_one_query_head_wants_where_the_sum_follows_the_loudest() -> None:
    """Two query heads of one KV head, 7 blocks, two middle slots. Head 0's logits run 20x head 1's:
    it favours blocks 3 then 4; head 1 favours block 2 alone. SUM keeps 3 and 4 (20 and 19 against 1);
    MAX_NORM scores each block by its best standing in any head (3 and 2 lead their heads, 4 trails head
    0's best by 1 point, as every other block trails head 1's), so it keeps 2 and 3."""
    config = SparseConfig(token_budget=4 * BS, sink_blocks=1, local_blocks=1)     # sink 0, local 6, 2 middle
    q = torch.zeros((1, 2, 2))                        # [B, Hq, D]; one KV head
    q[0, 0, 0], q[0, 1, 1] = 10.0, 1.0
    keys = torch.zeros((7, 2))                        # one key per block: digest max = min = key
    keys[3, 0], keys[4, 0], keys[2, 1] = 2.0, 1.9, 1.0
    digest = keys[None, :, None, :]                   # [B, NB, S, D]
    n = torch.tensor([7 * BS])
    picks = {}
    for rule in GroupScore:
        scores = block_scores(q, 1, None, digest, digest, n, BS, rule)
        picks[rule] = [b for b in select_blocks(scores, n, config)[0, 0].tolist() if b not in (0, 6)]
    assert picks[GroupScore.SUM] == [3, 4]
    assert picks[GroupScore.MAX_NORM] == [2, 3]


CONTEXTS = [1, 15, 16, 17, 64, 65, 100, 160, 161, 250]   # shorter than, equal to and longer than the budget


@pytest.mark.parametrize("sink,local", [(1, 2), (0, 1), (2, 3)])
def test_selection_matches_the_reference(sink: int, local: int) -> None:
    config = SparseConfig(token_budget=6 * BS, sink_blocks=sink, local_blocks=local)
    gen = torch.Generator().manual_seed(2)
    nb = 16
    scores = torch.randn((len(CONTEXTS), 2, nb), generator=gen)
    scores[8, 1] = torch.randint(0, 3, (nb,), generator=gen).float()     # many ties, 11 blocks
    scores[-1, 0] = 0.0                                                  # all tied
    got = select_blocks(scores, torch.tensor(CONTEXTS), config)
    assert got.shape == (len(CONTEXTS), 2, config.budget_blocks) and got.dtype == torch.int64
    for b, ctx in enumerate(CONTEXTS):
        for s in range(2):
            assert got[b, s].tolist() == ref_select(scores[b, s].tolist(), ctx, config), (ctx, s)


def test_short_contexts_select_everything_and_ties_go_to_the_lower_block() -> None:
    config = SparseConfig(token_budget=4 * BS, sink_blocks=1, local_blocks=1)
    scores = torch.zeros((2, 1, 3))   # 3 block columns, fewer than the budget of 4
    got = select_blocks(scores, torch.tensor([33, 5]), config)
    assert got.tolist() == [[[0, 1, 2, -1]], [[0, -1, -1, -1]]]
    tied = torch.zeros((1, 1, 10))
    got = select_blocks(tied, torch.tensor([10 * BS]), config)
    assert got.tolist() == [[[0, 1, 2, 9]]], "sink 0, local 9, then the lowest tied middle blocks"


@pytest.mark.parametrize("rule", list(GroupScore))
@pytest.mark.parametrize("mode", list(SparseMode))
def test_select_for_layer_uses_the_mode_heads(mode: SparseMode, rule: GroupScore) -> None:
    heads = RetrievalHeads(HKV, best=(1, 0), worst=(0, 1)).heads_for(mode)
    config = SparseConfig(token_budget=3 * BS, sink_blocks=1, local_blocks=1, group_score=rule)
    digests, keys, gen = _digests(heads), {}, torch.Generator().manual_seed(3)
    table = [2, 6, 8, 10, 11]
    _append(digests, keys, table, 0, 70, gen)
    q = torch.randn((1, HKV * G, D), generator=gen)
    for layer in range(2):
        got = select_for_layer(digests, layer, q, torch.tensor([table]), torch.tensor([70]), config)
        assert got.shape == (1, HKV if heads is None else 1, 3)
        head_ids = list(range(HKV)) if heads is None else [heads[layer]]
        dmax = torch.stack([ref_digest(keys[p], None, 0)[0] for p in table])[None] * (layer + 1)
        dmin = torch.stack([ref_digest(keys[p], None, 0)[1] for p in table])[None] * (layer + 1)
        want = ref_scores(q, dmax, dmin, HKV, head_ids, rule)
        for s in range(got.shape[1]):
            assert got[0, s].tolist() == ref_select(want[0, s].tolist(), 70, config)


def test_each_query_head_selects_and_reads_through_its_own_kv_head_as_dense_attention_does() -> None:
    """Anchored on the dense kernel, not on sparse_reference (which could share a wrong head mapping):
    query head g (of Hq = Hkv * G, G != Hkv) matches only the keys of block 1 + g in KV head g // G, so
    Quest's row for KV head h must pick exactly the blocks of its own G query heads, and attention over
    each row's selected hot slots must equal dense paged attention (which reads KV head g // G, as HF does)."""
    gen = torch.Generator().manual_seed(5)
    nb, n = 8, 8 * BS
    config = SparseConfig(token_budget=5 * BS, sink_blocks=1, local_blocks=1)       # 3 middle blocks per row
    k = 0.1 * torch.randn((n, HKV, D), generator=gen)
    v = torch.randn((n, HKV, D), generator=gen)
    q = torch.zeros((1, HKV * G, D))
    for g in range(HKV * G):                                    # D = 8 >= 6 query heads: one direction each
        q[0, g, g] = 20.0
        k[(1 + g) * BS:(2 + g) * BS, g // G, g] += 5.0
    physical = [4, 9, 2, 7, 1, 8, 3, 6]                         # logical block -> physical id
    digests = BlockDigests(num_layers=1, num_blocks=10, num_kv_heads=HKV, head_dim=D, block_size=BS,
                           dtype=torch.float32, device="cpu")
    positions = torch.arange(n)
    digests.update(0, k, torch.tensor(physical)[positions // BS] * BS + positions % BS)
    selected = select_for_layer(digests, 0, q, torch.tensor([physical]), torch.tensor([n]), config)   # [1, S, K]
    want = [[0] + [1 + g for g in range(h * G, (h + 1) * G)] + [nb - 1] for h in range(HKV)]
    assert selected[0].tolist() == want
    blocks = k.view(nb, BS, HKV, D), v.view(nb, BS, HKV, D)
    kk = config.budget_blocks
    hot = torch.zeros((1 + HKV * kk, 2, BS, 1, D))                  # slot 0 unused, as in the engine's pool
    for h in range(HKV):
        for j, block in enumerate(selected[0, h].tolist()):
            hot[1 + h * kk + j, 0, :, 0], hot[1 + h * kk + j, 1, :, 0] = blocks[0][block, :, h], blocks[1][block, :, h]
    table = 1 + torch.arange(HKV * kk, dtype=torch.int32).view(1, HKV, kk)   # [B, S, K] slots of the selection
    scale = D ** -0.5
    got = paged_decode_attention(q, hot[:, 0], hot[:, 1], table, torch.full((1, HKV), kk * BS, dtype=torch.int32),
                                 scale, num_kv_heads=HKV)
    dense = paged_decode_attention_reference(q, *blocks, torch.arange(nb, dtype=torch.int32)[None],
                                             torch.tensor([n], dtype=torch.int32), scale)
    torch.testing.assert_close(got, dense, rtol=0, atol=1e-5)


@pytest.mark.parametrize("with_age", [False, True])
def test_recall_plan_matches_the_reference(with_age: bool) -> None:
    gen = torch.Generator().manual_seed(4)
    rows, nb, k, num_slots = 6, 20, 5, 7
    for trial in range(20):
        age = torch.randint(0, 4, (rows, num_slots), generator=gen) if with_age else None
        resident = torch.full((rows, nb), -1, dtype=torch.long)
        selected = torch.full((rows, k), -1, dtype=torch.long)
        for r in range(rows):
            held = torch.randperm(nb, generator=gen)[: int(torch.randint(0, num_slots + 1, (1,), generator=gen))]
            resident[r, held] = torch.randperm(num_slots, generator=gen)[: len(held)]
            n_sel = int(torch.randint(0, k + 1, (1,), generator=gen))
            selected[r, :n_sel] = torch.randperm(nb, generator=gen)[:n_sel].sort().values
        plan = plan_recall(selected, resident, num_slots, age=age)
        for r in range(rows):
            want = ref_recall(selected[r].tolist(), resident[r].tolist(), num_slots,
                              None if age is None else age[r].tolist())
            got = (plan.blocks[r].tolist(), plan.slots[r].tolist(), plan.evicted[r].tolist(),
                   plan.selected_slots[r].tolist())
            assert got == want, (trial, r)
        after = apply_recall(resident, plan)
        valid = selected >= 0
        assert torch.equal(after.gather(1, selected.clamp(min=0))[valid], plan.selected_slots[valid])
        for r in range(rows):
            slots = [s for s in after[r].tolist() if s >= 0]
            assert len(slots) == len(set(slots)), "no slot is held twice"
        if age is not None:                    # the selected blocks' slots are the young ones now
            aged = touch(age, plan)
            assert not aged.gather(1, plan.selected_slots.clamp(min=0))[valid].any()
            used = torch.zeros((rows, num_slots + 1), dtype=torch.bool).scatter_(
                1, torch.where(valid, plan.selected_slots, num_slots), True)[:, :num_slots]
            assert torch.equal(aged[~used], age[~used] + 1)


def test_recall_needs_a_slot_per_selected_block() -> None:
    with pytest.raises(ValueError, match=r"^num_slots \(3\) must be at least the selection width K \(4\)"):
        plan_recall(torch.zeros((1, 4), dtype=torch.long), torch.full((1, 8), -1), 3)


def test_sparse_config_states_its_rules() -> None:
    with pytest.raises(ValueError, match=r"token_budget \(100\) must be a multiple of block_size \(16\); "
                                         r"use 96 or 112"):
        SparseConfig(token_budget=100)
    with pytest.raises(ValueError, match=r"\(32 tokens = 2 blocks\) must cover sink_blocks \+ local_blocks"):
        SparseConfig(token_budget=32, sink_blocks=1, local_blocks=2)
    with pytest.raises(TypeError, match=r"SparseConfig.mode must be a SparseMode, got 'quest'"):
        SparseConfig(mode="quest")
    with pytest.raises(TypeError, match=r"SparseConfig.group_score must be a GroupScore, got 'sum'"):
        SparseConfig(group_score="sum")


def test_retrieval_heads_round_trip_and_validate(tmp_path) -> None:  # noqa: ANN001
    heads = RetrievalHeads(4, best=(3, 1), worst=(0, 2), extra={"agreement": 0.5})
    heads.save(tmp_path / "heads.json")
    loaded = RetrievalHeads.load(tmp_path / "heads.json")
    assert loaded == heads and loaded.extra == {"agreement": 0.5}
    assert loaded.heads_for(SparseMode.SOLOHEAD_REVERSED) == (0, 2) and loaded.heads_for(SparseMode.QUEST) is None
    with pytest.raises(ValueError, match=r"^RetrievalHeads.best holds \[4\], not KV heads in \[0, 4\)$"):
        RetrievalHeads(4, best=(4, 1), worst=(0, 2))
    (tmp_path / "bad.json").write_text('{"best": [1]}')
    with pytest.raises(ValueError, match=r"lacks \['num_kv_heads', 'worst'\]; write it with `pulseio-engine "):
        RetrievalHeads.load(tmp_path / "bad.json")
