"""Offload on a real GPU, in a child process with a hard timeout (a hung recall fails the test with the
child's thread dump instead of eating the run): doorbell and sync recalls give the same tokens (the same
hot slots, the same kernels), and both host copies hold exactly what a dense prefill computed. Prompts
of 300 and 133 tokens against a 64-token budget, prefilled in chunks of 128, decoded eagerly and (doorbell)
as graph pieces; no recall fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

CASE = Path(__file__).with_name("offload_gpu_case.py")
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def outcome(tiny_qwen3) -> dict:  # noqa: ANN001
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, CASE_DUMP_AFTER_S=str(TIMEOUT_S - 30), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    try:
        proc = subprocess.run([sys.executable, str(CASE), str(tiny_qwen3[0])], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the offload case hung past {TIMEOUT_S} s:\n{str(exc.stderr)[-6000:]}")
    assert proc.returncode == 0, proc.stdout[-2000:] + _first_expiry(proc.stderr) + proc.stderr[-6000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _first_expiry(stderr: str) -> str:
    """The runtime's report at the first expired device wait (every thread's stack: who held the request
    back), which the tail of a long failure would cut off."""
    at = stderr.find("at the first expired device wait")
    return "" if at < 0 else stderr[at:at + 12000] + "\n...\n"


@pytest.mark.parametrize("mode", ["quest", "solohead"])
def test_doorbell_and_sync_recall_decode_the_same_tokens(outcome: dict, mode: str) -> None:
    doorbell, sync = outcome[f"{mode}/offload-doorbell"], outcome[f"{mode}/offload-sync"]
    assert doorbell["tokens"] == sync["tokens"] == outcome[f"{mode}/offload-doorbell/graphs"]["tokens"]
    assert all(len(t) == 24 for t in doorbell["tokens"])
    assert doorbell["bytes_recalled"] > 0 and sync["bytes_recalled"] > 0


@pytest.mark.parametrize("recall", ["offload-doorbell", "offload-sync"])
@pytest.mark.parametrize("mode", ["quest", "solohead"])
def test_the_host_copy_equals_a_dense_prefill_bit_for_bit(outcome: dict, mode: str, recall: str) -> None:
    assert outcome[f"{mode}/{recall}"]["host_exact"] is True


@pytest.mark.parametrize("mode", ["quest", "solohead"])
def test_the_all_on_gpu_baseline_recalls_nothing(outcome: dict, mode: str) -> None:
    result = outcome[f"{mode}/all-on-gpu"]
    assert result["bytes_recalled"] == 0 and all(len(t) == 24 for t in result["tokens"])


def test_no_recall_failed_or_expired(outcome: dict) -> None:
    assert {key: (r["failed"], r["expired"]) for key, r in outcome.items() if r["failed"] or r["expired"]} == {}
