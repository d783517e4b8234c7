"""Once `open_runtime` returns, serving requests compiles nothing: every numba function the posting thread,
the poller, the fast lane and the I/O workers call was compiled (or loaded from numba's cache) while the
runtime opened. Checked in a fresh process with an empty numba cache (compile_watch_case.py), where a
first call would compile for seconds holding the GIL: on the GPU, such a compile on the poller's thread
once kept a request from its copier past the device-wait watchdog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

CASE = Path(__file__).with_name("compile_watch_case.py")


def test_serving_requests_compiles_nothing_on_any_thread(tmp_path: Path) -> None:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(CASE)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    compiles = json.loads(proc.stdout.splitlines()[-1])
    assert compiles == [], f"compiled while serving ([thread, function]): {compiles}"
