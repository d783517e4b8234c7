"""Shared pytest setup: `gpu` tests are skipped, saying why, where torch sees no CUDA device, and
`needs_package` tests where a package only the GPU install has (`.[gpu]`) is missing, as on `.[cpu]`.

    pytestmark = pytest.mark.needs_package("cuda.bindings")   # the module imports it inside its tests

A test file that imports such a package does so inside its tests (or fixtures), so that a `.[cpu]`
install collects it and skips it instead of stopping on an ImportError. Only the packages named in
`GPU_PACKAGES` may be marked: any other missing import is a real failure. With
PULSEIO_REQUIRE_GPU_PACKAGES=1 (CI's `.[all]` run) a missing one stops the run, naming it, instead.

`-n auto` (pytest-xdist, the README's test command) runs one test worker a usable core without a GPU and none
beside one, so tests must not share files or ports: each writes under its own `tmp_path`.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

# import name -> the distribution that provides it; all of them come with `.[gpu]`, none with `.[cpu]`
GPU_PACKAGES = {"cuda.bindings": "cuda-python", "numba_cuda": "numba-cuda", "triton": "triton"}


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:          # a parent package (`cuda` of `cuda.bindings`) is missing
        return True


def _skip_missing_packages(items: list[pytest.Item]) -> None:
    missing: dict[str, str] = {}
    for item in items:
        for mark in item.iter_markers("needs_package"):
            (name,) = mark.args
            if name not in GPU_PACKAGES:
                raise pytest.UsageError(f"{item.nodeid}: needs_package({name!r}) names no GPU-only package; "
                                        f"the marker takes one of {sorted(GPU_PACKAGES)}")
            if _missing(name):
                missing[name] = item.nodeid
                item.add_marker(pytest.mark.skip(
                    reason=f"needs {name} ({GPU_PACKAGES[name]}, installed by .[gpu] and .[all], not by .[cpu])"))
    if missing and os.environ.get("PULSEIO_REQUIRE_GPU_PACKAGES") == "1":
        raise pytest.UsageError("PULSEIO_REQUIRE_GPU_PACKAGES=1, but " + "; ".join(
            f"{name} ({GPU_PACKAGES[name]}) is missing, needed by {nodeid} and maybe others"
            for name, nodeid in missing.items()))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


MAX_TEST_WORKERS = 8      # each worker holds its own torch and models (1-2 GB with a real one)


def _usable_cores() -> int:
    """The cores this process may run on (its affinity, which a container's cpuset narrows), not the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@pytest.hookimpl(optionalhook=True)      # a pytest-xdist hook: `-n auto`
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker a usable core (at most MAX_TEST_WORKERS) on a machine without a GPU; none with one, where
    the GPU tests share the device and time their hang guards, so they run one after another in this process."""
    if _cuda_available():
        return 0
    return max(1, min(_usable_cores(), MAX_TEST_WORKERS))


def pytest_configure(config: pytest.Config) -> None:
    """A test worker's torch takes its share of the cores, not all of them (the workers would oversubscribe)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, _usable_cores() // workers))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _skip_missing_packages(items)
    if _cuda_available():
        return
    import torch

    build = "this torch is a CPU-only build" if torch.version.cuda is None else "torch sees no GPU"
    skip_gpu = pytest.mark.skip(reason=f"needs a CUDA GPU ({build})")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def hf_gguf():  # noqa: ANN201 (a loader)
    """-> load(path): (model, tokenizer) of a GGUF file as `transformers` reads it (its own GGUF reader and
    dequantization, fp32, CPU, eval), each file read once a session: dequantizing Qwen2.5-0.5B takes ~50 s here and
    two test files compare against it. Callers must not change the model (set the attention implementation they
    use on each call)."""
    loaded: dict = {}

    def load(path):  # noqa: ANN001, ANN202
        if path not in loaded:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer  # needs `accelerate` for GGUF files

            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
            loaded[path] = (model.eval(), tokenizer)
        return loaded[path]
    return load


# Triton's bindings (nanobind) print a "leaked N instances/types/functions" report at interpreter exit,
# after the test summary, because Triton keeps module-level objects alive until then; it reads like a
# failure and is not one. Once pytest is done (at exit: pytest restores its captured stderr after the
# unconfigure hooks), stderr goes through a filter that drops exactly those report lines and passes
# everything else (a real error at shutdown still shows). PULSEIO_SHOW_NANOBIND_LEAKS=1 keeps them.
_NANOBIND_FILTER = r"""
import sys
report = ("nanobind: leaked ", " - leaked ", " - ... skipped remainder", "nanobind: this is likely caused",
          "See https://nanobind.readthedocs.io/en/latest/refleaks.html")
for line in sys.stdin:
    if not line.startswith(report):
        sys.stderr.write(line)
        sys.stderr.flush()
"""


def pytest_unconfigure(config: pytest.Config) -> None:
    import atexit

    atexit.register(_filter_nanobind_leak_report)


def _filter_nanobind_leak_report() -> None:
    import subprocess
    import sys

    if "triton" not in sys.modules or os.environ.get("PULSEIO_SHOW_NANOBIND_LEAKS"):
        return
    sys.stderr.flush()
    read, write = os.pipe()
    subprocess.Popen([sys.executable, "-c", _NANOBIND_FILTER], stdin=read, stderr=os.dup(2), close_fds=True)
    os.close(read)
    os.dup2(write, 2)
    os.close(write)
