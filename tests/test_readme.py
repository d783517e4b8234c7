"""The README's Python snippets run unchanged (on the CPU backend here) and do what they say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_the_readme_has_its_snippets() -> None:
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index: int) -> None:
    code = SNIPPETS[index] + "\nprint('snippet ran')\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("snippet ran"), proc.stderr[-3000:]
