"""The README's CPU install (`.[cpu]`: no cuda-python, numba-cuda or Triton) collects every test and skips
those that need a GPU-only package, saying which: checked here on any install, by hiding those packages
from a fresh interpreter (CI also runs the suite on a real `.[cpu]` install)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_WITHOUT_GPU_PACKAGES = textwrap.dedent("""
    import sys
    class _CpuInstall:                      # what `pip install -e ".[cpu]"` leaves out
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("cuda", "numba_cuda", "triton"):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
    # numba-cuda's redirect of numba.cuda to itself (a finder its .pth file installs): gone with numba-cuda
    sys.meta_path[:] = [_CpuInstall()] + [f for f in sys.meta_path if type(f).__name__ != "NumbaCudaFinder"]
    import pytest
    sys.exit(pytest.main(sys.argv[1:]))
""")


def _pytest_without_gpu_packages(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PULSEIO_REQUIRE_GPU_PACKAGES"}   # CI's .[all] run sets it
    return subprocess.run([sys.executable, "-c", _WITHOUT_GPU_PACKAGES, "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def test_every_test_module_is_collected_without_the_gpu_packages() -> None:
    proc = _pytest_without_gpu_packages("--collect-only", "-q", "tests")
    assert proc.returncode == 0 and " error" not in proc.stdout.splitlines()[-1], proc.stdout[-4000:]


def test_tests_that_need_a_gpu_package_skip_naming_it() -> None:
    proc = _pytest_without_gpu_packages("-q", "-rs", "-m", "needs_package", "tests/pulseio/test_resident_liveness.py",
                                        "tests/pulseio/test_runtime_cudasim.py",
                                        "tests/pulseio_engine/test_attention_config.py")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "passed" not in proc.stdout.splitlines()[-1] and "failed" not in proc.stdout.splitlines()[-1]
    for name, dist in (("cuda.bindings", "cuda-python"), ("triton", "triton")):
        assert f"needs {name} ({dist}, installed by .[gpu] and .[all], not by .[cpu])" in proc.stdout, proc.stdout


def test_auto_test_workers_are_one_a_usable_core_without_a_gpu_and_none_beside_one(monkeypatch) -> None:  # noqa: ANN001
    """`python -m pytest -q -n auto` (the README's command): xdist asks tests/conftest.py how many workers."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)     # by path: `import conftest` may find a subfolder's
    spec.loader.exec_module(conftest)

    monkeypatch.setattr(conftest, "_cuda_available", lambda: True)
    assert conftest.pytest_xdist_auto_num_workers(None) == 0          # GPU tests run in this one process
    monkeypatch.setattr(conftest, "_cuda_available", lambda: False)
    for cores, workers in ((1, 1), (2, 2), (6, 6), (64, conftest.MAX_TEST_WORKERS)):
        monkeypatch.setattr(conftest.os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)), raising=False)
        assert conftest.pytest_xdist_auto_num_workers(None) == workers
