"""`pulseio-engine eval-summary`: several eval-table folders as one grid, the gap to full attention, the plot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pulseio_engine.cli import main
from pulseio_engine.evaluation.summary import DuplicateRecordError, Gap, Replaced, combine, gaps


def _record(task: str, mode: str, score: float, *, n: int = 4096, budget: int | None = None,
            model: str = "m", rule: str | None = "sum") -> dict:
    record = {"task": task, "mode": mode, "score": score, "context_len": n, "model": model, "samples": 20,
              "token_budget": n if budget is None else budget}
    if mode != "vanilla" and rule is not None:
        record["group_score"] = rule
    return record


def _folder(path: Path, records: list[dict]) -> Path:
    path.mkdir()
    for i, r in enumerate(records):
        (path / f"{i}.json").write_text(json.dumps(r))
    (path / "heads.json").write_text("{}")        # not a record: skipped
    return path


def test_a_cell_in_several_folders_keeps_the_last_folders_record(tmp_path: Path) -> None:
    old = _folder(tmp_path / "old", [_record("niah-single", "vanilla", 1.0), _record("niah-single", "quest", 0.4,
                                                                                     budget=512)])
    new = _folder(tmp_path / "new", [_record("niah-single", "quest", 0.7, budget=512)])
    grid = combine([old, new])
    assert sorted((r["mode"], r["score"], Path(r["folder"]).name) for r in grid.records) == [
        ("quest", 0.7, "new"), ("vanilla", 1.0, "old")]
    assert grid.replaced == [Replaced("m niah-single context 4096 quest budget 512", str(new / "0.json"),
                                      str(old / "1.json"))]
    assert [r["score"] for r in combine([new, old]).records if r["mode"] == "quest"] == [0.4]
    with pytest.raises(FileNotFoundError, match="missing is not a folder"):
        combine([tmp_path / "missing"])


def test_two_records_of_one_cell_in_one_folder_are_refused_naming_both(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = _folder(tmp_path / "run", [_record("niah-single", "vanilla", 1.0),
                                     _record("niah-single", "solohead", 0.9, budget=512),
                                     _record("niah-single", "solohead", 0.6, budget=512)])
    message = (f"{run} holds two records of one cell (m niah-single context 4096 solohead budget 512): 1.json and "
               "2.json; keep one there")
    with pytest.raises(DuplicateRecordError, match=re.escape(message)):
        combine([run])
    assert main(["eval-summary", str(run)]) == 2
    assert message in capsys.readouterr().err


def test_cli_says_which_record_of_a_cell_it_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _folder(tmp_path / "old", [_record("niah-single", "vanilla", 1.0),
                                     _record("niah-single", "solohead", 0.4, budget=512)])
    new = _folder(tmp_path / "new", [_record("niah-single", "solohead", 0.7, budget=512)])
    out = tmp_path / "summary.md"
    assert main(["eval-summary", str(old), str(new), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert (f"note: m niah-single context 4096 solohead budget 512 has records in several folders: using "
            f"{new / '0.json'}, not {old / '1.json'}") in captured.err
    cell = "m niah-single context 4096 solohead budget 512"
    assert f"- {cell}: {new / '0.json'}, not {old / '1.json'}" in out.read_text()
    assert "| 4096 | 512 | 1.00 | 0.70 |" in captured.out


def test_gap_counts_scored_cells_where_full_reaches_the_floor_and_names_the_missing_ones() -> None:
    records = [
        _record("niah-single", "vanilla", 1.0), _record("common-words", "vanilla", 0.8),
        _record("variable-tracking", "vanilla", 0.3),                      # under the floor: not counted
        _record("perplexity", "vanilla", 30.0), _record("perplexity", "solohead", 35.0, budget=512),
        _record("niah-single", "solohead", 0.9, budget=512), _record("niah-single", "solohead", 1.0, budget=1024),
        _record("common-words", "solohead", 0.6, budget=512),             # 1024 not run: missing
        _record("variable-tracking", "solohead", 0.0, budget=512),
        _record("niah-single", "quest", 0.5, budget=512),
        _record("niah-single", "vanilla", 1.0, n=1024), _record("niah-single", "quest", 1.0, n=1024, budget=512),
    ]
    by_mode = {g.mode: g for g in gaps(records)}
    solo = by_mode["solohead"]
    assert solo == Gap("m", "solohead", pytest.approx(100 * (-0.1 + 0.0 - 0.2) / 3), 3,
                       ("1024/512/niah-single", "4096/1024/common-words"))
    quest = by_mode["quest"]   # budget 1024 is not below context 1024: no cell there
    assert (quest.cells, quest.points) == (2, pytest.approx(100 * (-0.5 + 0.0) / 2))
    assert quest.missing == ("4096/512/common-words", "4096/1024/common-words", "4096/1024/niah-single")
    assert gaps(records, floor=0.9)[1].cells == 2       # common-words (0.8) drops out


def test_cli_writes_the_grid_the_gaps_and_a_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    folder = _folder(tmp_path / "run", [_record("niah-single", "vanilla", 1.0),
                                        _record("niah-single", "solohead", 0.95, budget=512),
                                        _record("perplexity", "vanilla", 30.0),
                                        _record("perplexity", "solohead", 33.0, budget=512)])
    out, plot = tmp_path / "summary.md", tmp_path / "plot.png"
    assert main(["eval-summary", str(folder), "--out", str(out), "--plot", str(plot)]) == 0
    text = capsys.readouterr().out
    assert text == out.read_text()
    assert "| 4096 | 512 | 1.00 | 0.95 |" in text and "| m | solohead | -5.0 | 1 | none |" in text
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_mode_under_another_group_rule_is_its_own_column_and_gap(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Records without a group rule were written when `sum` was the only one: they count as `sum`."""
    old = _folder(tmp_path / "old", [_record("niah-single", "vanilla", 1.0),
                                     _record("niah-single", "solohead", 0.75, budget=512, rule=None)])
    new = _folder(tmp_path / "new", [_record("niah-single", "solohead", 0.85, budget=512, rule="max-norm"),
                                     _record("niah-single", "quest", 0.5, budget=512, rule="max-norm"),
                                     _record("niah-single", "solohead", 0.7, budget=512)])
    records = combine([old, new]).records
    assert len(records) == 4, "two rules, two solohead cells; the later sum record replaces the older"
    by_mode = {g.mode: g.points for g in gaps(records)}
    assert by_mode == {"quest (max-norm)": pytest.approx(-50.0), "solohead": pytest.approx(-30.0),
                       "solohead (max-norm)": pytest.approx(-15.0)}
    assert main(["eval-summary", str(old), str(new)]) == 0
    header = "| context | budget | vanilla | quest (max-norm) | solohead | solohead (max-norm) |"
    assert header in capsys.readouterr().out


def test_cli_rejects_a_path_that_is_not_a_folder_of_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["eval-summary", str(tmp_path / "nope")]) == 2
    assert "nope is not a folder" in capsys.readouterr().err
    assert main(["eval-summary", str(empty)]) == 2
    assert "no eval records in" in capsys.readouterr().err
