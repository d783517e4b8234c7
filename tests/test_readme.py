"""The README is the front door, tried by new users exactly as written: its Python snippets run unchanged
(on the CPU backend here) and do what they say, its first block is the install order CI runs, every
command it or a page of docs/ shows parses, every link resolves, and it fits one screen-ful (150 lines)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import pulseio.cli
import pulseio_engine.cli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SNIPPETS = re.findall(r"```python\n(.*?)```", README, flags=re.S)
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "results" / "README.md",
         *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_readme_has_its_snippets() -> None:
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index: int) -> None:
    code = SNIPPETS[index] + "\nprint('snippet ran')\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("snippet ran"), proc.stderr[-3000:]


def test_the_readme_fits_a_screenful() -> None:
    assert len(README.splitlines()) <= 150


def test_the_first_block_is_the_cpu_install_then_the_two_commands() -> None:
    """`.ci/run` runs this block as written in a fresh venv: the order is the one a new user needs."""
    first = re.search(r"```bash\n(.*?)```", README, flags=re.S)
    assert first is not None and README.index(first.group(0)) < README.index("```python")
    block = re.sub(r"\\\n\s*", " ", first.group(1))                       # continuation lines joined
    commands = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands[0].startswith("cd ")                                    # in the clone
    assert commands[1] == "python3 -m venv .venv && . .venv/bin/activate"
    assert commands[2] == "pip install torch --index-url https://download.pytorch.org/whl/cpu"   # before .[cpu]
    assert commands[3] == 'pip install -e ".[cpu]"'
    assert commands[4].startswith("pulseio-engine replay --trace mooncake-sample ")   # the main job: a shipped trace
    assert commands[5:] == ["pulseio bench", "python -m pytest -q -n auto"]        # the PCIe bench, the tests
    assert "README_BLOCK" in (ROOT / ".ci" / "run").read_text(), ".ci/run must run this block"


def _commands(text: str) -> list[str]:
    """Every `pulseio ...` / `pulseio-engine ...` line of a page's code (fenced, or indented by four spaces),
    continuation lines joined, comments dropped."""
    fenced = re.findall(r"```\w*\n(.*?)```", text, flags=re.S)
    indented = re.findall(r"^    (.*)$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M)
    code = re.sub(r"\\\n\s*", " ", "\n".join(fenced + indented))
    found = []
    for line in code.splitlines():
        line = line.strip()
        if line.startswith(("pulseio ", "pulseio-engine ")):
            found.append(line.split("  #")[0].strip())
    return found


COMMANDS = sorted({(page.relative_to(ROOT).as_posix(), c) for page in PAGES for c in _commands(page.read_text())})


def test_the_pages_show_commands() -> None:
    readme = [c for page, c in COMMANDS if page == "README.md"]
    assert "pulseio bench" in readme and any(c.startswith("pulseio-engine eval ") for c in readme)


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}: {c[:60]}" for p, c in COMMANDS])
def test_every_command_a_page_shows_parses(page: str, command: str) -> None:
    prog, *argv = shlex.split(command.replace("[", "").replace("]", ""))
    parser = pulseio.cli._parser() if prog == "pulseio" else pulseio_engine.cli._parser()
    parser.parse_args(argv)          # an option that no longer exists raises UsageError naming it


LINKS = sorted({(page.relative_to(ROOT).as_posix(), target) for page in PAGES
                for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
                if not target.startswith(("http://", "https://"))})


def test_the_pages_link_their_raw_output() -> None:
    assert sum(1 for page, target in LINKS if page == "README.md" and "benchmarks/results/" in target) >= 5


@pytest.mark.parametrize(("page", "target"), LINKS, ids=[f"{p} -> {t}" for p, t in LINKS])
def test_every_link_resolves(page: str, target: str) -> None:
    assert ((ROOT / page).parent / target).exists(), f"{page} links {target}, which does not exist"
