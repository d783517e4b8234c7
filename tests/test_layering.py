"""The layering rules of STYLE.md, enforced by walking every import with `ast`.

- `pulseio/**` never imports `pulseio_engine`.
- Only `pulseio/_cuda/**` imports `cuda` (cuda-python); only it and `pulseio/_native/**` (CPU numba) import `numba`.
- `pulseio_engine/**` never imports `cuda`, `numba` or `pulseio._cuda`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            package = path.relative_to(ROOT).parent.parts
            base = ".".join(package[: len(package) - node.level + 1])
            names.append(f"{base}.{node.module}" if node.module else base)
    return names


def _root(name: str) -> str:
    return name.split(".")[0]


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", _sources("pulseio"), ids=lambda p: str(p.relative_to(ROOT)))
def test_pulseio_layering(path: Path) -> None:
    parts = path.relative_to(ROOT).parts
    private_cuda, private_native = "_cuda" in parts, "_native" in parts
    for name in _imports(path):
        assert _root(name) != "pulseio_engine", f"{path}: pulseio must not import {name}"
        if not private_cuda:
            assert _root(name) != "cuda", f"{path}: only pulseio/_cuda may import {name}"
            if not private_native:
                assert _root(name) != "numba", f"{path}: only pulseio/_cuda and pulseio/_native may import {name}"


@pytest.mark.parametrize("path", _sources("pulseio_engine"), ids=lambda p: str(p.relative_to(ROOT)))
def test_engine_layering(path: Path) -> None:
    for name in _imports(path):
        assert _root(name) not in {"cuda", "numba"}, f"{path}: the engine must not import {name}"
        assert not name.startswith("pulseio._cuda"), f"{path}: the engine must not import {name}"


def test_layering_walk_sees_files() -> None:
    assert _sources("pulseio"), "no pulseio sources found: the layering test would pass vacuously"
