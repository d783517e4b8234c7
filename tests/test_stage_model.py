"""benchmarks/stage_model.py: split here, carry one set per call, put there; the join is bit-exact."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("stage_model", ROOT / "benchmarks" / "stage_model.py")
stage_model = sys.modules["stage_model"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stage_model)   # type: ignore[union-attr]


def _files(tmp_path: Path) -> tuple[Path, list[stage_model.Source]]:
    cache = tmp_path / "cache"
    (cache / "fake" / "model.gguf.tokenizer").mkdir(parents=True)
    gguf = cache / "fake" / "model.gguf"
    gguf.write_bytes(os.urandom(10_000))
    os.utime(gguf, ns=(1_700_000_000_123_456_789,) * 2)
    (cache / "fake" / "model.gguf.tokenizer" / "stamp").write_text("model.gguf 10000 1700000000123456789")
    text = cache / "text.txt"
    text.write_bytes(b"")                                   # an empty file travels too
    sources = [stage_model.Source(gguf, "fake/model.gguf", stage_model.sha256_of(gguf)),
               stage_model.Source(cache / "fake" / "model.gguf.tokenizer" / "stamp", "fake/model.gguf.tokenizer/stamp"),
               stage_model.Source(text, "text.txt")]
    return cache, sources


def test_split_then_put_one_set_per_call_is_bit_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    here, sources = _files(tmp_path)
    sets = stage_model.split(sources, tmp_path / "carry" / "fake", name="fake", set_bytes=4096)
    assert len(sets) == 3 and all(sum(p.stat().st_size for p in s.iterdir() if p.name != "manifest.json") <= 4096
                                  for s in sets)
    there, stage, device_repo = tmp_path / "device-cache", tmp_path / "stage", tmp_path / "device-repo"
    for n, folder in enumerate(sets):       # each call carries one set; the previous call's is gone
        shutil.rmtree(device_repo, ignore_errors=True)
        shutil.copytree(folder, device_repo / "fake" / folder.name)
        code = stage_model.put(device_repo / "fake", stage, there)
        out = capsys.readouterr().out
        assert code == (0 if n == len(sets) - 1 else stage_model.MISSING), out
        assert "chunks in" in out
    for src in sources:
        joined = there / src.cache_path
        assert joined.read_bytes() == src.path.read_bytes()
        assert joined.stat().st_mtime_ns == src.path.stat().st_mtime_ns   # the tokenizer stamp stays valid
    assert stage_model.put(device_repo / "fake", stage, there) == 0                # again: nothing to do
    assert "already in" in capsys.readouterr().out


def test_put_refuses_a_corrupt_chunk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, sources = _files(tmp_path)
    (folder,) = stage_model.split(sources, tmp_path / "carry" / "fake", name="fake", set_bytes=1 << 20)
    chunk = folder / "00.000"
    data = chunk.read_bytes()
    chunk.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # a changed byte, whatever the random data held
    assert stage_model.put(folder.parent, tmp_path / "stage", tmp_path / "device-cache") == stage_model.CORRUPT
    assert "corrupt" in capsys.readouterr().out
    assert not (tmp_path / "device-cache" / "fake" / "model.gguf").exists()


def test_split_refuses_a_file_with_the_wrong_checksum(tmp_path: Path) -> None:
    _, sources = _files(tmp_path)
    bad = [stage_model.Source(sources[0].path, sources[0].cache_path, "0" * 64)]
    with pytest.raises(SystemExit, match="expected 0000"):
        stage_model.split(bad, tmp_path / "carry", name="fake")
