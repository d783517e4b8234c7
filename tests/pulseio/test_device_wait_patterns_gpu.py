"""Every consumer pattern x every strategy x k in {1, 64, 2048}, cold and warm, each in a fresh process with a
hard timeout: a hang fails its case (with the child's thread dump in the message) instead of the run. Then
chains: 4 requests each published behind the last one's device wait (an engine's layers), the pattern's
first launches behind them all, for the strategies that wait on the device; the watchdog's timeout is short
there, so a request kept back fails its case (expired waits) rather than the run. Then interleaved chains:
3 RESIDENT requests with the pattern between each wait and the next publish, first launched there (an
engine's layer between two recalls: the shape that stalled the offload engine's first step), under lazy
and under eager module loading.

The cases run a few at a time (DEVICE_WAIT_JOBS, default 8). Set DEVICE_WAIT_RESULTS to a path to keep
every case's JSON line (the GPU run script does).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pulseio.testing.consumers import PATTERNS

pytestmark = pytest.mark.gpu

CASE = Path(__file__).with_name("device_wait_case.py")
STRATEGIES = ["resident", "zero_copy", "gather_dma", "batched", "auto"]
CASES = list(itertools.product(sorted(PATTERNS), STRATEGIES, [1, 64, 2048], ["cold", "warm"]))
CASES += list(itertools.product(sorted(PATTERNS), ["resident", "auto"], [64], ["cold"], [4]))
# an engine's shape: the pattern between one request's wait and the next one's publish, first launched there,
# under torch's lazy module loading and under eager loading
CASES += list(itertools.product(sorted(PATTERNS), ["resident"], [64], ["cold"], [3], ["interleaved"],
                                ["lazy", "eager"]))
TIMEOUT_S = 150


def _run(case: tuple) -> dict:
    env = dict(os.environ, CASE_DUMP_AFTER_S=str(TIMEOUT_S - 20), PYTHONUNBUFFERED="1")
    args = case[:6]
    if len(case) > 6:  # the module loading to run under
        env.pop("CUDA_MODULE_LOADING", None)
        if case[6] == "eager":
            env["CUDA_MODULE_LOADING"] = "EAGER"
    if len(case) > 4:  # a chain: a request kept back expires in 15 s and fails the case, with the thread stacks
        env["CASE_WAIT_TIMEOUT_S"] = "15"
    try:
        proc = subprocess.run([sys.executable, str(CASE), *map(str, args)], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as exc:
        return {"case": case, "ok": False, "why": f"killed after {TIMEOUT_S} s", "log": str(exc.stderr)[-4000:]}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    ok = proc.returncode == 0 and result.get("ok", False)
    return {"case": case, "ok": ok, "rc": proc.returncode, "result": result,
            "log": "" if ok else (proc.stdout[-2000:] + proc.stderr[-6000:])}


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest) -> dict:
    """Runs the selected cases (all, or those -k kept) together, a few processes at a time."""
    selected = [item.callspec.params["case"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")]
    jobs = int(os.environ.get("DEVICE_WAIT_JOBS", "8"))
    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(_run, selected))
    if path := os.environ.get("DEVICE_WAIT_RESULTS"):
        Path(path).write_text("\n".join(json.dumps(r) for r in results) + "\n")
    return {tuple(r["case"]): r for r in results}


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_device_wait_pattern_lands_bit_exact_and_never_hangs(outcomes: dict, case: tuple) -> None:
    outcome = outcomes[case]
    assert outcome["ok"], f"{case}: {outcome.get('why', '')} rc={outcome.get('rc')}\n{outcome['log']}"
