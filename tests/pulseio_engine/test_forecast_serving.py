"""benchmarks/forecast_serving.py: the replay's own scheduling without an engine, each round timed by its bytes."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pulseio_engine.cli import main
from pulseio_engine.config import DType
from pulseio_engine.model.checkpoint import open_model
from pulseio_engine.serving.config import ServingConfig
from pulseio_engine.serving.pools import plan_pools
from pulseio_engine.serving.report import load_report
from pulseio_engine.step_bytes import StepShape, step_bytes
from pulseio_engine.trace import Trace, TraceOptions, TraceRequest, open_trace

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "forecast_serving.py"
SPEC = importlib.util.spec_from_file_location("forecast_serving", PATH)
forecast_serving = importlib.util.module_from_spec(SPEC)            # type: ignore[arg-type]
sys.modules["forecast_serving"] = forecast_serving                  # its dataclasses look their module up
SPEC.loader.exec_module(forecast_serving)                           # type: ignore[union-attr]

OPTIONS = dict(gpu_kv_gib=0.004, host_kv_gib=0.25, offload_threshold=1024, token_budget=128, normal_steps=1)


def test_the_forecast_admits_and_batches_as_the_replay_does(tmp_path: Path) -> None:
    """Every request arrives at once (arrivals x1e-9), so nothing depends on how long a round takes: the forecast's
    rounds must hold the requests the tiny preset's replay on the CPU held, round for round, in the same classes."""
    out = tmp_path / "r.json"
    window = ["--trace", "mooncake-sample", "--requests", "40", "--max-input", "1536", "--max-output", "12",
              "--time-scale", "1e-9"]
    assert main(["replay", *window, "--model", "tiny", "--device", "cpu", "--mode", "pulseinfer", "--gpu-kv-gib",
                 "0.004", "--host-kv-gib", "0.25", "--offload-threshold", "1024", "--token-budget", "128",
                 "--no-overlap-rounds", "--no-warmup", "--no-progress", "--json", str(out)]) == 0
    report = load_report(out)
    trace = open_trace(TraceOptions("mooncake-sample", max_requests=40, max_input=1536, max_output=12,
                                    time_scale=1e-9))
    config = forecast_serving.serving_config("pulseinfer", **OPTIONS)
    f = forecast_serving.forecast(trace, "tiny", config, forecast_serving.Rates(100.0, 10.0, 1.0),
                                  dtype=DType.FLOAT32)
    assert report["summary"]["complete"] and report["summary"]["rounds"] == f.rounds
    assert f.recorder.batch_histogram() == report["batches"]
    assert {r.rid: (r.kv_class, r.tokens) for r in f.recorder.requests.values()} == {
        r["id"]: (r["class"], r["tokens"]) for r in report["requests"]}
    assert {"normal", "offload"} == {r["class"] for r in report["requests"]}      # both batches were exercised


def _two(short: int, long: int, output: int) -> Trace:
    return Trace((TraceRequest(0.0, short, output, "a"), TraceRequest(0.0, long, output, "b")), "two", "mooncake")


def test_a_round_of_both_batches_is_their_bytes_and_the_recall_the_normal_batch_did_not_hide() -> None:
    """Two requests, one a class, decoding together: the first round is the offload request's hot sets filled (an
    exposed recall, under IRQ or coupled), the second its warm recall, hidden behind the normal step where it can be,
    timed at the hiding rate given (else the mode's)."""
    trace = _two(300, 4000, 3)
    model = open_model("tiny").config
    for (irq, hide) in itertools.product(("pulseinfer", "pulseinfer --no-irq"), (None, 1.2)):
        rates = forecast_serving.Rates(copy_gbps=50.0, link_gbps=2.0, efficiency=1.5, hide_efficiency=hide)
        config = forecast_serving.serving_config(irq, gpu_kv_gib=1.0, host_kv_gib=1.0, offload_threshold=1024,
                                                 token_budget=256, normal_steps=1)
        shape = StepShape.for_model(model, dtype_bytes=2, sparse=config.sparse_config(), dense_layers=2)
        warm, fill = forecast_serving.recall_per_token(config, model, shape, forecast_serving.steering_context(trace))
        assert 0 < warm < fill
        f = forecast_serving.forecast(trace, "tiny", config, rates)
        durations = [r.dt_s for r in f.recorder.rounds]
        assert len(durations) == 3 and all(r.normal == 1 and r.offload == 1 for r in f.recorder.rounds)
        for i, dt in enumerate(durations):
            normal = step_bytes(shape, [300 + i]).total / 50e9
            offload = step_bytes(shape, [4000 + i], offload=True).total / 50e9
            recall = (fill if i == 0 else warm) / 2e9
            hidden = min(recall, (hide or 1.5) * normal) if irq == "pulseinfer" else 0.0   # at the normal pieces'
            assert dt == pytest.approx(1.5 * (normal + offload) + recall - hidden, rel=1e-9), (irq, hide, i)   # rate


def test_the_fitted_efficiency_gives_back_the_throughput_it_was_fitted_to() -> None:
    trace = _two(300, 4000, 20)
    config = forecast_serving.serving_config("pulseinfer", gpu_kv_gib=1.0, host_kv_gib=1.0, offload_threshold=1024,
                                             token_budget=256, normal_steps=1)
    made = forecast_serving.forecast(trace, "tiny", config, forecast_serving.Rates(50.0, 2.0, 1.37)).throughput
    assert forecast_serving.fit_efficiency(trace, "tiny", config, 50.0, 2.0, made) == pytest.approx(1.37, rel=1e-6)
    best = forecast_serving.forecast(trace, "tiny", config, forecast_serving.Rates(50.0, 2.0, 0.5)).throughput
    assert forecast_serving.fit_efficiency(trace, "tiny", config, 50.0, 2.0, 1.01 * best) is None, "out of reach"
    trace = Trace(tuple(TraceRequest(0.0, n, 20, "a") for n in (300, 4000, 4100)), "t", "mooncake")    # halves
    made = forecast_serving.forecast(trace, "tiny", config, forecast_serving.Rates(50.0, 2.0, 1.4, None, 1.8),
                                     halves=True).throughput
    assert forecast_serving.fit_efficiency(trace, "tiny", config, 50.0, 2.0, made, halves=True, efficiency=1.4) == \
        pytest.approx(1.8, rel=1e-6)
    with pytest.raises(ValueError, match="needs the other rounds'"):
        forecast_serving.fit_efficiency(trace, "tiny", config, 50.0, 2.0, made, halves=True)


def test_the_efficiency_a_short_tpot_needs_gives_back_that_tpot() -> None:
    """`short_p99_ms`: the largest `e` whose < 8K requests' TPOT p99 stays within the target; a target below what
    the recall alone allows is out of reach; one target at a time."""
    trace = _two(300, 4000, 20)
    config = forecast_serving.serving_config("pulseinfer", gpu_kv_gib=1.0, host_kv_gib=1.0, offload_threshold=1024,
                                             token_budget=256, normal_steps=1)

    def p99(e: float) -> float:
        return forecast_serving.forecast(trace, "tiny", config, forecast_serving.Rates(50.0, 2.0, e)).short_tpot_ms()[1]

    e = forecast_serving.fit_efficiency(trace, "tiny", config, 50.0, 2.0, None, short_p99_ms=p99(1.37))
    assert e == pytest.approx(1.37, rel=1e-5) and p99(e) <= p99(1.37) * (1 + 1e-6) < p99(1.01 * e)
    assert forecast_serving.fit_efficiency(trace, "tiny", config, 50.0, 2.0, None, short_p99_ms=0.99 * p99(0.5)) \
        is None, "out of reach"
    with pytest.raises(ValueError, match="fits one target"):
        forecast_serving.fit_efficiency(trace, "tiny", config, 50.0, 2.0, 100.0, short_p99_ms=p99(1.37))


def test_a_larger_hot_cache_recalls_less_and_fits_fewer_offload_requests() -> None:
    """Hot sets two budgets large, on the shipped 16K record (it simulates 1.5, 2 and 4 budgets): the recall the
    replay steers to (`rewarm_for`), the GPU bytes its engine allocates (`plan_pools`)."""
    model = open_model("qwen3-14b").config
    config = forecast_serving.serving_config("pulseinfer", gpu_kv_gib=6.0, host_kv_gib=32.0, offload_threshold=4096,
                                             token_budget=2048, normal_steps=1)
    shape = StepShape.for_model(model, dtype_bytes=2, sparse=config.sparse_config(), dense_layers=2)
    one, fill = forecast_serving.recall_per_token(config, model, shape, 16384)
    two, fill_two = forecast_serving.recall_per_token(config, model, shape, 16384, 2.0)
    three, _ = forecast_serving.recall_per_token(config, model, shape, 16384, 3.0)      # between 2 and 4
    four, _ = forecast_serving.recall_per_token(config, model, shape, 16384, 4.0)
    assert two < one / 2 and fill_two == fill, "a fifth to a quarter at 16K: the hot set fills as before"
    assert four <= three <= two
    with pytest.raises(ValueError, match="context 4096 simulated no hot cache larger than the budget, so it cannot "
                                         "steer one of 2 budgets"):
        forecast_serving.recall_per_token(config, model, shape, 4096, 2.0)
    built, wider = (plan_pools(replace(config, hot_cache=f), model, DType.BFLOAT16)[0] for f in (1.0, 2.0))
    assert wider.offload_fixed == 2 * built.offload_fixed == 2 * 38 * 128 * 16 * 2 * 8 * 128 * 2
    trace = open_trace(TraceOptions("mooncake-sample", duration_s=20, time_scale=0.3, max_input=32000,
                                    max_output=1024))
    rates = forecast_serving.Rates(4290.0, 44.0, 1.6)
    built, larger = (forecast_serving.forecast(trace, "qwen3-14b", config, rates, locality_context=16384,
                                               hot_cache=f) for f in (1.0, 2.0))
    assert larger.offload_mean < built.offload_mean, "each offload request holds twice the hot slots"
    assert larger.exposed_recall_s < built.exposed_recall_s


def test_halves_rounds_hide_the_recall_behind_all_of_their_work_at_their_own_efficiency() -> None:
    """Halves where the engine runs them: three offload requests (one round each, all cold) beside a normal one run
    as halves, the round their work at the halves' efficiency or their recall over the link, whichever is longer;
    alone, or one offload request beside the normal one, the round is IRQ's (or one batch's), at the mode's."""
    model = open_model("tiny").config
    rates = forecast_serving.Rates(copy_gbps=50.0, link_gbps=2.0, efficiency=1.5, halves_efficiency=1.75)
    config = forecast_serving.serving_config("pulseinfer", gpu_kv_gib=1.0, host_kv_gib=1.0, offload_threshold=1024,
                                             token_budget=256, normal_steps=1)
    shape = StepShape.for_model(model, dtype_bytes=2, sparse=config.sparse_config(), dense_layers=2)
    for lengths in ([4000, 4100, 4200], [300, 4000, 4100, 4200], [300, 4000]):
        trace = Trace(tuple(TraceRequest(0.0, n, 1, "a") for n in lengths), "t", "mooncake")
        _, fill = forecast_serving.recall_per_token(config, model, shape, forecast_serving.steering_context(trace))
        long = [n for n in lengths if n > 1024]
        offload = step_bytes(shape, long, offload=True)
        normal = sum(step_bytes(shape, [n]).total for n in lengths if n <= 1024)
        recall = len(long) * fill / 2e9
        (dt,) = [r.dt_s for r in forecast_serving.forecast(trace, "tiny", config, rates, halves=True).recorder.rounds]
        irq = 1.5 * (normal + offload.total) / 50e9 + recall - min(recall, 1.5 * normal / 50e9)
        want = max(1.75 * (normal + offload.total) / 50e9, recall) if normal and len(long) >= 2 else irq
        assert dt == pytest.approx(want, rel=1e-9), lengths
    fast = replace(rates, link_gbps=1e6, halves_efficiency=None)       # no recall to hide, the same efficiency: IRQ
    trace = Trace(tuple(TraceRequest(0.0, n, 1, "a") for n in (300, 4000, 4100)), "t", "mooncake")
    assert [r.dt_s for r in forecast_serving.forecast(trace, "tiny", config, fast, halves=True).recorder.rounds] == \
        pytest.approx([r.dt_s for r in forecast_serving.forecast(trace, "tiny", config, fast).recorder.rounds])


def test_a_ridden_round_reads_the_weights_once_and_an_ahead_round_hides_its_prefetch_behind_its_work() -> None:
    """One cold round of a normal request and two offload ones: ridden, its bytes less one read of the weights at
    `e` plus the whole recall; ahead, the prefetch's traffic hidden behind the work, what it missed exposed (under
    IRQ, hidden behind the normal step where it can be); alone, a batch's round is the same in every mode."""
    model = open_model("tiny").config
    rates = forecast_serving.Rates(copy_gbps=50.0, link_gbps=2.0, efficiency=1.5)
    config = forecast_serving.serving_config("pulseinfer --ride", gpu_kv_gib=1.0, host_kv_gib=1.0,
                                             offload_threshold=1024, token_budget=256, normal_steps=1)
    assert not config.interleaves
    shape = StepShape.for_model(model, dtype_bytes=2, sparse=config.sparse_config(), dense_layers=2)
    trace = Trace(tuple(TraceRequest(0.0, n, 1, "a") for n in (300, 4000, 4100)), "t", "mooncake")
    _, fill = forecast_serving.recall_per_token(config, model, shape, forecast_serving.steering_context(trace))
    offload = step_bytes(shape, [4000, 4100], offload=True)
    normal = step_bytes(shape, [300])
    work, recall = 1.5 * (normal.total - normal.weights + offload.total) / 50e9, 2 * fill / 2e9

    def dt(ahead: tuple[float, float] | None, ride: bool = True, within: ServingConfig = config,
           on: Trace = trace) -> list[float]:
        return [r.dt_s for r in forecast_serving.forecast(on, "tiny", within, rates, ride=ride,
                                                          ahead=ahead).recorder.rounds]

    assert dt(None) == pytest.approx([work + recall], rel=1e-9)
    assert dt((1.2, 0.25)) == pytest.approx([max(work, 1.2 * recall) + 0.25 * recall], rel=1e-9)
    coupled = 1.5 * (normal.total + offload.total) / 50e9 + recall
    assert dt(None, ride=False) == pytest.approx([coupled], rel=1e-9) and coupled > work + recall
    irq = replace(config, irq=None)                                     # `pulseinfer --ahead`: IRQ's pieces
    assert irq.interleaves
    both = 1.5 * (normal.total + offload.total) / 50e9
    for p, x in ((1.2, 0.25), (0.1, 0.9), (1.43, 0.39)):
        want = max(both, p * recall) + max(0.0, x * recall - 1.5 * normal.total / 50e9)
        assert dt((p, x), ride=False, within=irq) == pytest.approx([max(want, (p + x) * recall)], rel=1e-9)
    assert max(both, 1.43 * recall) + max(0.0, 0.39 * recall - 1.5 * normal.total / 50e9) < 1.82 * recall, \
        "the link's bound binds in one of these rounds"
    alone = Trace((TraceRequest(0.0, 4000, 1, "a"),), "t", "mooncake")
    assert dt(None, on=alone) == pytest.approx(dt(None, ride=False, on=alone))


def test_a_steered_ahead_replay_is_fitted_with_its_own_prefetch_traffic() -> None:
    """`--fit` of a random-weight `--ride --ahead` replay: 1 - AHEAD_HITS of today's recall exposed (its steering, at
    its prediction's budget), and the prefetch's traffic in today's recalls from the bytes the report says moved
    ahead."""
    from pulseio_engine.sparse_bench import AHEAD_HITS

    for budget, hits in AHEAD_HITS.items():
        config = {} if budget == 1.0 else {"ahead_budget": budget}      # (reports before schema 15 have none)
        report = {"summary": {"recalled_bytes": 3_000, "ahead_bytes": 2_000}, "config": config}
        traffic, exposed = forecast_serving._steered_ahead(report)
        assert exposed == pytest.approx(1 - hits)
        assert traffic == pytest.approx(2 * exposed)            # twice the exposed bytes moved ahead
    assert forecast_serving.mode_of({"mode": "pulseinfer --ride --ahead --ahead-budget 1.25"}) in forecast_serving.MODES
    assert forecast_serving.mode_of({"mode": "pulseinfer --ride --ahead"}) == "pulseinfer --ride --ahead"
    for mode in ("pulseinfer --ahead --ahead-budget 1.25", "pulseinfer --no-irq --ahead"):   # IRQ's, coupled
        assert forecast_serving.mode_of({"mode": mode}) in forecast_serving.MODES
