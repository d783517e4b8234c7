"""LocalitySelector: `select_blocks`' output contract, the asked overlap measured back, seeded determinism."""

from __future__ import annotations

import pytest
import torch

from pulseio_engine.config import SparseConfig, SparseMode
from pulseio_engine.evaluation.locality import middle_overlap, packaged_profile
from pulseio_engine.kv.digests import BlockDigests
from pulseio_engine.kv.residency import apply_recall, plan_recall
from pulseio_engine.kv.selection import PAD, BlockSelector, DigestSelector
from pulseio_engine.kv.synthetic_selection import LocalitySelector

CONFIG = SparseConfig(token_budget=512, block_size=16, sink_blocks=1, local_blocks=2)   # K = 32, m = 29
NB = 256                                                                                 # block table width
HQ, D = 4, 8


def _call(selector: BlockSelector, layer: int, num_tokens: torch.Tensor) -> torch.Tensor:
    b = num_tokens.shape[0]
    return selector(layer, torch.zeros(b, HQ, D), torch.zeros(b, NB, dtype=torch.long), num_tokens)


def check_contract(selected: torch.Tensor, num_tokens: torch.Tensor, config: SparseConfig, rows: int) -> None:
    """[B, S, K] int64: ascending real ids then -1, no duplicates, ids < n, sink and local blocks in,
    min(n, K) blocks."""
    b, k = num_tokens.shape[0], config.budget_blocks
    assert selected.shape == (b, rows, k) and selected.dtype == torch.int64
    for i, tokens in enumerate(num_tokens.tolist()):
        n = -(-tokens // config.block_size)
        forced = set(range(min(config.sink_blocks, n))) | set(range(max(n - config.local_blocks, 0), n))
        for row in selected[i].tolist():
            real = [x for x in row if x != PAD]
            assert row == real + [PAD] * (k - len(real)), f"padding only at the end: {row}"
            assert real == sorted(set(real)), f"ascending, no duplicates: {row}"
            assert all(0 <= x < n for x in real), f"ids within the {n} blocks: {row}"
            assert forced <= set(real), f"sink and local blocks {sorted(forced)} missing: {row}"
            assert len(real) == min(n, k)


def test_output_keeps_the_selection_contract_as_contexts_grow() -> None:
    """Short (n < K), exact (n = K), just past K and long rows, 40 steps, a token appended per step."""
    selector = LocalitySelector(CONFIG, [0.7], rows=2, device="cpu", seed=0)
    num_tokens = torch.tensor([100, 32 * 16, 32 * 16 + 1, 3000])
    for step in range(40):
        check_contract(_call(selector, 0, num_tokens + step), num_tokens + step, CONFIG, rows=2)


@pytest.mark.parametrize("overlap", [0.0, 0.3, 0.85, 1.0])
def test_measured_overlap_is_the_asked_one(overlap: float) -> None:
    """The measurement's own definition (`middle_overlap`), over 4 requests x 2 rows x 49 transitions."""
    selector = LocalitySelector(CONFIG, [0.5, overlap], rows=2, device="cpu", seed=3)
    num_tokens = torch.tensor([1500, 2048, 2100, 4000])
    kept = middle = 0
    previous = _call(selector, 1, num_tokens)
    for step in range(1, 50):
        current = _call(selector, 1, num_tokens + step)
        k, m = middle_overlap(previous, current, CONFIG)
        kept, middle, previous = kept + int(k.sum()), middle + int(m.sum()), current
    assert middle > 0
    assert kept / middle == pytest.approx(overlap, abs=0.02)


@pytest.mark.parametrize(("mode", "budget"), [(SparseMode.SOLOHEAD, 1024), (SparseMode.QUEST, 512)])
def test_driven_by_a_shipped_profile_it_recalls_what_the_real_model_did(mode: SparseMode, budget: int) -> None:
    """Through `plan_recall` (hot set = last selection), the selector fetches per step the fraction of the
    budget the real model fetched, layer by layer: what the benchmark relies on."""
    profile = packaged_profile("smollm2", mode, budget)
    config = SparseConfig(mode=mode, token_budget=budget)
    k, rows, b = config.budget_blocks, 3 if mode is SparseMode.QUEST else 1, 2
    selector = LocalitySelector(config, profile.overlap_for(30, 2), rows=rows, device="cpu", seed=0)
    width = (profile.context_len + 64) // 16 + 1
    for layer in (2, 11, 20, 29):
        resident, fetched = torch.full((b * rows, width), -1), 0
        for step in range(41):
            tokens = torch.full((b,), profile.context_len + 1 + step)
            selected = selector(layer, torch.zeros(b, HQ, D), torch.zeros(b, width, dtype=torch.long), tokens)
            plan = plan_recall(selected.reshape(b * rows, k), resident, k)
            fetched += int((plan.blocks >= 0).sum()) if step else 0
            resident = apply_recall(resident, plan)
        measured = profile.recall_fraction[profile.layers.index(layer)]
        assert fetched / (40 * b * rows * k) == pytest.approx(measured, abs=0.01), layer


def test_layers_keep_their_own_history_and_a_new_batch_starts_afresh() -> None:
    selector = LocalitySelector(CONFIG, [1.0, 1.0], rows=1, device="cpu", seed=0)
    tokens = torch.tensor([2048, 3000])
    first = [_call(selector, layer, tokens) for layer in (0, 1)]
    assert not torch.equal(first[0], first[1]), "two layers draw their own first selections"
    assert all(torch.equal(_call(selector, layer, tokens), first[layer]) for layer in (0, 1)), "overlap 1 keeps all"
    regrown = _call(selector, 0, tokens[:1])          # another batch size: no history to keep
    assert not torch.equal(regrown, first[0][:1])


def test_same_seed_same_selections_other_seed_others() -> None:
    def run(seed: int) -> list[torch.Tensor]:
        selector = LocalitySelector(CONFIG, [0.6], rows=2, device="cpu", seed=seed)
        return [_call(selector, 0, torch.tensor([2048, 3000]) + step) for step in range(5)]

    assert all(torch.equal(a, b) for a, b in zip(run(7), run(7)))
    assert not all(torch.equal(a, b) for a, b in zip(run(7), run(8)))
    selector = LocalitySelector(CONFIG, [0.6], rows=2, device="cpu", seed=7)
    once = [_call(selector, 0, torch.tensor([2048, 3000]) + step) for step in range(5)]
    selector.reset()
    again = [_call(selector, 0, torch.tensor([2048, 3000]) + step) for step in range(5)]
    assert all(torch.equal(a, b) for a, b in zip(once, again)), "reset() restarts from the seed"


def test_digest_and_locality_selectors_answer_the_same_call() -> None:
    digests = BlockDigests(num_layers=1, num_blocks=NB, num_kv_heads=2, head_dim=D, block_size=16,
                           dtype=torch.float32, device="cpu")
    num_tokens = torch.tensor([700, 2000])
    for selector, rows in ((DigestSelector(digests, CONFIG), 2),
                           (LocalitySelector(CONFIG, [0.5], rows=2, device="cpu"), 2)):
        check_contract(_call(selector, 0, num_tokens), num_tokens, CONFIG, rows=rows)


def test_bad_overlaps_and_rows_are_refused() -> None:
    rule = r"^LocalitySelector overlap fractions must be numbers in \[0, 1\], got \[1.5\]$"
    with pytest.raises(ValueError, match=rule):
        LocalitySelector(CONFIG, [0.5, 1.5], rows=1, device="cpu")
    with pytest.raises(ValueError, match="rows must be an int >= 1, got 0"):
        LocalitySelector(CONFIG, [0.5], rows=0, device="cpu")
    with pytest.raises(IndexError, match="layer 3 has no overlap fraction"):
        _call(LocalitySelector(CONFIG, [0.5], rows=1, device="cpu"), 3, torch.tensor([2048]))


@pytest.mark.gpu
def test_no_host_sync_on_cuda() -> None:
    selector = LocalitySelector(CONFIG, [0.5], rows=2, device="cuda", seed=0)
    num_tokens = torch.tensor([2048, 3000], device="cuda")
    tables = torch.zeros(2, NB, dtype=torch.long, device="cuda")
    q = torch.zeros(2, HQ, D, device="cuda")
    selector(0, q, tables, num_tokens)              # first call: allocations, kernels loaded
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(3):
            selector(0, q, tables, num_tokens + step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    check_contract(selector(0, q, tables, num_tokens).cpu(), num_tokens.cpu(), CONFIG, rows=2)
