"""`benchmarks/` holds what is maintained, `benchmarks/results/` the runs a page quotes, and the figures the
pages quote come out of the commands beside them (checked here where the raw output is committed)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

import pulseio_engine.cli

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
QUOTING = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("folder", sorted(p.name for p in RESULTS.iterdir() if p.is_dir()))
def test_every_result_folder_is_quoted_by_the_readme_or_a_doc(folder: str) -> None:
    link = rf"\]\([^)]*results/{re.escape(folder)}[/)]"
    linked = [page.name for page in QUOTING if re.search(link, page.read_text())]
    assert linked, (f"benchmarks/results/{folder} is quoted by no page of README.md or docs/: summarize it in "
                    "benchmarks/results/README.md (its raw output stays in git history) and remove it")


def test_no_patches_under_results() -> None:
    patches = [p.relative_to(ROOT).as_posix() for p in RESULTS.rglob("*") if p.suffix in (".patch", ".diff")]
    assert patches == [], "a patch belongs on a branch or in git history, not beside raw output"


def test_every_file_in_benchmarks_is_listed_in_its_readme() -> None:
    listed = (ROOT / "benchmarks" / "README.md").read_text()
    files = [p.name for p in (ROOT / "benchmarks").iterdir() if p.is_file() and p.name != "README.md"]
    assert files and [name for name in files if f"`{name}`" not in listed] == []


def _command(page: Path, start: str) -> list[str]:
    code = re.sub(r"\\\n\s*", " ", page.read_text())
    (line,) = [x.strip() for x in code.splitlines() if x.strip().startswith(start)]
    return shlex.split(line.split("  #")[0])[1:]


def test_the_readme_accuracy_figure_is_the_record_of_its_commands() -> None:
    """The README's `eval` command, run as written after its `calibrate`, made the record its table links."""
    argv = _command(ROOT / "README.md", "pulseio-engine eval ")
    args = pulseio_engine.cli._parser().parse_args(argv)
    run = RESULTS / "accuracy-readme-2026-12-02-cpu"
    assert "(benchmarks/results/accuracy-readme-2026-12-02-cpu/niah.json)" in (ROOT / "README.md").read_text()
    record = json.loads((run / "niah.json").read_text())
    asked = {"model": args.model, "task": args.task, "context_len": args.context_len, "samples": args.samples,
             "mode": args.mode, "token_budget": args.token_budget, "seed": args.seed, "group_score": args.group_score}
    assert {k: record[k] for k in asked} == asked and record["recall"] == args.recall
    assert record["score"] == 1.0
    published = json.loads((RESULTS / "accuracy-2026-11-30-h200" / "heads_smollm2.json").read_text())
    heads = json.loads((run / "heads.json").read_text())
    assert (heads["best"], heads["worst"], heads["num_prompts"]) == (published["best"], published["worst"], 8)


def test_the_accuracy_grid_gaps_come_out_of_the_eval_summary_command(capsys: pytest.CaptureFixture[str]) -> None:
    page = ROOT / "docs" / "results" / "accuracy.md"
    text = page.read_text()
    variables = dict(re.findall(r"(\w)=(\$R/[\w./-]+|benchmarks/results)", text))
    argv = _command(page, "pulseio-engine eval-summary ")
    for _ in range(2):                                    # $R inside $D and $G
        argv = [re.sub(r"\$(\w)", lambda m: variables[m.group(1)], a) for a in argv]
    command, *folders = argv
    assert pulseio_engine.cli.main([command, *(str(ROOT / f) for f in folders)]) == 0
    out = capsys.readouterr().out
    for model, mode, points in [("smollm2", "solohead", "-6.2"), ("smollm2", "solohead (max-norm)", "-4.6"),
                                ("smollm2", "quest", "-33.1"), ("smollm2", "solohead-reversed", "-35.0"),
                                ("qwen2.5-coder-0.5b", "solohead", "-3.0")]:
        assert f"| {model} | {mode} | {points} |" in out
    assert "**6.2 points**" in text and "**4.6**" in text and "**3.0**" in text
