"""The numba copy_blocks kernel, run on the CPU by numba's CUDA simulator (in a subprocess, because
NUMBA_ENABLE_CUDASIM must be set before numba.cuda is imported)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numba")

_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from numba import cuda
    from pulseio._cuda.kernels import compile_copy_blocks

    kernel = compile_copy_blocks()
    rng = np.random.default_rng(7)
    # words per block: a multiple of threads*unroll, a remainder-only size, and a mixed one
    for words, n, grid in [(1024, 9, 4), (24, 5, 2), (1024 + 40, 3, 8)]:
        src = rng.integers(0, 2**63, size=(16, words), dtype=np.uint64)
        dst = np.full((12, words), 0xDEADBEEF, dtype=np.uint64)
        src_ids = rng.choice(16, size=n, replace=False).astype(np.int64)
        dst_ids = rng.choice(12, size=n, replace=False).astype(np.int64)
        untouched = np.setdiff1d(np.arange(12), dst_ids)
        kernel[grid, 256](src, src_ids, dst, dst_ids, n)
        assert np.array_equal(dst[dst_ids], src[src_ids]), (words, n, grid)
        assert (dst[untouched] == 0xDEADBEEF).all(), "rows outside dst_ids were written"
    print("SIM-OK")
    """
)


@pytest.mark.slow
def test_copy_blocks_kernel_under_simulator() -> None:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SIM-OK" in result.stdout
