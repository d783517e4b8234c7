"""Every CLI answers a bad input with one line on stderr naming the value, a non-zero exit code, no
traceback, and before any real work (under 10 s each)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import pulseio.cli
import pulseio_engine.cli

ROOT = Path(__file__).resolve().parents[1]
NO_GPU = not torch.cuda.is_available()

# (argv, the value the one line must name); "{tmp}" is replaced by a fresh temporary directory
ENGINE = [
    (["generate", "--model", "tiny", "--prompt", "x", "--max-new-tokens", "0"], "got 0"),
    (["generate", "--model", "tiny", "--prompt", "x", "--max-new-tokens", "-3"], "got -3"),
    (["generate", "--model", "tiny", "--prompt", "x", "--max-new-tokens", "lots"], "'lots'"),
    (["generate", "--model", "tiny", "--prompt", "x", "--max-new-tokens", "5000"], "5000"),
    (["generate", "--model", "tiny", "--prompt-ids", "abc"], "'abc'"),
    (["generate", "--model", "tiny", "--prompt-ids", "1.5,2"], "'1.5,2'"),
    (["generate", "--model", "tiny", "--prompt-ids", ""], "''"),
    (["generate", "--model", "tiny", "--prompt-ids", "-1"], "-1"),
    (["generate", "--model", "tiny", "--prompt-ids", "999"], "999"),
    (["generate", "--model", "tiny", "--prompt", ""], "''"),
    (["generate", "--model", "tiny", "--prompt", "   "], "'   '"),
    (["generate", "--model", "tiny", "--prompt", "x", "--temperature", "-1"], "-1"),
    (["generate", "--model", "tiny", "--prompt", "x", "--temperature", "nan"], "nan"),
    (["generate", "--model", "tiny", "--prompt", "x", "--device", "gpu"], "'gpu'"),
    (["generate", "--model", "tiny", "--prompt", "x", "--device", "cuda:x"], "'cuda:x'"),
    (["generate", "--model", "tiny", "--prompt", "x", "--dtype", "int8"], "'int8'"),
    (["generate", "--model", "tiny", "--prompt", "x", "--seed", "-1"], "-1"),
    (["generate", "--model", "no-such-model", "--prompt", "x"], "'no-such-model'"),
    (["generate", "--model", "{tmp}/bad.gguf", "--prompt", "x"], "bad.gguf"),
    (["generate", "--model", "{tmp}/badjson", "--prompt-ids", "1"], "config.json"),
    (["generate", "--model", "{tmp}", "--prompt-ids", "1"], "{tmp}"),
    (["generate", "--model", "tiny"], "--prompt"),
    (["generate", "--prompt", "x"], "--model"),
    (["bench", "--steps", "0"], "got 0"),
    (["bench", "--batch-size", "0"], "got 0"),
    (["bench", "--context-len", "0"], "got 0"),
    (["bench", "--warmup", "-1"], "-1"),
    (["bench", "--model", "tiny", "--context-len", "100000", "--device", "cpu"], "100000"),
    (["bench", "--model", "tiny", "--mode", "quest"], "'quest'"),
    (["bench", "--model", "nope"], "'nope'"),
    (["bench", "--model", "tiny", "--device", "cpu", "--json", "{tmp}/file/out.json"], "out.json"),
    (["bench", "--model", "qwen3-14b", "--device", "cpu"], "qwen3-14b"),
    (["generate", "--model", "qwen3-14b", "--device", "cpu", "--prompt", "hi"], "qwen3-14b"),
    (["fetch-smollm2", "--cache", "{tmp}/file/cache"], "cache"),
    (["locality", "--model", "tiny", "--context-len", "256", "--token-budget", "32"], "(32 tokens = 2 blocks)"),
    (["locality", "--model", "tiny", "--context-len", "256", "--steps", "1"], "got 1"),
    (["eval", "--model", "tiny", "--task", "niah-single", "--context-len", "256", "--batch", "0"], "got 0"),
    (["eval-table", "--model", "tiny", "--context-len", "256", "--out", "{tmp}/o", "--token-budget", "100"], "100"),
    (["eval-table", "--model", "tiny", "--context-len", "256", "--out", "{tmp}/o", "--token-budget", "32"], "32"),
    (["eval-table", "--model", "tiny", "--context-len", "32", "--out", "{tmp}/o"], "32"),
    (["eval-table", "--model", "tiny", "--context-len", "256,x", "--out", "{tmp}/o"], "'x'"),
    (["eval-table", "--model", "tiny", "--context-len", "256", "--out", "{tmp}/o", "--task", "niah"], "'niah'"),
    (["eval-table", "--model", "tiny", "--context-len", "256", "--out", "{tmp}/o", "--mode", "quest,fast"], "'fast'"),
    (["eval-table", "--model", "tiny", "--context-len", "256", "--out", "{tmp}/o", "--mode", "solohead",
      "--token-budget", "64"], "solohead"),
    (["eval-table", "--model", "tiny", "--context-len", "256", "--out", "{tmp}/file"], "{tmp}/file"),
    (["eval-table", "--model", "tiny", "--context-len", "256", "--out", "{tmp}/o", "--batch", "0"], "got 0"),
    (["eval-table", "--model", "tiny", "--context-len", "256", "--out", "{tmp}/o", "--heads", "{tmp}/no.json"],
     "no.json"),
    (["eval", "--model", "tiny", "--task", "niah-single", "--context-len", "256", "--heads", "{tmp}/file"],
     "--heads {tmp}/file is not JSON"),
    (["eval", "--model", "tiny", "--task", "niah-single", "--context-len", "256", "--heads", "{tmp}/list.json"],
     "--heads {tmp}/list.json holds a JSON list, not a retrieval-head object"),
    (["eval", "--model", "tiny", "--task", "niah-single", "--context-len", "256", "--heads", "{tmp}/badjson"],
     "--heads {tmp}/badjson cannot be read"),
    (["locality", "--model", "tiny", "--context-len", "256", "--heads", "{tmp}/bad.gguf"],
     "--heads {tmp}/bad.gguf is not JSON"),
    (["eval-table", "--model", "tiny", "--context-len", "256", "--out", "{tmp}/o", "--heads", "{tmp}/nokeys.json"],
     "--heads {tmp}/nokeys.json is not a retrieval-head file"),
    (["eval-table", "--model", "no-such-model", "--context-len", "256", "--out", "{tmp}/o", "--mode", "quest",
      "--token-budget", "64"],
     "'no-such-model'"),
    (["replay", "--trace", "{tmp}/none.jsonl", "--model", "tiny", "--mode", "vanilla", "--gpu-kv-gib", "1"],
     "none.jsonl"),
    (["replay", "--trace", "mooncake-sample", "--model", "tiny", "--mode", "vanilla", "--gpu-kv-gib", "0"], "got 0"),
    (["replay", "--trace", "mooncake-sample", "--model", "tiny", "--mode", "vanilla", "--gpu-kv-gib", "1",
      "--time-scale", "-1"], "-1"),
    (["replay", "--trace", "mooncake-sample", "--model", "tiny", "--mode", "vanilla", "--gpu-kv-gib", "1",
      "--requests", "0"], "got 0"),
    (["replay", "--trace", "{tmp}/file", "--model", "tiny", "--mode", "vanilla", "--gpu-kv-gib", "1"], "--format"),
    (["replay", "--trace", "mooncake-sample", "--model", "tiny", "--mode", "vanilla", "--gpu-kv-gib", "1",
      "--json", "{tmp}/file/r.json"], "r.json"),
    (["replay", "--trace", "mooncake-sample", "--model", "nope", "--mode", "vanilla", "--gpu-kv-gib", "1"], "'nope'"),
    (["replay", "--trace", "mooncake-sample", "--model", "tiny", "--mode", "pulseinfer", "--gpu-kv-gib", "1",
      "--max-input", "1000", "--max-output", "8", "--offload-threshold", "900", "--host-kv-gib", "1e-5"],
     "raise --gpu-kv-gib (or --host-kv-gib)"),
    (["replay-table", "{tmp}/file"], "{tmp}/file"),
    (["teleport"], "'teleport'"),
    ([], "required"),
]
PULSEIO = [
    (["bench", "--block-sizes", "0"], "got 0"),
    (["bench", "--block-sizes", "100"], "got 100"),
    (["bench", "--block-sizes", "8k"], "'8k'"),
    (["bench", "--block-sizes", ""], "''"),
    (["bench", "--counts", "0"], "got 0"),
    (["bench", "--counts", "-10"], "-10"),
    (["bench", "--window", "0"], "got 0"),
    (["bench", "--strategies", ""], "''"),
    (["bench", "--strategies", "teleport"], "'teleport'"),
    (["bench", "--directions", "sideways"], "'sideways'"),
    (["bench", "--device", "gpu"], "'gpu'"),
    (["bench", "--host-pool-bytes", "0"], "got 0"),
    (["bench", "--host-pool-bytes", "4096", "--counts", "8"], "4096"),
    (["bench", "--peak-max-bytes", "100"], "got 100"),
    (["bench", "--peak-max-bytes", str(1 << 50)], str(1 << 50)),
    (["bench", "--host-pool-bytes", str(1 << 50)], "--host-pool-bytes"),
    (["bench", "--block-sizes", str(1 << 30)], "--block-sizes"),
    (["bench", "--zero-copy-ctas", "0"], "got 0"),
    (["bench", "--json", "{tmp}/file/bench.json"], "bench.json"),
    (["bench", "--json", "/proc/bench.json"], "--json /proc/bench.json cannot be written"),   # root passes os.access
    (["bench", "--plot", "/proc/bench.png"], "--plot /proc/bench.png cannot be written"),
    (["bench", "--json", "{tmp}"], "is a directory"),
    ([], "required"),
]
if NO_GPU:
    ENGINE.append((["generate", "--model", "tiny", "--prompt", "x", "--device", "cuda"], "cuda"))
    ENGINE.append((["bench", "--model", "tiny", "--device", "cuda:1"], "cuda:1"))
    PULSEIO.append((["bench", "--device", "cuda"], "cuda"))

CASES = [("pulseio-engine", a, v) for a, v in ENGINE] + [("pulseio", a, v) for a, v in PULSEIO]


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file")
    (tmp_path / "badjson").mkdir()
    (tmp_path / "badjson" / "config.json").write_text("{not json")
    (tmp_path / "file").write_text("a file where a folder is expected")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "nokeys.json").write_text('{"best": [0]}')
    return tmp_path


@pytest.mark.parametrize(("prog", "argv", "value"), CASES, ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_bad_input_is_one_line(prog: str, argv: list[str], value: str, tmp: Path, capfd: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULSEIO_MEMORY_LIMIT", "16G")   # the same refusals on bigger machines
    argv = [a.replace("{tmp}", str(tmp)) for a in argv]
    main = pulseio.cli.main if prog == "pulseio" else pulseio_engine.cli.main
    start = time.perf_counter()
    code = main(argv)
    elapsed = time.perf_counter() - start
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert code != 0
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith(f"{prog}") and ": error: " in lines[0], lines[0]
    assert value.replace("{tmp}", str(tmp)) in lines[0]
    assert elapsed < 10, f"took {elapsed:.1f} s before refusing"


@pytest.mark.parametrize(("module", "argv"), [
    ("pulseio_engine.cli", ["generate", "--model", "tiny", "--prompt-ids", "abc"]),
    ("pulseio.cli", ["bench", "--counts", "0"]),
])
def test_the_real_entry_points_print_one_line(module: str, argv: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_a_bad_heads_file_says_what_it_should_hold_and_which_command_writes_one(tmp_path: Path, capfd) -> None:  # noqa: ANN001
    heads = tmp_path / "heads.json"
    heads.write_text("best: 0 1 2\n")
    code = pulseio_engine.cli.main(["eval", "--model", "tiny", "--task", "niah-single", "--context-len", "256",
                                    "--mode", "solohead", "--heads", str(heads)])
    (line,) = capfd.readouterr().err.strip().splitlines()
    assert code == 2
    assert f"--heads {heads} is not JSON (Expecting value: line 1 column 1 (char 0))" in line, line
    assert "`pulseio-engine calibrate --model tiny --out heads.json` writes" in line and '"best"' in line, line


def test_debug_shows_the_traceback() -> None:
    with pytest.raises(ValueError, match="neither a preset"):
        pulseio_engine.cli.main(["generate", "--model", "no-such-model", "--prompt", "x", "--debug"])


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [parser] + [p for s in subs for child in s.choices.values() for p in _parsers(child)]


@pytest.mark.parametrize("cli", [pulseio.cli, pulseio_engine.cli], ids=["pulseio", "pulseio-engine"])
def test_every_option_has_help(cli) -> None:  # noqa: ANN001
    for parser in _parsers(cli._parser()):
        for action in parser._actions:
            if action.option_strings:
                assert action.help, f"{parser.prog} {action.option_strings[0]} has no help text"
        parser.format_help()   # every %(default)s expands
