"""The fused selection (`kv/fused_selection.py`): its torch reference against the definitions, its Triton
kernels against the reference under TRITON_INTERPRET=1 (a child process; only where there is no CUDA
device and Triton is installed), and on a GPU in bf16 (`-m gpu`). Steering's property, the measured overlap,
is checked here too (the benchmark's selection on random weights)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from fused_selection_cases import CASES, gpu_specs, run_case
from sparse_reference import ref_steer

from pulseio_engine.config import GroupScore, SparseConfig, SparseMode
from pulseio_engine.evaluation.locality import middle_overlap, packaged_profile
from pulseio_engine.kv.digests import BlockDigests
from pulseio_engine.kv.fused_selection import (
    Arrivals,
    HotRecall,
    NewToken,
    Steering,
    score_blocks,
    select_blocks_fused,
)
from pulseio_engine.kv.selection import select_blocks, select_for_layer
from pulseio_engine.kv.steering import keep_threshold, mix32, steer_block_hash, steer_kept, steer_key, steered_scores

CASES_SCRIPT = Path(__file__).with_name("fused_selection_cases.py")
ROOT = Path(__file__).resolve().parents[2]


def _buffers(b: int, s: int, nb: int, k: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    return {"mask": torch.zeros((b, s, nb), dtype=torch.uint8, device=device),
            "table": torch.empty((b, s, k), dtype=torch.int32, device=device),
            "context_lens": torch.empty((b, s), dtype=torch.int32, device=device)}


@pytest.mark.parametrize("rule", list(GroupScore))
@pytest.mark.parametrize("heads", [None, (1, 0)])
def test_reference_equals_select_for_layer(rule: GroupScore, heads: tuple[int, ...] | None) -> None:
    """score_blocks + select_blocks_fused on CPU is select_for_layer, bit for bit, straight from the paged
    digests; PAGED's table is the selected blocks' physical ids, padded with the row's first."""
    gen = torch.Generator().manual_seed(0)
    config = SparseConfig(token_budget=6 * 16, sink_blocks=1, local_blocks=2, group_score=rule)
    digests = BlockDigests(num_layers=2, num_blocks=40, num_kv_heads=2, head_dim=8, block_size=16,
                           dtype=torch.float32, device="cpu", heads=heads)
    digests.max.normal_(generator=gen)
    digests.min.copy_(digests.max - torch.rand(digests.max.shape, generator=gen))
    tables = torch.randint(0, 40, (3, 12), generator=gen)
    num_tokens = torch.tensor([12 * 16, 40, 100])
    q = torch.randn((3, 6, 8), generator=gen)
    for layer in range(2):
        head = None if heads is None else heads[layer]
        bounds = score_blocks(q, digests.max[layer], digests.min[layer], tables, num_kv_heads=2, head=head, rule=rule)
        out = _buffers(3, bounds.shape[1], 12, 6)
        got = select_blocks_fused(bounds, num_tokens, config, block_tables=tables, **out)
        assert torch.equal(got, select_for_layer(digests, layer, q, tables, num_tokens, config))
        assert torch.equal(out["table"].long(), tables.gather(1, got.clamp(min=0).flatten(1)).view_as(got))
        assert torch.equal(out["mask"].sum(2), (got >= 0).sum(2).to(torch.uint8))


def test_reference_steering_is_its_definition() -> None:
    """steered_scores + select_blocks against the plain-Python definition, with many ties (integer scores),
    over all three cases (enough kept blocks, enough kept and fresh ones, too few of both)."""
    gen = torch.Generator().manual_seed(1)
    config = SparseConfig(token_budget=10 * 16, sink_blocks=2, local_blocks=1)
    cases = set()
    for trial in range(60):
        nb = int(torch.randint(8, 40, (1,), generator=gen))
        num_tokens = torch.randint(1, nb * 16 + 1, (3,), generator=gen)
        scores = torch.randint(-2, 3, (3, 2, nb), generator=gen).float()
        prev = torch.rand((3, 2, nb), generator=gen) < float(torch.rand((1,), generator=gen))
        kept = prev & (torch.rand((3, 2, nb), generator=gen) < float(torch.rand((1,), generator=gen)))
        got = select_blocks(steered_scores(scores, num_tokens, prev, kept, config), num_tokens, config)
        for i in range(3):
            n = -(-int(num_tokens[i]) // 16)
            for s in range(2):
                stale = {j for j in prev[i, s].nonzero()[:, 0].tolist() if 2 <= j < n - 1}
                keep = {j for j in kept[i, s].nonzero()[:, 0].tolist() if j in stale}
                fresh = n - 3 - len(stale)
                if n > 10:
                    cases.add(0 if len(keep) >= 7 else 1 if len(keep) + fresh >= 7 else 2)
                want = ref_steer(scores[i, s].tolist(), int(num_tokens[i]), stale, keep, config)
                assert got[i, s].tolist() == want, (trial, i, s)
    assert cases == {0, 1, 2}, "every case of the definition was drawn"


def test_steering_hash_is_murmur_finalizer_of_key_row_call_and_block() -> None:
    calls = torch.tensor([[0, 7], [2**33 + 5, 3]])
    key = steer_key(3, 11)
    u = steer_block_hash(key, calls, 5)
    for row, c in enumerate(calls.flatten().tolist()):
        h = mix32(mix32(key ^ row) ^ (c & 0xFFFFFFFF))
        for block in range(5):
            assert u.flatten(0, 1)[row, block].item() == mix32(h ^ block) >> 8


def test_each_stale_block_is_kept_with_the_asked_probability() -> None:
    """kept = u * #stale < T: over many draws, min(#stale, overlap * m) stale blocks on average."""
    config = SparseConfig(token_budget=32 * 16, sink_blocks=1, local_blocks=2)           # m = 29
    prev = torch.zeros((64, 1, 100), dtype=torch.bool)
    prev[:, :, 10:60] = True                                                              # 50 stale
    num_tokens = torch.full((64,), 100 * 16)
    for overlap, want in ((0.5, 14.5), (1.0, 29.0)):
        counts = [steer_kept(prev, num_tokens, steer_block_hash(steer_key(0, 0), torch.full((64, 1), call), 100),
                             keep_threshold(overlap, config), config).sum(2).float().mean().item()
                  for call in range(20)]
        assert sum(counts) / len(counts) == pytest.approx(want, rel=0.03)


CONFIG = SparseConfig(token_budget=512, block_size=16, sink_blocks=1, local_blocks=2)    # K = 32, m = 29
NB = 256


def _hot_set(b: int, rows: int, nb: int, k: int, h: int) -> HotRecall:
    """An empty hot set of h entries a row (device slots 0, 1, ...), recall buffers for B * S * K pairs."""
    return HotRecall(resident=torch.full((b, rows, nb), -1), owner=torch.full((b, rows, h), -1),
                     hot=torch.arange(b * rows * h).view(b, rows, h), age=torch.zeros((b, rows, h), dtype=torch.int32),
                     host_map=torch.zeros((b, rows, nb), dtype=torch.long),
                     recall_ids=torch.empty(b * rows * k, dtype=torch.long),
                     recall_dst=torch.empty(b * rows * k, dtype=torch.long), count=torch.zeros(1, dtype=torch.long),
                     write_slot=torch.empty((b, rows), dtype=torch.long))


def _steered(num_tokens: torch.Tensor, overlap: float, rows: int, state: dict, *, config: SparseConfig = CONFIG,
             nb: int = NB, layer: int = 0, seed: int = 0, hot: HotRecall | None = None,
             rewarm: float = 0.0, ahead: float = 0.0, prefetched: torch.Tensor | None = None) -> torch.Tensor:
    """One reference call with random scores (as random weights make them), steered; `state` keeps the
    row's mask and call counter between calls."""
    b, k = num_tokens.shape[0], config.budget_blocks
    gen = state.setdefault("gen", torch.Generator().manual_seed(seed + 100 * layer))
    state.setdefault("mask", torch.zeros((b, rows, nb), dtype=torch.uint8))
    state.setdefault("calls", torch.zeros((b, rows), dtype=torch.int64))
    bounds = torch.randn((b, rows, 1, nb), generator=gen)
    tables = torch.zeros((b, nb), dtype=torch.long) if hot is None else None
    return select_blocks_fused(bounds, num_tokens, config, mask=state["mask"],
                               table=torch.empty((b, rows, k), dtype=torch.int32),
                               context_lens=torch.empty((b, rows), dtype=torch.int32), block_tables=tables, hot=hot,
                               steer=Steering(overlap, state["calls"], seed=seed, layer=layer, rewarm=rewarm,
                                              ahead=ahead, prefetched=prefetched))


@pytest.mark.parametrize("overlap", [0.0, 0.3, 0.85, 1.0])
def test_steered_overlap_is_the_asked_one(overlap: float) -> None:
    """The measurement's own definition (`middle_overlap`), 4 requests x 2 rows x 49 transitions: the mean
    overlap of the middle blocks with the previous step's selection is overlap * m / m."""
    state: dict = {}
    num_tokens = torch.tensor([1500, 2048, 2100, 4000])
    kept = middle = 0
    previous = _steered(num_tokens, overlap, 2, state)
    for step in range(1, 50):
        current = _steered(num_tokens + step, overlap, 2, state)
        k, m = middle_overlap(previous, current, CONFIG)
        kept, middle, previous = kept + int(k.sum()), middle + int(m.sum()), current
    assert middle > 0
    assert kept / middle == pytest.approx(overlap, abs=0.02)


def test_steering_keeps_the_selection_contract_and_short_rows_select_everything() -> None:
    state: dict = {}
    num_tokens = torch.tensor([100, 32 * 16, 32 * 16 + 1, 3000])
    for step in range(20):
        got = _steered(num_tokens + step, 0.7, 2, state)
        for i, n in enumerate(((num_tokens + step + 15) // 16).tolist()):
            for row in got[i].tolist():
                real = [x for x in row if x >= 0]
                assert real == sorted(set(real)) and row[len(real):] == [-1] * (len(row) - len(real))
                assert {0, n - 2, n - 1} <= set(real) and len(real) == min(n, 32)
                assert n > 32 or real == list(range(n))


def test_same_seed_same_steering_other_seed_or_layer_other() -> None:
    def run(seed: int, layer: int) -> list[torch.Tensor]:
        state: dict = {"gen": torch.Generator().manual_seed(0)}
        return [_steered(torch.tensor([2048, 3000]) + step, 0.6, 2, state, seed=seed, layer=layer) for step in range(6)]

    assert all(torch.equal(a, b) for a, b in zip(run(7, 0), run(7, 0)))
    assert not all(torch.equal(a, b) for a, b in zip(run(7, 0), run(8, 0)))
    assert not all(torch.equal(a, b) for a, b in zip(run(7, 0), run(7, 1)))


@pytest.mark.parametrize(("mode", "budget"), [(SparseMode.SOLOHEAD, 1024), (SparseMode.QUEST, 512)])
def test_steered_hot_rows_recall_what_the_real_model_did(mode: SparseMode, budget: int) -> None:
    """Driven by a shipped locality profile, HOT mode recalls per step the fraction of the budget the real
    model recalled, layer by layer: what the benchmark relies on."""
    profile = packaged_profile("smollm2", mode, budget)
    config = SparseConfig(mode=mode, token_budget=budget)
    k, rows, b = config.budget_blocks, 3 if mode is SparseMode.QUEST else 1, 2
    nb = (profile.context_len + 64) // 16 + 1
    overlap = profile.overlap_for(30, 2)
    for layer in (2, 11, 20, 29):
        hot = _hot_set(b, rows, nb, k, k)
        state: dict = {}
        fetched = 0
        for step in range(41):
            hot.count.zero_()                  # score_blocks(count=...) does this in the engine
            _steered(torch.full((b,), profile.context_len + 1 + step), overlap[layer], rows, state, config=config,
                     nb=nb, layer=layer, hot=hot)
            fetched += int(hot.count) if step else 0
        measured = profile.recall_fraction[profile.layers.index(layer)]
        assert fetched / (40 * b * rows * k) == pytest.approx(measured, abs=0.01), layer


@pytest.mark.parametrize(("mode", "budget", "factor"), [(SparseMode.SOLOHEAD, 1024, 2.0),
                                                      (SparseMode.QUEST, 1024, 1.5), (SparseMode.SOLOHEAD, 2048, 4.0)])
def test_rewarmed_hot_sets_recall_what_the_real_model_did_through_them(mode: SparseMode, budget: int,
                                                                      factor: float) -> None:
    """A hot set of `factor` budgets (least recently selected out), steered by a shipped 8K profile's overlap and
    rewarm: HOT mode recalls per step what the real model's selections recalled through the same hot set (the
    locality tool's simulation), layer by layer, less than a hot set of one budget would."""
    profile = packaged_profile("qwen2.5-coder-0.5b", mode, budget, context_len=8192)
    config = SparseConfig(mode=mode, token_budget=budget)
    k, rows, b = config.budget_blocks, 2 if mode is SparseMode.QUEST else 1, 2
    nb = (profile.context_len + 64) // 16 + 1
    overlap, rewarm = profile.overlap_for(24, 0), profile.rewarm_for(24, 0, factor)
    for layer in (1, 12, 23):
        hot = _hot_set(b, rows, nb, k, math.ceil(factor * k))
        state: dict = {}
        fetched = 0
        for step in range(60):                 # 20 steps fill the hot set, 40 are counted
            hot.count.zero_()
            _steered(torch.full((b,), profile.context_len + 1 + step), overlap[layer], rows, state, config=config,
                     nb=nb, layer=layer, hot=hot, rewarm=rewarm[layer])
            fetched += int(hot.count) if step >= 20 else 0
        at = profile.layers[round(layer * (len(profile.layers) - 1) / 23)]
        want = profile.hot_fetch(factor)[profile.layers.index(at)]
        assert fetched / (40 * b * rows * k) == pytest.approx(want, abs=0.012), layer
        assert want < profile.recall_fraction[profile.layers.index(at)]      # (what one budget recalls)


@pytest.mark.parametrize("brought", [True, False])
def test_ahead_finds_its_share_of_the_recall_among_the_blocks_a_prediction_brought(brought: bool) -> None:
    """Each step a prediction (random scores, as random weights give, keeping the previous selection as the step does,
    its state in scratch) is planned into the hot set first, as `OffloadBatch.prefetch` does; then the step, steered
    with `ahead`, recalls (1 - ahead) of what the same steps recall without it. A prediction that brought nothing
    (its mask zeroed) saves nothing: the share comes only from the blocks it brought."""
    profile = packaged_profile("qwen2.5-coder-0.5b", SparseMode.SOLOHEAD, 1024, context_len=8192)
    config = SparseConfig(mode=SparseMode.SOLOHEAD, token_budget=1024)
    k, b, layer, ahead = config.budget_blocks, 4, 12, 0.72
    nb = (profile.context_len + 64) // 16 + 1
    overlap, rewarm = profile.overlap_for(24, 0)[layer], profile.rewarm_for(24, 0, 1.5)[layer]
    fetched = {}
    for prefetching in (False, True):
        hot, state, fetched[prefetching] = _hot_set(b, 1, nb, k, math.ceil(1.5 * k)), {}, 0
        guess: dict = {"gen": torch.Generator().manual_seed(7)}
        for step in range(50):                 # 20 steps fill the hot set, 30 are counted
            tokens = torch.full((b,), profile.context_len + 1 + step)
            if prefetching:
                guess.update(mask=state["mask"].clone() if "mask" in state else None,
                             calls=state["calls"].clone() if "calls" in state else None)
                guess = {key: v for key, v in guess.items() if v is not None}
                _steered(tokens, overlap, 1, guess, config=config, nb=nb, layer=layer, hot=hot)
                if not brought:
                    guess["mask"].zero_()
            hot.count.zero_()
            _steered(tokens, overlap, 1, state, config=config, nb=nb, layer=layer, hot=hot, rewarm=rewarm,
                     ahead=ahead if prefetching else 0.0, prefetched=guess.get("mask") if prefetching else None)
            fetched[prefetching] += int(hot.count) if step >= 20 else 0
    if brought:
        assert fetched[True] / fetched[False] == pytest.approx(1 - ahead, abs=0.06), fetched
    else:
        assert fetched[True] == pytest.approx(fetched[False], rel=0.06), fetched


def test_least_recently_selected_entries_leave_first() -> None:
    """A hot set of 4 entries, K = 3 (the last block local, 2 middle slots): a block to recall takes an empty entry,
    else the one whose block was selected longest ago, whatever its index (lowest index first would differ at
    step 3); ages count the calls since."""
    config = SparseConfig(token_budget=3 * 16, sink_blocks=0, local_blocks=1)
    hot = _hot_set(1, 1, 8, 3, 4)
    owners = []
    for middle in [(0, 1), (0, 2), (0, 3), (1, 3), (2, 3)]:
        bounds = torch.full((1, 1, 1, 8), -1.0)
        bounds[0, 0, 0, list(middle)] = 1.0
        hot.count.zero_()
        select_blocks_fused(bounds, torch.tensor([8 * 16]), config, **_buffers(1, 1, 8, 3), hot=hot)
        owners.append(hot.owner[0, 0].tolist())
    assert owners == [[0, 1, 7, -1], [0, 1, 7, 2], [0, 3, 7, 2], [0, 3, 7, 1], [2, 3, 7, 1]]
    assert hot.age[0, 0].tolist() == [0, 0, 0, 1]


def test_arrivals_split_the_table_into_resident_and_recalled_blocks() -> None:
    """HOT with Arrivals (the reference): the same selection, plan and state as without; the table's entries dealt
    into the blocks resident before the call and those recalled, each in block order, and the tokens with them:
    the recalled ones are exactly the recall's device slots, and the block being written counts its tokens so far
    in whichever table holds it."""
    config = SparseConfig(token_budget=8 * 16, sink_blocks=1, local_blocks=2)
    b, rows, nb, k = 3, 2, 40, config.budget_blocks
    gen = torch.Generator().manual_seed(4)
    resident, owner = torch.full((b, rows, nb), -1), torch.full((b, rows, k), -1)
    for i in range(b):                                           # some blocks resident, the last one of row 0
        for j in range(rows):
            blocks = torch.randperm(nb, generator=gen)[:5]
            resident[i, j, blocks], owner[i, j, :5] = torch.arange(5), blocks
    num_tokens = torch.tensor([37 * 16 + 5, 6 * 16, 20 * 16 + 1])
    bounds = torch.randn((b, rows, 1, nb), generator=gen)
    slots = 100 + torch.randperm(b * rows * k, generator=gen).view(b, rows, k)
    sides = []
    for split in (False, True):
        hot = HotRecall(resident=resident.clone(), owner=owner.clone(), hot=slots,
                        age=torch.zeros((b, rows, k), dtype=torch.int32),
                        host_map=torch.arange(b * rows * nb).view(b, rows, nb),
                        recall_ids=torch.full((b * rows * k,), -1), recall_dst=torch.full((b * rows * k,), -1),
                        count=torch.zeros(1, dtype=torch.long), write_slot=torch.empty((b, rows), dtype=torch.long),
                        arrivals=Arrivals(torch.full((b, rows, k), -7, dtype=torch.int32),
                                          torch.full((b, rows), -7, dtype=torch.int32)) if split else None)
        out = _buffers(b, rows, nb, k)
        selected = select_blocks_fused(bounds, num_tokens, config, **out, hot=hot)
        sides.append((selected, out, hot))
    (whole_sel, whole, whole_hot), (sel, part, hot) = sides
    assert torch.equal(whole_sel, sel) and torch.equal(whole_hot.resident, hot.resident)
    assert torch.equal(whole_hot.recall_ids, hot.recall_ids) and int(hot.count) > 0
    recalled = set(hot.recall_dst[:int(hot.count)].tolist())
    for i in range(b):
        for j in range(rows):
            n_sel = int((sel[i, j] >= 0).sum())
            n_arr = sum(1 for x in whole["table"][i, j, :n_sel].tolist() if x in recalled)
            table = whole["table"][i, j, :n_sel].tolist()
            assert part["table"][i, j, :n_sel - n_arr].tolist() == [x for x in table if x not in recalled]
            assert hot.arrivals.table[i, j, :n_arr].tolist() == [x for x in table if x in recalled]
            lens = int(part["context_lens"][i, j]), int(hot.arrivals.context_lens[i, j])
            assert sum(lens) == int(whole["context_lens"][i, j])
            written_arrives = table[-1] in recalled
            assert lens[1 if written_arrives else 0] % 16 == (int(num_tokens[i]) - 1) % 16 + 1 or \
                (int(num_tokens[i]) % 16 == 0), "the block being written is the partial one"
            assert lens[0 if written_arrives else 1] % 16 == 0


def test_select_states_what_it_takes() -> None:
    bounds = torch.zeros((2, 1, 1, 8))
    out = _buffers(2, 1, 8, 4)
    config = SparseConfig(token_budget=64)
    with pytest.raises(ValueError, match=r"^select_blocks_fused takes block_tables \(PAGED"):
        select_blocks_fused(bounds, torch.tensor([5, 9]), config, **out)
    with pytest.raises(ValueError, match=r"^group_score SUM takes bounds \[B, S, 1, NB\], got C = 3"):
        select_blocks_fused(torch.zeros((2, 1, 3, 8)), torch.tensor([5, 9]), config, block_tables=torch.zeros(2, 8),
                            **out)
    with pytest.raises(ValueError, match=r"^table must be \[B, S, K\] = \[2, 1, 4\] int32"):
        select_blocks_fused(bounds, torch.tensor([5, 9]), config, block_tables=torch.zeros(2, 8),
                            **dict(out, table=torch.zeros((2, 1, 4), dtype=torch.long)))
    with pytest.raises(ValueError, match=r"^Steering wants calls \[B, S\] = \[2, 1\], an overlap, a rewarm and an "
                                         r"ahead in \[0, 1\], got \[2, 1\], 1.5, 0.0 and 0.0$"):
        select_blocks_fused(bounds, torch.tensor([5, 9]), config, block_tables=torch.zeros(2, 8), **out,
                            steer=Steering(1.5, torch.zeros((2, 1), dtype=torch.long)))
    with pytest.raises(ValueError, match=r"^Steering.rewarm \(0.5\) brings blocks back from a hot set: HOT mode only"):
        select_blocks_fused(bounds, torch.tensor([5, 9]), config, block_tables=torch.zeros(2, 8), **out,
                            steer=Steering(0.5, torch.zeros((2, 1), dtype=torch.long), rewarm=0.5))
    hot = _hot_set(2, 1, 8, 4, 4)
    for prefetched in (None, torch.zeros((2, 1, 7), dtype=torch.uint8)):
        with pytest.raises(ValueError, match=r"^Steering.ahead \(0.5\) refills from the blocks a prediction recalled "
                                             r"into a hot set: HOT mode, with prefetched \[B, S, NBW\] = \[2, 1, 8\]"):
            select_blocks_fused(bounds, torch.tensor([5, 9]), config, **out, hot=hot,
                                steer=Steering(0.5, torch.zeros((2, 1), dtype=torch.long), ahead=0.5,
                                               prefetched=prefetched))
    with pytest.raises(ValueError, match=r"^HotRecall wants .* \[B, S, H\] with H >= K = 4 \(got hot \[2, 1, 3\]"):
        select_blocks_fused(bounds, torch.tensor([5, 9]), config, **out,
                            hot=replace(hot, hot=hot.hot[..., :3], owner=hot.owner[..., :3], age=hot.age[..., :3]))
    with pytest.raises(ValueError, match=r"^HotRecall wants .* age \[2, 1, 4\] torch.int64\)"):
        select_blocks_fused(bounds, torch.tensor([5, 9]), config, **out, hot=replace(hot, age=hot.age.long()))
    with pytest.raises(ValueError, match=r"^digests of width 1 need head given \(W = 1\) or W = Hkv \(2\)$"):
        score_blocks(torch.zeros((2, 6, 8)), torch.zeros((9, 1, 8)), torch.zeros((9, 1, 8)),
                     torch.zeros((2, 8), dtype=torch.long), num_kv_heads=2, head=None, rule=GroupScore.SUM)


# ---- the Triton kernels under the interpreter (CPU) --------------------------------------------------------------

@pytest.fixture(scope="module")
def interpreted() -> dict:
    if torch.cuda.is_available():
        pytest.skip("interpreter tests are for CPU machines; the gpu tests cover the compiled kernels")
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, str(CASES_SCRIPT)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.needs_package("triton")
@pytest.mark.parametrize("name", list(CASES))
def test_interpreted_kernels_match_the_reference(interpreted: dict, name: str) -> None:
    result = interpreted[name]
    assert "error" not in result, result.get("error")
    _assert_case(name, CASES[name], result)


def _assert_case(name: str, spec, result: dict) -> None:  # noqa: ANN001
    failed = {check: problem for check, problem in result["checks"].items() if problem is not None}
    assert not failed, failed
    assert "selected" in result["checks"] and "bounds" in result["checks"]
    if spec.mode == "hot" and spec.zero_count:
        assert result["stats"]["recalled"] > 0, result["stats"]
        if (spec.hot or 0) < spec.nb:                        # (a hot set as wide as the table never evicts)
            assert result["stats"]["evicted"] > 0, result["stats"]
    if spec.steps > 1:
        assert result["stats"]["reselected"] > 0, result["stats"]
    if spec.mode == "hot" and (spec.hot or 0) > spec.budget:
        assert result["stats"]["kept_unselected"] > 0, result["stats"]
    if spec.ahead:
        assert result["stats"]["prefetched_hits"] > 0, result["stats"]


# ---- on a GPU -------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", list(gpu_specs()))
def test_gpu_kernels_match_the_reference(name: str) -> None:
    spec = gpu_specs()[name]
    _assert_case(name, spec, run_case(spec, "cuda"))


@pytest.mark.gpu
def test_gpu_steered_overlap_is_the_asked_one() -> None:
    """The kernel's steering over 40 steps of qwen3-14b-like rows: the measured overlap is the asked one."""
    b, rows, nb, overlap = 4, 8, 2048, 0.85
    config = SparseConfig(token_budget=128 * 16)
    mask = torch.zeros((b, rows, nb), dtype=torch.uint8, device="cuda")
    calls = torch.zeros((b, rows), dtype=torch.int64, device="cuda")
    out = _buffers(b, rows, nb, 128, "cuda")
    out.pop("mask")
    tables = torch.zeros((b, nb), dtype=torch.long, device="cuda")
    num_tokens = torch.tensor([20000, 25000, 30000, 32000], device="cuda")
    previous, kept, middle = None, 0, 0
    for step in range(40):
        bounds = torch.randn((b, rows, 1, nb), device="cuda")
        current = select_blocks_fused(bounds, num_tokens + step, config, mask=mask, block_tables=tables,
                                      steer=Steering(overlap, calls, seed=1, layer=5), **out)
        if previous is not None:
            k, m = middle_overlap(previous.cpu(), current.cpu(), config)
            kept, middle = kept + int(k.sum()), middle + int(m.sum())
        previous = current.clone()
    assert kept / middle == pytest.approx(overlap, abs=0.01)
    assert int(calls.min()) == int(calls.max()) == 40


@pytest.mark.gpu
def test_gpu_no_host_sync_and_a_cuda_graph_replays_it() -> None:
    """score + select (HOT, steered, the new token written) run eagerly with sync debug mode on 'error', and
    a captured graph of both, replayed step after step, leaves exactly the state the eager calls leave."""
    eager, graphed = _GraphCase(), _GraphCase()
    _GraphCase().step()                                  # compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(4):
            eager.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        graphed.step(advance=False)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(4):
        graph.replay()
        graphed.num_tokens.add_(5)
    torch.cuda.synchronize()
    for name, value in eager.state().items():
        assert torch.equal(value, graphed.state()[name]), name


class _GraphCase:
    """One HOT, steered layer of 4 requests x 8 rows (qwen3-14b's heads), its state on the GPU."""

    def __init__(self) -> None:
        gen = torch.Generator(device="cuda").manual_seed(0)
        b, hkv, d, nb, self.k, dev = 4, 8, 128, 512, 64, "cuda"
        self.config = SparseConfig(token_budget=self.k * 16)
        bf16 = dict(dtype=torch.bfloat16, device=dev)
        self.q = torch.randn((b, 5 * hkv, d), generator=gen, **bf16)
        self.dmax = torch.randn((3 * nb, hkv, d), generator=gen, **bf16)
        self.dmin = self.dmax - torch.rand((3 * nb, hkv, d), generator=gen, **bf16)
        self.tables = torch.randint(0, 3 * nb, (b, nb), generator=gen, device=dev, dtype=torch.int32)
        self.num_tokens = torch.tensor([8000, 7000, 5000, 900], device=dev)
        long = dict(dtype=torch.int64, device=dev)
        k = self.k
        self.t = {"resident": torch.full((b, hkv, nb), -1, **long), "owner": torch.full((b, hkv, 2 * k), -1, **long),
                  "hot": 1 + torch.randperm(b * hkv * 2 * k, generator=gen, device=dev).view(b, hkv, 2 * k),
                  "age": torch.zeros((b, hkv, 2 * k), dtype=torch.int32, device=dev),
                  "host_map": torch.randint(1, 10**6, (b, hkv, nb), generator=gen, **long),
                  "recall_ids": torch.zeros(b * hkv * k, **long), "recall_dst": torch.zeros(b * hkv * k, **long),
                  "count": torch.zeros(1, **long), "write_slot": torch.zeros((b, hkv), **long),
                  "pool": torch.zeros((1 + b * hkv * 2 * k, 2, 16, 1, d), **bf16),
                  "k": torch.randn((b, hkv, d), generator=gen, **bf16),
                  "v": torch.randn((b, hkv, d), generator=gen, **bf16),
                  "mask": torch.zeros((b, hkv, nb), dtype=torch.uint8, device=dev),
                  "calls": torch.zeros((b, hkv), **long),
                  "bounds": torch.empty((b, hkv, 1, nb), dtype=torch.float32, device=dev),
                  "selected": torch.empty((b, hkv, k), **long),
                  "table": torch.empty((b, hkv, k), dtype=torch.int32, device=dev),
                  "context_lens": torch.empty((b, hkv), dtype=torch.int32, device=dev)}

    def step(self, advance: bool = True) -> None:
        t = self.t
        hot = HotRecall(resident=t["resident"], owner=t["owner"], hot=t["hot"], age=t["age"], host_map=t["host_map"],
                        recall_ids=t["recall_ids"], recall_dst=t["recall_dst"], count=t["count"],
                        write_slot=t["write_slot"], new_token=NewToken(t["k"], t["v"], t["pool"]))
        score_blocks(self.q, self.dmax, self.dmin, self.tables, num_kv_heads=8, head=None, rule=GroupScore.SUM,
                     count=t["count"], out=t["bounds"])
        select_blocks_fused(t["bounds"], self.num_tokens, self.config, mask=t["mask"], table=t["table"],
                            context_lens=t["context_lens"], hot=hot,
                            steer=Steering(0.8, t["calls"], seed=2, layer=4, rewarm=0.5),
                            out=t["selected"])
        if advance:
            self.num_tokens.add_(5)

    def state(self) -> dict[str, torch.Tensor]:
        n = int(self.t["count"])
        pairs = torch.stack([self.t["recall_ids"][:n], self.t["recall_dst"][:n]]).T.tolist()
        state = {name: v for name, v in self.t.items() if name not in ("recall_ids", "recall_dst")}
        return dict(state, pairs=torch.tensor(sorted(pairs)))
