"""The serving loop on a real GPU, each case in a child process with a hard timeout and a thread dump before it
(serving_gpu_case.py): IRQ with captured per-layer pieces and publish-only recalls gives each batch's tokens, also
with recalls landing late and with the two batches on two streams; so does the offload batch run as two halves with
the normal requests riding in the first, or as one step with them riding in it (in each form, each layer's blocks
recalled a layer early too, `ahead`); vanilla's rounds overlapped keep their tokens with the GPU behind the host;
steady-state rounds never sync the host; a normal batch alone under IRQ costs at most 5% more than without it (and
what its per-layer pieces cost is reported); a replay of the Mooncake sample loses nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

CASE = Path(__file__).with_name("serving_gpu_case.py")
TIMEOUT_S = 300


def _case(*argv: str) -> dict:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, CASE_DUMP_AFTER_S=str(TIMEOUT_S - 30), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    try:
        proc = subprocess.run([sys.executable, str(CASE), *argv], capture_output=True, text=True, timeout=TIMEOUT_S,
                              env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"serving case {argv} hung past {TIMEOUT_S} s:\n{str(exc.stderr)[-8000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-8000:]
    result = json.loads(lines[-1])
    print(json.dumps(result)[:3000])
    assert proc.returncode == 0 and result["ok"], json.dumps(result)[:3000] + proc.stderr[-6000:]
    return result


@pytest.mark.parametrize("ahead", ["", "ahead"])
def test_irq_tokens_equal_each_batch_alone_with_captured_and_late_recalls(ahead: str) -> None:
    """Also recalling each layer's predicted blocks during the layer before (`ahead`): its wait captured into the
    next piece's graph."""
    result = _case("tokens", *filter(None, [ahead]))
    assert result["irq"]["m"], "IRQ recorded no m"


@pytest.mark.parametrize("ahead", ["", "ahead"])
def test_halves_tokens_equal_each_class_alone_with_captured_and_late_recalls(ahead: str) -> None:
    result = _case("halves", *filter(None, [ahead]))
    assert result["halves"]["warming_rounds"] > 0, "a new pair's first round runs eagerly, then both are captured"


def test_ridden_rounds_tokens_equal_each_class_alone_with_captured_and_late_recalls() -> None:
    _case("ride")


@pytest.mark.parametrize("ahead_budget", ["1", "1.5"])
def test_ridden_rounds_recalling_ahead_give_each_class_its_tokens_alone_with_captured_and_late_recalls(
        ahead_budget: str) -> None:
    """Also: captured, each layer's prediction, riders and resident attention are branches on streams of their own.
    With a prediction of 1.5 budgets it fills the hot set."""
    result = _case("ahead", ahead_budget)
    assert result["ride"]["streams"], "no ridden step was captured"


def test_vanilla_rounds_overlapped_with_the_gpu_behind_keep_their_tokens() -> None:
    _case("vanilla")


@pytest.mark.parametrize("overlap,two_streams,riders", [(False, False, ""), (True, False, ""), (True, True, ""),
                                                        (False, False, "halves"), (True, False, "halves"),
                                                        (False, False, "ride"), (True, False, "ride"),
                                                        (True, False, "ride ahead"), (True, False, "ahead"),
                                                        (True, True, "ahead"), (True, False, "halves ahead")])
def test_steady_state_rounds_never_sync_the_host(overlap: bool, two_streams: bool, riders: str) -> None:
    _case("nosync", "16", *(["overlap"] if overlap else []), *(["two-streams"] if two_streams else []),
          *riders.split())


@pytest.mark.parametrize("riders", ["", "ride ahead"])
def test_admissions_loads_beside_the_rounds_and_finishes_never_sync_the_host(riders: str) -> None:
    result = _case("nosync-admit", *riders.split())
    assert result["handoffs_landed"] >= 2, "the newcomers' KV loaded beside running rounds"


@pytest.mark.parametrize("model,batch,context", [("qwen3-8b", 32, 4096)])
def test_a_normal_batch_alone_under_irq_costs_at_most_5_percent_more(model: str, batch: int, context: int) -> None:
    _case("cost", model, str(batch), str(context), "30")


def test_a_replay_of_the_mooncake_sample_loses_nothing() -> None:
    result = _case("replay")
    assert result["summary"]["gpu_busy_fraction"] is not None
    roof = result["roofline"]                            # the rates measured before the clock, the bound from them
    assert roof["copy_gbps"] > 100 and roof["link_gbps"] > 1 and roof["bound_s"] > 0, roof
    assert roof["ratio"] > 1, roof                       # the tiny model's rounds are launch-bound, far from its bytes
