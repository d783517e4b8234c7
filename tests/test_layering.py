"""The layering rules of STYLE.md, enforced by walking every import with `ast`.

- `pulseio/**` never imports `pulseio_engine`.
- Only `pulseio/_cuda/**` imports `cuda` (cuda-python); only it and `pulseio/_native/**` (CPU numba) import `numba`.
- `pulseio_engine/**` never imports `cuda`, `numba` or `pulseio._cuda`.
- The private CUDA layer builds on a fixed set of core modules (below), and only `pulseio/_devices.py`
  (which opens a backend) imports it: the rest of pulseio reaches the GPU through the Backend seam.
- The engine uses only pulseio's public names: `from pulseio import X` with X exported by
  `pulseio/__init__.py`, or a public (not underscored) module; never a private one.
- `pulseio/integrations/**` (pulseio under other systems) is held to the engine's rule: pulseio's public names
  only, as any offloading system outside this repo would use it; it imports its system (transformers) itself,
  and nothing else in pulseio imports it or that system, so `import pulseio` stays free of them.
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


# What pulseio/_cuda may build on: the seam it implements, the shared vocabulary, the task ring's host half
# and the compiled layouts. A new entry here is a design decision, not a fix for a failing test.
CUDA_MAY_USE = {"pulseio.backend", "pulseio.config", "pulseio.doorbell", "pulseio.errors", "pulseio.memory",
                "pulseio.plan", "pulseio._resident", "pulseio._native", "pulseio._native.layout",
                "pulseio._native.task_ring"}


@pytest.mark.parametrize("path", sorted((ROOT / "pulseio" / "_cuda").glob("*.py")), ids=lambda p: p.name)
def test_the_cuda_layer_builds_on_the_core_modules_it_is_allowed(path: Path) -> None:
    core = {n for n in _imports(path) if n.startswith("pulseio.") and not n.startswith("pulseio._cuda")}
    assert core <= CUDA_MAY_USE, f"{path.name} imports {sorted(core - CUDA_MAY_USE)} from pulseio's core"


@pytest.mark.parametrize("path", _sources("pulseio"), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_backend_opener_imports_the_cuda_layer(path: Path) -> None:
    if "_cuda" in path.relative_to(ROOT).parts or path.name == "_devices.py":
        return
    assert not [n for n in _imports(path) if n.startswith("pulseio._cuda")], (
        f"{path} imports pulseio._cuda: reach the GPU through the Backend seam (pulseio/backend.py)")


def _public_users() -> list[Path]:
    return _sources("pulseio_engine") + sorted((ROOT / "pulseio" / "integrations").rglob("*.py"))


@pytest.mark.parametrize("path", _public_users(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_engine_and_the_integrations_use_only_public_pulseio_names(path: Path) -> None:
    import pulseio

    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "pulseio":
            missing = [a.name for a in node.names if not hasattr(pulseio, a.name)]
            assert not missing, f"{path}: {missing} are not pulseio's public names"
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        for name in names:
            parts = name.split(".")
            assert parts[0] != "pulseio" or not any(p.startswith("_") for p in parts[1:]), (
                f"{path}: imports the private {name}; use pulseio's public names")


INTEGRATED = {"transformers"}  # the systems pulseio/integrations put pulseio under: optional dependencies


@pytest.mark.parametrize("path", _sources("pulseio"), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_integrations_import_the_systems_they_integrate(path: Path) -> None:
    parts = path.relative_to(ROOT).parts
    if parts[:2] == ("pulseio", "integrations"):
        assert not [n for n in _imports(path) if _root(n) == "pulseio" and n.startswith("pulseio.") and
                    not n.startswith("pulseio.integrations")], f"{path}: import pulseio's public names from `pulseio`"
        return
    found = [n for n in _imports(path) if _root(n) in INTEGRATED or n.startswith("pulseio.integrations")]
    assert not found, f"{path} imports {found}: only pulseio/integrations may (an optional dependency)"


def test_importing_pulseio_imports_no_integrated_system() -> None:
    import subprocess
    import sys

    code = f"import sys, pulseio; print(sorted(m for m in sys.modules if m.split('.')[0] in {INTEGRATED!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]


# Bookkeeping that must run where torch cannot: trace parsing, the serving loop's decisions and its report.
NO_TORCH = ["pulseio_engine/trace", "pulseio_engine/serving/budget.py", "pulseio_engine/serving/outer.py",
            "pulseio_engine/serving/clock.py", "pulseio_engine/serving/config.py",
            "pulseio_engine/serving/metrics.py", "pulseio_engine/serving/report.py",
            "pulseio_engine/serving/host_time.py"]
_BOOKKEEPING = tuple("pulseio_engine." + e.removeprefix("pulseio_engine/").removesuffix(".py").replace("/", ".")
                     for e in NO_TORCH)


@pytest.mark.parametrize("path", [p for entry in NO_TORCH for p in (sorted((ROOT / entry).rglob("*.py"))
                                                                   if (ROOT / entry).is_dir() else [ROOT / entry])],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_bookkeeping_imports_no_torch(path: Path) -> None:
    assert path.is_file()
    torch_side = {n for n in _imports(path) if _root(n) == "torch"}
    assert not torch_side, f"{path}: bookkeeping must not import torch ({sorted(torch_side)})"
    local = [n for n in _imports(path) if n.startswith("pulseio_engine.")]
    heavy = [n for n in local if n.split(".")[1] in {"engine", "runner", "offload", "model", "serving"}
             and not n.startswith(_BOOKKEEPING)]
    assert not heavy, f"{path}: bookkeeping imports the device side: {heavy}"
