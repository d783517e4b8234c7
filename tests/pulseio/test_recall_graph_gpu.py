"""RecallGraph on a real GPU, each case in a fresh process (recall_graph_case.py) with a hard timeout and a
thread dump: recalls captured into a CUDA graph with their device waits land bit for bit on every replay,
from a cold process and a warm one, with the submitting thread never synced; and misuse is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pulseio
from pulseio import InvalidRequestError

pytestmark = pytest.mark.gpu

CASE = Path(__file__).with_name("recall_graph_case.py")
TIMEOUT_S = 120


@pytest.mark.parametrize("layers,k,replays,temperature,split", [
    (40, 104, 6, "cold", False), (40, 104, 6, "warm", False), (3, 2048, 4, "cold", False), (1, 1, 8, "warm", False),
    (40, 104, 6, "warm", True), (3, 2048, 4, "cold", True)])
def test_captured_recalls_land_bit_exact_on_every_replay(layers: int, k: int, replays: int, temperature: str,
                                                         split: bool) -> None:
    """split: publish-only posts, one graph per layer, the host waiting with wait_device or seeing done()."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    root = str(Path(__file__).resolve().parents[2])       # the child imports this checkout, installed or not
    env = dict(os.environ, CASE_DUMP_AFTER_S=str(TIMEOUT_S - 20), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    argv = [sys.executable, str(CASE), str(layers), str(k), str(replays), temperature] + (["split"] if split else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"killed after {TIMEOUT_S} s:\n{str(exc.stderr)[-6000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(lines[-1])
    assert result["ok"] and result["expired"] == 0, result
    assert result["completed"] == result["submitted"] == layers * replays, result
    print(f"host time per replay (arm + replay) for {layers} recalls: {result['host_us_per_replay']:.0f} us")


def test_post_outside_a_capture_is_refused() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cfg = pulseio.RuntimeConfig(device="cuda", host_blocks=64, device_slots=64, block_bytes=4096)
    with pulseio.open_runtime(cfg) as rt:
        recalls = rt.recall_graph()
        ids = torch.arange(4, device="cuda")
        with pytest.raises(InvalidRequestError, match="records into a CUDA graph being captured"):
            recalls.post(host_ids=ids, device_slots=ids)
        with pytest.raises(InvalidRequestError, match="has captured no post"):
            recalls.arm_nowait()
        with pytest.raises(InvalidRequestError, match="post index 0 is not one of this RecallGraph's 0 posts"):
            recalls.wait_device(0)
