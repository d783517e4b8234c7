"""Trace replay with the tiny preset on the CPU: a 50-request slice of each trace format completes with every
request's full output, its report follows the schema, the modes compare side by side, and mistakes (a bad
trace line, a host pool the machine does not have, a request past the model's context) are refused first."""

from __future__ import annotations

import gc
import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from pulseio import DmaConfig
from pulseio_engine.cli import main
from pulseio_engine.config import DType, OffloadConfig
from pulseio_engine.kv.handoff import RandomKV
from pulseio_engine.kv.retrieval_heads import RetrievalHeads
from pulseio_engine.model.checkpoint import ModelSource, load_checkpoint, open_model
from pulseio_engine.serving.budget import KVClass
from pulseio_engine.serving.clock import ClockKind
from pulseio_engine.serving.config import ServeMode, ServingConfig
from pulseio_engine.serving.engine import ServingEngine, StepOutcome
from pulseio_engine.serving.gpu_busy import busy_fraction
from pulseio_engine.serving.metrics import Recorder, bucket_of
from pulseio_engine.serving.replay import WARMUP_TOKENS, ReplayOptions, replay, sweep_sizes, warm_up
from pulseio_engine.serving.report import SCHEMA_VERSION, ReportError, check_report, labels, load_report, table
from pulseio_engine.serving.roofline import RoundBytes, roofline
from pulseio_engine.sparse_bench import AHEAD_HITS
from pulseio_engine.trace import TraceOptions, open_trace

SLICES = {
    "mooncake": ["--trace", "mooncake-sample", "--requests", "50", "--max-input", "1536", "--max-output", "12",
                 "--offload-threshold", "1024"],
    "servegen": ["--trace", "servegen-sample", "--requests", "50", "--max-output", "12", "--offload-threshold", "208"],
}
COMMON = ["--model", "tiny", "--device", "cpu", "--gpu-kv-gib", "0.004", "--token-budget", "128", "--no-progress"]


def _replay(tmp_path: Path, name: str, fmt: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["replay", *SLICES[fmt], *COMMON, *extra, "--json", str(out)]) == 0
    return load_report(out)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("replay")
    return {
        "mooncake": _replay(tmp, "pulseinfer", "mooncake", "--mode", "pulseinfer", "--host-kv-gib", "0.25",
                            "--gpu-ahead", "3", "--copier-ctas", "16", "--copier-idle-us", "300",
                            "--no-overlap-rounds", "--plot", str(tmp / "p.png")),
        "servegen": _replay(tmp, "pulseinfer-sg", "servegen", "--mode", "pulseinfer", "--host-kv-gib", "0.25",
                            "--gpu-busy-every", "20", "--timeline-dir", str(tmp / "timelines")),
        "vanilla": _replay(tmp, "vanilla", "servegen", "--mode", "vanilla", "--no-warmup"),
        "plot": {"path": str(tmp / "p.png")},
        "timelines": {"dir": str(tmp / "timelines")},
    }


@pytest.mark.parametrize("fmt", ["mooncake", "servegen"])
def test_a_50_request_slice_completes_with_every_output(reports: dict[str, dict], fmt: str) -> None:
    report = reports[fmt]
    summary = report["summary"]
    assert summary["requests"] == summary["completed"] == 50 and summary["complete"]
    assert summary["output_tokens"] == summary["expected_tokens"] == sum(r["output_len"] for r in report["requests"])
    assert all(r["tokens"] == r["output_len"] and r["finished_s"] >= r["arrival_s"] for r in report["requests"])
    assert report["trace"]["format"] == fmt and len(report["trace"]["notes"]) >= 2
    classes = {r["class"] for r in report["requests"]}
    assert classes == {"normal", "offload"}, "the slice should exercise both batches"
    assert summary["recalls"] > 0 and summary["recalled_bytes"] > 0
    assert report["pulseio"]["submitted"] == report["pulseio"]["completed"] == summary["recalls"]
    assert report["pulseio"]["failed"] == 0
    for name in ("post_to_landed_us", "publish_to_taken_us", "publish_to_landed_us", "copy_per_mib_us"):
        lat = report["pulseio"][name]                  # over pulseio's last recalls, this replay's among them
        assert 0 < lat["count"] <= report["pulseio"]["submitted"] + 64 and 0 < lat["p50"] <= lat["p99"], (name, lat)
    assert report["pulseio"]["publish_to_taken_us"]["p50"] <= report["pulseio"]["publish_to_landed_us"]["p50"]
    early = report["pulseio"]["publish_to_early_landed_us"]     # the CPU's copier has no ids mirror to copy from
    assert early == {"count": 0, "p50": None, "p99": None}, early
    stamped = report["pulseio"]["stamped_requests"]            # recalls of no block carry no copier stamps
    assert 0 < stamped <= summary["recalls"] and report["pulseio"]["landed_early"] == 0
    flights = report["recall_flights"]                          # one round's recalls in FLIGHT_SAMPLE_EVERY, by kind
    assert 0 < flights["own"]["stamped"] + flights["ahead"]["stamped"] <= stamped
    assert (flights["ahead"]["stamped"] > 0) == report["config"]["ahead"]
    for kind in ("own", "ahead"):
        f = flights[kind]
        assert f["landed_early"] == f["publish_to_early_landed_us"]["count"] == 0
        assert f["publish_to_landed_us"]["count"] == min(f["stamped"], 4096) and f["bytes"] >= f["stamped"]
    assert report["pulseio"]["stamped_bytes"] == summary["recalled_bytes"] > 0      # every recall is RESIDENT here
    assert report["pulseio"]["stamped_publish_to_landed_s"] > 0
    m = report["m"]
    assert m["recalls"] == sum(m["histogram"].values()) == m["seen_landed"] + m["device_waits"]
    assert 0 < m["recalls"] <= summary["recalls"]             # m: rounds where both batches decode (interleaved)
    assert report["irq"] and report["config"]["steering"] and report["config"]["kv"] == "random (handed in)"
    assert report["tpot_ms"]["all"]["requests"] == sum(r["output_len"] >= 2 for r in report["requests"])
    assert report["timeline"]["t_s"] and max(report["timeline"]["offload_batch"]) > 0
    assert report["memory"]["gpu_kv_cap_bytes"] == int(0.004 * 2**30)
    assert report["config"]["gpu_ahead"] == (3 if fmt == "mooncake" else 8)       # overlapped rounds: 8 ahead
    assert report["config"]["overlap_rounds"] is (fmt == "servegen")                # the default; mooncake's: off
    default = DmaConfig()                                   # what the runtime ran with: given, or its own on a CPU
    copier = (16, 300) if fmt == "mooncake" else (default.zero_copy_ctas, default.resident_idle_us)
    assert (report["config"]["copier_ctas"], report["config"]["copier_idle_us"]) == copier
    assert report["summary"]["warmup_s"] > 0 and report["schema"] == "pulseio-replay/24"
    assert "pdl" not in report["config"] and "inductor_pdl" not in report["config"]      # dropped by schema 20
    assert "early_select" not in report["config"]                                        # dropped by schema 22
    assert summary["handoffs_landed"] == summary["handoffs_waited"] == 0      # a CPU loads handed-in KV at once
    assert report["config"]["hot_cache"] == 1.0
    unmet = [int(n) for batch in ("normal", "offload") for n in report["batches"][batch] if int(n) > 2]
    assert len(unmet) <= summary["step_graphs_built"] <= 2 * summary["rounds"]   # sizes the warm-up did not meet


@pytest.mark.parametrize("name", ["mooncake", "servegen", "vanilla"])
def test_the_roofline_counts_every_batch_step_launched(reports: dict[str, dict], name: str) -> None:
    """One batch step per batch present in a round (a step a round each, the default); no bound on a CPU."""
    report = reports[name]
    roof, batches = report["roofline"], report["batches"]
    present = sum(rounds for batch in ("normal", "offload") for size, rounds in batches[batch].items() if size != "0")
    assert roof["batch_steps"] == present > 0
    assert roof["weights_bytes"] > 0 and roof["kv_bytes"] > 0
    assert roof["recalled_bytes"] == report["summary"]["recalled_bytes"]
    assert 0 < roof["rounds_s"] <= report["summary"]["duration_s"]
    assert roof["copy_gbps"] is roof["bound_s"] is roof["ratio"] is roof["bound_tok_s"] is None    # a CPU
    assert re.search(r"^roofline tok/s \(rounds / bound\)\s+-$", table([report]), flags=re.M)


def test_older_reports_rooflines_are_estimated_from_their_records_as_the_replay_counts_them(
        reports: dict[str, dict]) -> None:
    """benchmarks/estimate_serving_roofline.py rebuilds a report's bytes from its requests and batch sizes: on
    these reports (no moves, one normal step a round) exactly what the replay counted as it launched the rounds."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "estimate_serving_roofline.py"
    spec = importlib.util.spec_from_file_location("estimate_serving_roofline", path)
    module = importlib.util.module_from_spec(spec)                      # type: ignore[arg-type]
    spec.loader.exec_module(module)                                     # type: ignore[union-attr]
    for name in ("mooncake", "servegen", "vanilla"):
        report = reports[name]
        roof = module.estimate(report, copy_gbps=100.0, link_gbps=10.0)
        counted = report["roofline"]
        assert (roof["weights_bytes"], roof["kv_bytes"], roof["batch_steps"]) == (
            counted["weights_bytes"], counted["kv_bytes"], counted["batch_steps"]), name
        assert roof["hbm_s"] == pytest.approx((counted["weights_bytes"] + counted["kv_bytes"]) / 100e9)


def test_the_table_shows_the_bound_as_a_throughput_and_the_rounds_over_it(reports: dict[str, dict]) -> None:
    report = json.loads(json.dumps(reports["vanilla"]))
    read = RoundBytes(weights=4 * 10**9, kv=0, steps=1)             # 2 ms at 2000 GB/s; 4 ms of rounds
    report["roofline"] = roofline(read, 0, 0.004, 10, copy_gbps=2000.0, link_gbps=None)
    check_report(report)
    assert re.search(r"^roofline tok/s \(rounds / bound\)\s+5,000\.0 \(2\.00x\)$", table([report]), flags=re.M)
    report["roofline"] = roofline(read, 10**8, 0.004, 10, copy_gbps=2000.0, link_gbps=25.0)     # 4 ms over the link
    assert re.search(r"^roofline tok/s \(rounds / bound\)\s+2,500\.0 \(1\.00x, link\)$", table([report]),
                     flags=re.M)


def test_the_main_threads_time_is_reported_by_phase(reports: dict[str, dict]) -> None:
    report = reports["mooncake"]
    phases, summary = report["host_ms_per_round"], report["summary"]
    assert list(phases) == ["outer", "schedule", "prepare", "launch", "pace", "tokens", "commit"]
    assert all(v >= 0 for v in phases.values())
    assert phases["launch"] > phases["tokens"]           # on a CPU the pieces compute as they are enqueued
    assert phases["pace"] == 0                           # and no pacer waits for a device
    in_rounds = sum(phases.values()) * summary["rounds"] / 1e3
    assert 0 < in_rounds <= summary["wall_s"] - summary["warmup_s"]
    rest = sum(v for k, v in phases.items() if k not in ("launch", "pace", "tokens"))
    row = re.search(r"^host ms/round launch/pace/rest/tokens\s+(\S+)$", table([report]), flags=re.M)
    assert row and row.group(1) == f"{phases['launch']:.2f}/0.00/{rest:.2f}/{phases['tokens']:.2f}", row


def test_vanilla_holds_every_request_on_the_gpu_and_the_table_compares(reports: dict[str, dict]) -> None:
    van, pulse = reports["vanilla"], reports["servegen"]
    assert van["summary"]["complete"] and van["m"] is None and van["pulseio"] is None
    assert {r["class"] for r in van["requests"]} == {"normal"} and van["summary"]["recalls"] == 0
    assert van["summary"]["warmup_s"] == 0                         # --no-warmup
    text = table([van, pulse])
    lines = text.splitlines()
    assert lines[0].split() == ["vanilla", "pulseinfer"]
    assert re.search(r"^  x vanilla\s+1\.00\s+\d+\.\d\d$", text, flags=re.M), text
    assert re.search(r"^TPOT p50/p99 <8K \(ms\)\s+[\d.]+/[\d.]+\s+[\d.]+/[\d.]+$", text, flags=re.M), text


def test_the_table_shows_what_a_loss_check_reads(reports: dict[str, dict]) -> None:
    """Tokens against the trace's, pulseio's recall counts, the host's RSS: '-' where a run has none."""
    van, pulse = reports["vanilla"], reports["servegen"]
    text = table([van, pulse])
    s, p, rss = pulse["summary"], pulse["pulseio"], pulse["timeline"]["rss_bytes"]
    tokens = re.search(r"^output tokens \(expected\)\s+(\S+ \(\S+\))\s+(\S+ \(\S+\))$", text, flags=re.M)
    assert tokens and tokens.group(2) == f"{s['output_tokens']:,} ({s['expected_tokens']:,})", text
    recalls = re.search(r"^recalls submitted/completed/failed\s+-\s+(\S+)$", text, flags=re.M)
    assert recalls and recalls.group(1) == f"{p['submitted']:,}/{p['completed']:,}/{p['failed']:,}", text
    host = re.search(r"^host RSS GiB first/peak/last\s+\S+\s+(\S+)$", text, flags=re.M)
    assert rss and host and host.group(1) == "/".join(f"{b / 2**30:.2f}" for b in (rss[0], max(rss), rss[-1])), text


def test_runs_of_one_mode_are_told_apart_by_the_settings_they_differ_in(reports: dict[str, dict]) -> None:
    runs = [reports["vanilla"], reports["mooncake"], reports["servegen"]]
    assert labels(runs) == ["vanilla", "pulseinfer thr=1024 ahead=3 ctas=16 idle_us=300 overlap=False",
                            "pulseinfer thr=208 ahead=8 ctas=64 idle_us=200 overlap=True"]
    assert table(runs).splitlines()[0].split()[:6] == ["vanilla", "pulseinfer", "thr=1024", "ahead=3", "ctas=16",
                                                       "idle_us=300"]
    assert reports["vanilla"]["config"]["copier_ctas"] is None
    assert labels(runs[:2]) == ["vanilla", "pulseinfer"]


def test_the_report_schema_names_what_is_wrong(reports: dict[str, dict]) -> None:
    report = json.loads(json.dumps(reports["mooncake"]))
    check_report(report)
    del report["summary"]["decode_throughput_tok_s"]
    with pytest.raises(ReportError, match=r"^r: summary\.decode_throughput_tok_s is missing$"):
        check_report(report, source="r")
    report = json.loads(json.dumps(reports["mooncake"]))
    report["requests"][3]["tokens"] = "12"
    with pytest.raises(ReportError, match=r"^r: requests\[3\]\.tokens must be int, got '12'$"):
        check_report(report, source="r")
    report = json.loads(json.dumps(reports["mooncake"]))
    report["irq"] = 1
    with pytest.raises(ReportError, match=r"^r: irq must be bool, got 1$"):
        check_report(report, source="r")


def _step_back(report: dict, version: int, *paths: str) -> None:
    """Delete `paths` ("config.gpu_ahead") from `report`: refused, naming the first (the check's order), until the
    schema says `version`, which lacks them all; then read."""
    for path in paths:
        *parents, key = path.split(".")
        node = report
        for parent in parents:
            node = node[parent]
        del node[key]
    with pytest.raises(ReportError, match=rf"^r: {re.escape(paths[0])} is missing$"):
        check_report(report, source="r")
    report["schema"] = f"pulseio-replay/{version}"
    assert check_report(report, source="r") is report


def test_reports_of_older_schemas_still_read_without_what_came_later(reports: dict[str, dict]) -> None:
    report, other = json.loads(json.dumps(reports["mooncake"])), reports["servegen"]
    assert report["config"]["skinny_gemm"] is False                  # a CPU: no skinny_linear
    rate = report["pulseio"]["stamped_bytes"] / report["pulseio"]["stamped_publish_to_landed_s"] / 1e9
    assert re.search(rf"^recall publish->landed GB/s \(of link\)\s+{rate:.3g}\s+[\d.]+$", table([report, other]),
                     flags=re.M), "no link measured on a CPU: the rate alone"
    pace = report["pulseio"]["copy_per_mib_us"]
    assert re.search(rf"^recall copy us/MiB p50/p99\s+{pace['p50']:,.1f}/{pace['p99']:,.1f}\s", table([report, other]),
                     flags=re.M)
    assert re.search(r"^GC collections gen 0/1/2\s+\d+/\d+/\d+\s", table([report, other]), flags=re.M)
    gap = report["longest_gaps"][0]
    assert re.search(rf"^longest gap ms \(round, GC\) at s\s+{gap['gap_ms']:,.1f} \({gap['round_ms']:,.1f}, "
                     rf"{gap['gc_ms']:,.1f}\) at {gap['t_s']:.1f}\s", table([report, other]), flags=re.M)
    report["longest_gaps"][0]["admitted"] = 1.5
    with pytest.raises(ReportError, match=r"^r: longest_gaps\[0\]\.admitted must be int, got 1\.5$"):
        check_report(report, source="r")
    report["longest_gaps"][0]["admitted"] = 1
    assert re.search(r"^recall publish->landed early p50/p99 \(us\)\s+-\s+-$", table([report, other]), flags=re.M)
    n = report["pulseio"]["stamped_requests"]
    assert re.search(rf"^recalls landed early / stamped\s+0 / {n:,} \(0%\)\s", table([report, other]), flags=re.M)
    own = report["recall_flights"]["own"]
    assert re.search(rf"^own recalls sampled: landed early, mean KiB\s+0 / {own['stamped']:,} \(0%\), "
                     rf"{own['bytes'] / own['stamped'] / 1024:,.0f}\s", table([report, other]), flags=re.M)
    lat = own["publish_to_landed_us"]
    assert re.search(rf"^own recall publish->landed p50/p99 \(us\)\s+{lat['p50']:,.0f}/{lat['p99']:,.0f}\s",
                     table([report, other]), flags=re.M)
    own["stamped"] = 1.5
    with pytest.raises(ReportError, match=r"^r: recall_flights\.own\.stamped must be int, got 1\.5$"):
        check_report(report, source="r")
    own["stamped"] = 1
    _step_back(report, 23, "recall_flights", "pulseio.stamped_requests", "pulseio.landed_early")
    assert re.search(r"^recalls landed early / stamped\s+-\s+0 / [\d,]+ \(0%\)$", table([report, other]), flags=re.M)
    assert re.search(r"^own recall publish->landed p50/p99 \(us\)\s+-\s+[\d,]+/[\d,]+$", table([report, other]),
                     flags=re.M)
    _step_back(report, 22, "pulseio.publish_to_early_landed_us")
    assert re.search(r"^recall publish->landed early p50/p99 \(us\)\s+-\s+-$", table([report, other]), flags=re.M)
    assert check_report(report, source="r") is report and "early_select" not in report["config"]   # schema 22
    report["schema"] = "pulseio-replay/21"                     # schema 21 alone had config.early_select
    with pytest.raises(ReportError, match=r"^r: config\.early_select is missing$"):
        check_report(report, source="r")
    report["config"]["early_select"] = 0
    with pytest.raises(ReportError, match=r"^r: config\.early_select must be bool, got 0$"):
        check_report(report, source="r")
    report["config"]["early_select"] = True
    assert check_report(report, source="r") is report
    _step_back(report, 20, "config.early_select")
    assert "pdl" not in report["config"]                                                  # schema 20: none
    report["schema"] = "pulseio-replay/19"                     # schema 19 alone had config.pdl, config.inductor_pdl
    with pytest.raises(ReportError, match=r"^r: config\.pdl is missing$"):
        check_report(report, source="r")
    report["config"].update(pdl=False, inductor_pdl=1)
    with pytest.raises(ReportError, match=r"^r: config\.inductor_pdl must be bool, got 1$"):
        check_report(report, source="r")
    report["config"]["inductor_pdl"] = False
    assert check_report(report, source="r") is report
    assert "pdl" not in " ".join(labels([report, other]))         # replay-table labels them no more
    _step_back(report, 18, "config.pdl", "config.inductor_pdl")
    _step_back(report, 17, "config.freeze_heap", "gc", "longest_gaps")
    assert re.search(r"^longest gap ms \(round, GC\) at s\s+-\s", table([report, other]), flags=re.M)
    assert labels([report, other])[1].endswith(" freeze=True")
    assert re.search(r"^GC collections gen 0/1/2\s+-\s+\d+/\d+/\d+$", table([report, other]), flags=re.M)
    assert re.search(r"^GC paused ms \(longest\)\s+-\s+[\d,]+ \([\d.]+\)$", table([report, other]), flags=re.M)
    _step_back(report, 16, "summary.handoffs_landed", "summary.handoffs_waited")
    _step_back(report, 15, "pulseio.copy_per_mib_us")
    assert re.search(r"^recall copy us/MiB p50/p99\s+-\s", table([report, other]), flags=re.M)
    _step_back(report, 14, "config.ahead_budget")
    _step_back(report, 13, "config.gil_switch_us")
    assert labels([report, other])[0].endswith(" gil_us=- freeze=-")
    _step_back(report, 12, "config.ahead", "summary.ahead_bytes")
    assert re.search(r"^of them recalled ahead GiB\s+-\s+0\.000$", table([report, other]), flags=re.M)
    _step_back(report, 10, "config.halves", "summary.halves_rounds")
    assert re.search(r"^rounds as halves\s+-\s+0$", table([report, other]), flags=re.M)
    halves = labels([report, {**other, "config": {**other["config"], "halves": True}}])[0]
    assert halves.endswith(" halves=- gil_us=- freeze=-"), halves
    _step_back(report, 9, "pulseio.stamped_bytes", "pulseio.stamped_publish_to_landed_s")
    assert re.search(r"^recall publish->landed GB/s \(of link\)\s+-\s", table([report, other]), flags=re.M)
    _step_back(report, 8, "config.hot_cache")
    hot = labels([report, {**other, "config": {**other["config"], "hot_cache": 2.0}}])[0]
    assert hot.endswith(" hot=- halves=- gil_us=- freeze=-"), hot
    _step_back(report, 7, "config.two_streams", "roofline")
    assert re.search(r"^roofline tok/s \(rounds / bound\)\s+-\s+-$", table([report, other]), flags=re.M)
    _step_back(report, 6, "host_ms_per_round.pace")
    assert re.search(r"^host ms/round launch/pace/rest/tokens\s+[\d.]+/-/[\d.]+/[\d.]+\s+[\d.]+/0\.00/",
                     table([report, other]), flags=re.M)
    _step_back(report, 5, "config.skinny_gemm")
    first, second = labels([report, other])
    assert first.endswith(" skinny=- overlap=False streams2=- hot=- halves=- gil_us=- freeze=-"), (first, second)
    assert second.endswith(" skinny=False overlap=True streams2=False hot=1.0 halves=False gil_us=100.0 freeze=True"), \
        (first, second)
    _step_back(report, 4, "config.normal_steps", "summary.normal_steps_mean")
    assert re.search(r"^normal steps a round \(mean\)\s+-\s+1\.00$", table([report, other]), flags=re.M)
    _step_back(report, 3, "config.gpu_ahead", "config.copier_ctas", "config.copier_idle_us",
               "summary.step_graphs_built", "pulseio.post_to_landed_us", "pulseio.publish_to_taken_us",
               "pulseio.publish_to_landed_us")
    assert re.search(r"^recall publish->landed p50/p99 \(us\)\s+-\s+[\d,]+/[\d,]+$", table([report, other]), flags=re.M)
    _step_back(report, 2, "host_ms_per_round")
    assert re.search(r"^host ms/round launch/pace/rest/tokens\s+-\s+[\d.]+/[\d.]+/[\d.]+/[\d.]+$",
                     table([report, other]), flags=re.M)
    _step_back(report, 1, "summary.warmup_s")
    assert re.search(r"^warm-up before the clock \(s\)\s+-\s+\d+\.\d$", table([report, other]), flags=re.M)
    report["schema"] = "pulseio-replay/0"
    with pytest.raises(ReportError, match=r"^r: schema is 'pulseio-replay/0', this engine reads 'pulseio-replay/24', "
                                          r"'pulseio-replay/23', 'pulseio-replay/22', 'pulseio-replay/21', "
                                          r"'pulseio-replay/20', 'pulseio-replay/19', 'pulseio-replay/18', "
                                          r"'pulseio-replay/17', "
                                          r"'pulseio-replay/16', 'pulseio-replay/15', 'pulseio-replay/14', "
                                          r"'pulseio-replay/13', "
                                          r"'pulseio-replay/12', 'pulseio-replay/11', 'pulseio-replay/10', "
                                          r"'pulseio-replay/9', "
                                          r"'pulseio-replay/8', 'pulseio-replay/7', 'pulseio-replay/6', "
                                          r"'pulseio-replay/5', 'pulseio-replay/4', 'pulseio-replay/3', "
                                          r"'pulseio-replay/2', 'pulseio-replay/1'$"):
        check_report(report, source="r")


def test_the_engine_docs_name_the_schema_reports_are_written_in() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "engine.md").read_text()
    assert re.findall(r"pulseio-replay/\d+", docs) == [SCHEMA_VERSION]


def _tiny_serving(source: ModelSource, mode: ServeMode = ServeMode.PULSEINFER, max_len: int = 512, *,
                  max_batch: int = 8, halves: bool = False, ride: bool = False) -> ServingEngine:
    """A serving engine of the tiny preset on the CPU, 64 MiB of KV on each side, batches of up to `max_batch`,
    requests of up to `max_len` tokens."""
    m = source.config
    config = ServingConfig(mode, gpu_kv_bytes=64 << 20, host_kv_bytes=64 << 20, token_budget=64,
                           max_batch=max_batch, halves=halves, ride=ride)
    heads = RetrievalHeads(m.num_kv_heads, best=(0,) * m.num_layers, worst=(1,) * m.num_layers)
    return ServingEngine(config, load_checkpoint(source, dtype=torch.float32, device="cpu"), device="cpu",
                         dtype=DType.FLOAT32, max_model_len=max_len, heads=heads)


def _record_rounds(serving: ServingEngine) -> list[tuple[int, int]]:
    """-> a list that each round of `serving` appends its (normal, offload) batch sizes to."""
    rounds: list[tuple[int, int]] = []
    step = serving.step

    def counted() -> StepOutcome:
        out = step()
        rounds.append((out.normal_batch, out.offload_batch))
        return out

    serving.step = counted                                              # type: ignore[method-assign]
    return rounds


def test_the_warm_up_runs_both_classes_at_one_then_two_requests_and_counts_from_zero() -> None:
    source = open_model("tiny")
    with _tiny_serving(source) as serving:
        rounds = _record_rounds(serving)
        assert warm_up(serving, source, 512, seed=0) > 0
        assert rounds == [(1, 1)] * WARMUP_TOKENS + [(2, 2)] * WARMUP_TOKENS
        assert not serving.has_unfinished() and serving.rounds == 0 and not serving.batch_sizes
        assert serving.inner.stats.recalls == 0 and serving.recall_statistics()[0] > 0  # pulseio's run on

        rounds.clear()                                                  # a prompt of 2 x budget does not fit
        small = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1 << 16, host_kv_bytes=64 << 20, token_budget=64)
        serving.config = small
        warm_up(serving, source, 512, seed=0)
        assert rounds == []


@pytest.mark.parametrize("max_len", [2, 3, 5])
def test_the_warm_up_fits_a_trace_of_requests_shorter_than_its_own(max_len: int) -> None:
    """Requests clipped below the warm-up's prompt and tokens (--max-input 1 --max-output 1): its requests stay within
    the longest the engine was built for, each class still decodes, and the engine counts from zero after."""
    source = open_model("tiny")
    with _tiny_serving(source, max_len=max_len) as serving:
        rounds = _record_rounds(serving)
        warm_up(serving, source, max_len, seed=0)
        tokens = min(WARMUP_TOKENS, max_len - 1)
        assert rounds == [(1, 1)] * tokens + [(2, 2)] * tokens
        assert not serving.has_unfinished() and serving.rounds == 0


def test_an_offload_engine_keeps_and_the_warm_up_meets_every_batch_size_its_cap_admits() -> None:
    """An offload cap past 16 requests (budget 1024 holds ~20 on the H200 at 6 GiB): the offload engine keeps a whole
    and a split step graph for each size up to it, and the sweep warms each, where both stopped at 16 before."""
    source = open_model("tiny")
    m = source.config
    config = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=64 << 20, host_kv_bytes=64 << 20, token_budget=64,
                           max_batch=24, max_offload_seqs=20)
    heads = RetrievalHeads(m.num_kv_heads, best=(0,) * m.num_layers, worst=(1,) * m.num_layers)
    with ServingEngine(config, load_checkpoint(source, dtype=torch.float32, device="cpu"), device="cpu",
                       dtype=DType.FLOAT32, max_model_len=64, heads=heads) as serving:
        assert serving.offload.offloader.offload.kept_step_graphs == 40              # type: ignore[union-attr]
        assert serving.normal.offloader.offload.kept_step_graphs == 32               # type: ignore[union-attr]
        assert sweep_sizes(serving, 34) == {KVClass.NORMAL: 16, KVClass.OFFLOAD: 20}


def test_max_offload_caps_the_offload_batch(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert main(["replay", *SLICES["mooncake"], *COMMON, "--mode", "pulseinfer", "--host-kv-gib", "0.25",
                 "--requests", "20", "--max-offload", "1", "--no-warmup", "--json", str(out)]) == 0
    report = load_report(out)                                   # without it: 3 offload requests, batches of 2
    assert report["summary"]["complete"] and report["memory"]["max_offload"] == 1
    assert max(int(size) for size in report["batches"]["offload"]) == 1


def test_hot_cache_gives_offload_requests_larger_hot_sets_steered_to_refill_from_them(tmp_path: Path) -> None:
    """--hot-cache 2: each offload request is charged twice the hot slots (fewer fit the GPU KV cap), the preset's
    steering refills from them as the 8K record simulated (budget 1024: the nearest record with hot caches), so the
    replay recalls less; the report records it."""
    runs = {}
    for f in ("1", "2"):
        out = tmp_path / f"hot{f}.json"
        assert main(["replay", *SLICES["mooncake"], *COMMON, "--mode", "pulseinfer", "--host-kv-gib", "0.25",
                     "--requests", "20", "--max-output", "8", "--gpu-kv-gib", "0.01", "--token-budget", "1024",
                     "--locality-context", "8192", "--hot-cache", f, "--no-warmup", "--json", str(out)]) == 0
        runs[f] = load_report(out)
    one, two = runs["1"], runs["2"]
    assert one["summary"]["complete"] and two["summary"]["complete"]
    assert (one["config"]["hot_cache"], two["config"]["hot_cache"]) == (1.0, 2.0)
    assert two["memory"]["max_offload"] < one["memory"]["max_offload"]
    assert "; hot sets of 2 budgets refilled as it simulated" in two["config"]["steering"]
    assert two["summary"]["recalled_bytes"] < one["summary"]["recalled_bytes"]
    assert labels([one, two]) == ["pulseinfer hot=1.0", "pulseinfer hot=2.0"]


def test_ahead_rides_and_prefetches_each_layer_steered_to_find_its_share_there(tmp_path: Path) -> None:
    """--ride --ahead --hot-cache 2: every request completes; each offloaded layer after the first posts a second
    recall a step (its prefetch), and the steering says what share of a layer's recall its prediction brought. A
    prediction of more than one budget (`--ahead-budget`, the largest measured) moves more ahead. Without --ride
    (IRQ's pieces) the same prefetches are posted."""
    runs, over = {}, max(AHEAD_HITS)
    for name, extra in (("ride", ["--ride"]), ("ahead", ["--ride", "--ahead"]),
                        ("over", ["--ride", "--ahead", "--ahead-budget", str(over)]), ("irq", ["--ahead"])):
        out = tmp_path / f"{name}.json"
        assert main(["replay", *SLICES["mooncake"], *COMMON, "--mode", "pulseinfer", "--host-kv-gib", "0.25",
                     "--requests", "12", "--max-output", "8", "--gpu-kv-gib", "0.01", "--token-budget", "1024",
                     "--locality-context", "8192", "--hot-cache", "2", *extra, "--no-warmup",
                     "--json", str(out)]) == 0
        runs[name] = load_report(out)
    ride, ahead = runs["ride"], runs["ahead"]
    assert ride["summary"]["complete"] and ahead["summary"]["complete"]
    assert (ride["mode"], ahead["mode"]) == ("pulseinfer --ride", "pulseinfer --ride --ahead")
    assert (ride["config"]["ahead"], ahead["config"]["ahead"]) == (False, True)
    assert f"; {AHEAD_HITS[1.0]:g} of each later layer's recall prefetched a layer early" in ahead["config"]["steering"]
    assert runs["over"]["mode"] == f"pulseinfer --ride --ahead --ahead-budget {over:g}"
    assert (ahead["config"]["ahead_budget"], runs["over"]["config"]["ahead_budget"]) == (1.0, over)
    assert (f"; {AHEAD_HITS[over]:g} of each later layer's recall prefetched a layer early by a prediction of "
            f"{over:g} budgets") in runs["over"]["config"]["steering"]
    assert runs["over"]["summary"]["complete"]
    assert runs["over"]["summary"]["ahead_bytes"] > ahead["summary"]["ahead_bytes"]
    steps = {name: sum(n for size, n in run["batches"]["offload"].items() if int(size)) for name, run in runs.items()}
    layers = ride["summary"]["recalls"] // steps["ride"]                   # offloaded: one recall each a step
    assert layers >= 2 and ride["summary"]["recalls"] == steps["ride"] * layers
    assert ahead["summary"]["recalls"] == steps["ahead"] * (2 * layers - 1)   # and a prefetch for all but the first
    irq = runs["irq"]
    assert irq["mode"] == "pulseinfer --ahead" and irq["summary"]["complete"]
    assert irq["summary"]["recalls"] == steps["irq"] * (2 * layers - 1)     # (test_irq: IRQ's interleaving with it)
    assert 0 < irq["summary"]["ahead_bytes"] < irq["summary"]["recalled_bytes"]
    assert ride["summary"]["ahead_bytes"] == 0 < ahead["summary"]["ahead_bytes"] < ahead["summary"]["recalled_bytes"]
    assert re.search(r"^of them recalled ahead GiB\s+0\.000\s+0\.\d{3}$", table([ride, ahead]), flags=re.M)


def test_an_ahead_budget_is_refused_without_ahead_beyond_the_hot_set_or_where_no_share_was_measured(
        capsys: pytest.CaptureFixture[str]) -> None:
    base = ["replay", *SLICES["mooncake"], *COMMON, "--mode", "pulseinfer", "--host-kv-gib", "0.25", "--requests", "2",
            "--gpu-kv-gib", "0.01", "--token-budget", "1024", "--locality-context", "8192", "--ride",
            "--hot-cache", "2"]
    unmeasured = 1.0 + sum(AHEAD_HITS) / 1000              # no measured budget
    for extra, why in ((["--ahead-budget", "1.5"], "--ahead-budget sizes the prediction of --ahead: give --ahead too"),
                       (["--ahead", "--ahead-budget", "2.5"], "OffloadConfig.ahead_budget (2.5: 160 blocks a row) "
                                                          "exceeds the hot set (2.0 budgets: 128 entries)"),
                       (["--ahead", "--ahead-budget", str(unmeasured)],
                        f"at a prediction of {', '.join(f'{b:g}' for b in sorted(AHEAD_HITS))} budgets; "
                        f"{unmeasured:g} was not measured")):
        assert main([*base, *extra]) == 2
        assert why in capsys.readouterr().err


def test_the_steering_follows_the_traces_prompts_or_the_option(reports: dict[str, dict], tmp_path: Path) -> None:
    """A random-weight preset's selection is steered to the locality measured nearest the trace's median prompt
    (the slice's are clipped to 1,536 tokens: the 2K record), or nearest --locality-context."""
    assert re.search(r"budget 512 context 2048:", reports["mooncake"]["config"]["steering"])
    out = tmp_path / "r.json"
    assert main(["replay", *SLICES["mooncake"], *COMMON, "--mode", "pulseinfer", "--host-kv-gib", "0.25",
                 "--requests", "8", "--locality-context", "4000", "--no-warmup", "--json", str(out)]) == 0
    assert re.search(r"budget 512 context 4096:", load_report(out)["config"]["steering"])


def _rounds_after_warm_up(mode: ServeMode, every_size: bool, batches: list[dict[KVClass, int]], *,
                          max_batch: int = 8, halves: bool = False, ride: bool = False
                          ) -> tuple[list[tuple[int, int]], dict[KVClass, int], int]:
    """-> the warm-up's rounds (normal, offload batch sizes), the sweep's largest size of each class, and the step
    graphs built by rounds of `batches` (class -> requests, one batch after the other) run after it."""
    source = open_model("tiny")
    with _tiny_serving(source, mode, max_batch=max_batch, halves=halves, ride=ride) as serving:
        rounds = _record_rounds(serving)
        warm_up(serving, source, 512, seed=0, every_size=every_size)
        warmed = len(rounds)
        tops = sweep_sizes(serving, 64)
        rid = 0
        for batch in batches:
            for kv_class, n in batch.items():                           # long enough to select and recall
                for _ in range(n):
                    serving.add(rid, [7 + rid] * 200, 3, kv_class, RandomKV(199, seed=rid))
                    rid += 1
            while serving.has_unfinished():
                serving.step()
        return rounds[:warmed], tops, serving.step_graphs_built()


def test_the_warm_up_can_meet_every_batch_size_so_that_no_step_is_captured_on_the_clock() -> None:
    normal, offload = KVClass.NORMAL, KVClass.OFFLOAD
    batches = [{offload: 3, normal: 2}, {offload: 2}]
    warm, tops, built = _rounds_after_warm_up(ServeMode.PULSEINFER, True, batches)
    assert min(tops.values()) >= 3, "the caps should let the sweep reach the sizes the rounds after it use"
    for n in range(1, tops[normal] + 1):                                # each size twice: eager, then captured
        for sizes in ((n, 1), (n, 0)):
            assert warm.count(sizes) >= 2, (sizes, warm)
    for n in range(1, tops[offload] + 1):
        for sizes in ((1, n), (0, n)):
            assert warm.count(sizes) >= 2, (sizes, warm)
    assert max(n for n, _ in warm) == tops[normal] and max(n for _, n in warm) == tops[offload]
    assert built == 0
    _, _, built = _rounds_after_warm_up(ServeMode.PULSEINFER, False, batches)
    assert built == 2          # without the sweep: the offload batch of 3 beside the normal one, and of 2 alone


def test_the_warm_up_meets_every_pair_of_halves_and_their_riders_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Halves: every offload batch of two or more beside a normal one, with riders' rows of 16 and of 32 (the
    engines keep step graphs enough for a normal batch of 24 to be swept)."""
    monkeypatch.setattr(OffloadConfig, "kept_step_graphs", 48)
    normal, offload = KVClass.NORMAL, KVClass.OFFLOAD
    batches = [{offload: 3, normal: 2}, {offload: 4, normal: 18}, {offload: 1, normal: 20}, {offload: 2}]
    warm, tops, built = _rounds_after_warm_up(ServeMode.PULSEINFER, True, batches, max_batch=24, halves=True)
    assert tops[normal] > 20 and tops[offload] >= 4, tops
    assert all(warm.count((tops[normal], n)) >= 2 for n in range(2, tops[offload] + 1)), warm
    assert built == 0
    _, _, built = _rounds_after_warm_up(ServeMode.PULSEINFER, False, batches, max_batch=24, halves=True)
    assert built == 2 + 2 + 1 + 1       # two pairs, the offload batch of 1 beside the normal one, and of 2 alone


def test_the_warm_up_meets_every_ridden_step_at_each_riders_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ride: every offload batch beside a normal one, with riders' rows of 16 and of 32; nothing is captured after."""
    monkeypatch.setattr(OffloadConfig, "kept_step_graphs", 48)
    normal, offload = KVClass.NORMAL, KVClass.OFFLOAD
    batches = [{offload: 3, normal: 2}, {offload: 4, normal: 18}, {offload: 1, normal: 20}, {offload: 2}]
    warm, tops, built = _rounds_after_warm_up(ServeMode.PULSEINFER, True, batches, max_batch=24, ride=True)
    assert tops[normal] > 20 and tops[offload] >= 4, tops
    for rows in (16, 32):
        assert all(warm.count((min(rows, tops[normal]), n)) >= 2 for n in range(1, tops[offload] + 1)), warm
    assert built == 0
    _, _, built = _rounds_after_warm_up(ServeMode.PULSEINFER, False, batches, max_batch=24, ride=True)
    assert built == 4       # 3 beside 16 rider rows, 4 and 1 beside 32, and 2 alone


def test_the_warm_up_sweeps_quests_single_batch_too() -> None:
    warm, tops, built = _rounds_after_warm_up(ServeMode.QUEST, True, [{KVClass.NORMAL: 3}])
    assert list(tops) == [KVClass.NORMAL] and tops[KVClass.NORMAL] >= 3
    assert all(warm.count((n, 0)) >= 2 for n in range(1, tops[KVClass.NORMAL] + 1)), warm
    assert built == 0
    assert _rounds_after_warm_up(ServeMode.QUEST, False, [{KVClass.NORMAL: 3}])[2] == 1


def test_the_size_sweep_keeps_its_requests_within_the_replays_longest() -> None:
    source = open_model("tiny")
    with _tiny_serving(source, max_len=12) as serving:                 # prompt + output of at most 12 tokens
        rounds = _record_rounds(serving)
        warm_up(serving, source, 12, seed=0, every_size=True)
        assert (0, sweep_sizes(serving, 12)[KVClass.OFFLOAD]) in rounds and not serving.has_unfinished()


def test_replay_plots(reports: dict[str, dict], tmp_path: Path) -> None:
    assert Path(reports["plot"]["path"]).stat().st_size > 10_000
    files = []
    for name in ("vanilla", "servegen"):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(reports[name]))
        files.append(str(path))
    assert main(["replay-table", *files, "--plot", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 10_000


def test_a_bad_trace_line_is_one_line_naming_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 50, "output_length": 4}\n'
                     '{"timestamp": 10, "input_length": 50, "output_lenght": 4}\n')
    assert main(["replay", "--trace", str(trace), *COMMON, "--mode", "vanilla"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"pulseio-engine replay: error: {trace}:2: no output_length; a Mooncake record has timestamp, "
                   "input_length, output_length"]


def test_a_host_pool_larger_than_the_host_is_refused_before_anything_is_allocated(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("PULSEIO_MEMORY_LIMIT", "1G")
    argv = ["replay", *SLICES["servegen"], *COMMON, "--mode", "pulseinfer", "--host-kv-gib", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--host-kv-gib asks for a host pool of 2.00 GiB, more than the 1.00 GiB this machine offers" in err
    assert "building" not in err


def test_several_normal_steps_without_graphs_on_a_gpu_are_refused_before_the_model_is_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The serving engine's rule, checked by the replay before it loads the weights (this machine need not have a
    GPU: nothing reaches one)."""
    module = sys.modules[replay.__module__]
    monkeypatch.setattr(module, "load_checkpoint",
                        lambda *a, **k: pytest.fail("the replay built the model before refusing its options"))
    config = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1 << 22, host_kv_bytes=1 << 28, normal_steps=2)
    trace = open_trace(TraceOptions("mooncake-sample", max_requests=2, max_input=512, max_output=4))
    with pytest.raises(ValueError, match=r"normal_steps=2 advances the normal batch .* use CUDA graphs"):
        replay(trace, open_model("tiny"), config, ReplayOptions(device="cuda", use_cuda_graphs=False))


def test_a_request_past_the_models_context_is_refused_with_the_fix(capsys: pytest.CaptureFixture) -> None:
    assert main(["replay", "--trace", "mooncake-sample", "--requests", "5", *COMMON, "--mode", "vanilla"]) == 2
    err = capsys.readouterr().err
    assert "requests exceed tiny's context of 4096 positions" in err and "--max-input and --max-output" in err


@pytest.mark.parametrize("argv,says", [
    (["--mode", "quest", "--no-irq"], "--no-irq turns pulseinfer's interleaving off; --mode quest"),
    (["--mode", "vanilla", "--host-kv-gib", "1"], "--host-kv-gib sizes the offload modes' host pool"),
    (["--mode", "vanilla", "--selection", "quest"], "vanilla attends densely"),
    (["--mode", "quest", "--copier-ctas", "8"], "--copier-ctas sets the offload modes' resident copier; --mode quest"),
    (["--mode", "quest", "--hot-cache", "2"], "--hot-cache sizes the offload modes' hot sets; --mode quest offloads"),
    (["--mode", "pulseinfer", "--hot-cache", "0.5"], "argument --hot-cache: must be >= 1.0, got 0.5"),
    (["--mode", "pulseinfer", "--hot-cache", "nan"], "argument --hot-cache: must be >= 1.0, got nan"),
    (["--mode", "pulseinfer", "--hot-cache", "2", "--requests", "2"],
     "budget 2048 context 4096 simulated no hot cache larger than the budget, so it cannot steer one of 2 budgets"),
    (["--mode", "pulseinfer", "--copier-idle-us", "0"], "argument --copier-idle-us: must be >= 1, got 0"),
    (["--mode", "quest", "--ahead"],
     "--ahead recalls each layer's predicted blocks during the layer before, through pulseinfer's doorbell; --mode "
     "quest has no such recall"),
    (["--mode", "pulseinfer", "--ahead"], "--ahead recalls into the hot sets' spare entries: give --hot-cache"),
    (["--mode", "pulseinfer", "--ride", "--ahead"],
     "--ahead recalls into the hot sets' spare entries: give --hot-cache"),
    (["--mode", "quest", "--token-budget", "100"], "token_budget (100) must be a multiple of block_size (16)"),
    (["--mode", "warp"], "'warp'"),
    (["--mode", "pulseinfer", "--no-irq", "--two-streams"], "two_streams puts IRQ's two batches on two streams; "
                                                             "pulseinfer --no-irq does not interleave"),
    (["--mode", "pulseinfer", "--two-streams", "--device", "cpu", "--requests", "2"],
     "two_streams runs IRQ's batches on two CUDA streams; cpu has none"),
])
def test_option_mistakes_are_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["replay", "--trace", "servegen-sample", "--model", "tiny", "--gpu-kv-gib", "1", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_busy_fraction_counts_overlaps_once() -> None:
    assert busy_fraction([(0, 2), (1, 3), (5, 6)], 0, 10) == pytest.approx(0.4)
    assert busy_fraction([(-5, 1), (9, 20)], 0, 10) == pytest.approx(0.2)
    assert busy_fraction([], 0, 10) == 0.0


def test_tpot_is_the_time_between_a_requests_tokens_bucketed_by_input() -> None:
    rec = Recorder()
    rec.arrived(0, 0.0, 100, 3, "a")
    rec.arrived(1, 0.0, 9000, 2, "b")
    rec.round(1.0, 1.0, 1, 1, {0: 1, 1: 1}, {})
    rec.round(1.5, 0.5, 1, 1, {0: 1, 1: 1}, {1: (5, 6)})
    rec.round(3.0, 1.5, 1, 0, {0: 1}, {0: (1, 2, 3)})
    tpot = rec.tpot_by_bucket()
    assert tpot["<8K"]["p50_ms"] == pytest.approx(1000.0) and tpot["8K-32K"]["p50_ms"] == pytest.approx(500.0)
    assert tpot[">=32K"]["requests"] == 0 and tpot["all"]["requests"] == 2
    assert [bucket_of(n) for n in (8191, 8192, 32767, 32768)] == ["<8K", "8K-32K", "8K-32K", ">=32K"]


def test_the_longest_gaps_between_rounds_say_what_happened_inside_them() -> None:
    rec = Recorder()
    for rid in range(3):
        rec.arrived(rid, 0.0, 100, 2, "a")
    rec.admitted(0, 0.0, "normal")
    rec.round(1.0, 1.0, 1, 0, {0: 1}, {})
    rec.admitted(1, 1.2, "normal")
    rec.admitted(2, 1.4, "offload")
    rec.round(4.0, 0.5, 2, 1, {0: 1, 1: 1, 2: 1}, {0: (1, 2)}, gc_s=2.25)
    rec.round(4.5, 0.5, 1, 1, {1: 1, 2: 1}, {1: (3, 4)})
    rec.round(6.5, 0.5, 0, 1, {2: 1}, {2: (5, 6)}, gc_s=0.25)
    gaps = rec.longest_gaps(2)
    assert gaps == [{"t_s": 4.0, "gap_ms": 3000.0, "round_ms": 500.0, "gc_ms": 2250.0, "admitted": 2, "finished": 1},
                    {"t_s": 6.5, "gap_ms": 2000.0, "round_ms": 500.0, "gc_ms": 250.0, "admitted": 0, "finished": 1}]
    assert len(rec.longest_gaps()) == 3 and Recorder().longest_gaps() == []


@pytest.mark.slow
def test_a_real_model_prefills_its_prompts_and_serves_both_classes(tmp_path: Path) -> None:
    """smollm2 (fetched on first use): no handed-in KV, so each prompt is prefilled here, in its class's engine."""
    from pulseio_engine.fetch import FetchError, fetch_smollm2

    try:
        fetch_smollm2()
    except FetchError as exc:
        pytest.skip(f"SmolLM2 is not available here: {exc}")
    out = tmp_path / "real.json"
    argv = ["replay", "--trace", "servegen-sample", "--requests", "6", "--max-output", "6", "--model", "smollm2",
            "--mode", "pulseinfer", "--selection", "quest", "--gpu-kv-gib", "0.05", "--host-kv-gib", "0.25",
            "--offload-threshold", "212", "--token-budget", "128", "--device", "cpu", "--no-progress", "--json",
            str(out)]
    assert main(argv) == 0
    report = load_report(out)
    assert report["summary"]["complete"] and report["config"]["kv"] == "prefilled"
    assert report["config"]["steering"] is None and {r["class"] for r in report["requests"]} == {"normal", "offload"}


def test_the_busy_meter_profiles_one_window_per_period_walks_each_as_it_closes_and_leaves_pulseio_kernels_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import torch

    from pulseio_engine.serving.gpu_busy import BusyMeter

    started: list[int] = []
    walked: list[int] = []

    def event(name: str, start: float, end: float) -> types.SimpleNamespace:
        return types.SimpleNamespace(name=name, device_type=torch.autograd.DeviceType.CUDA,
                                     time_range=types.SimpleNamespace(start=start, end=end))

    class FakeProfiler:
        def __init__(self, activities: list) -> None:
            pass

        def start(self) -> None:
            started.append(meter._round)
            time.sleep(0.002)          # as CUPTI's first load holds the host

        def stop(self) -> None:
            pass

        def events(self) -> list:      # a 100 us window: model kernels cover 0-30 and 50-60; the copier all of it
            walked.append(meter._round)
            return [event("gemm", 0, 20), event("norm", 10, 30), event("attn", 50, 60),
                    event("_resident_copy_kernel", 0, 100), event("wait_seq", 30, 50), event("Memcpy HtoD", 60, 100)]

    monkeypatch.setattr(torch.profiler, "profile", FakeProfiler)
    meter = BusyMeter("cuda", every=10, rounds=3)
    opened, spent = [], []
    for _ in range(25):
        opened.append(meter.before_round())
        spent.append(meter.after_round())
    assert started == [7, 17] and walked == [10, 20], "a window is walked as it closes, before the next opens"
    assert [i for i, s in enumerate(opened) if s > 0] == [7, 17], "a start's seconds are returned by its round"
    assert min(opened[7], opened[17]) >= 0.002
    assert [i for i, s in enumerate(spent) if s > 0] == [9, 19], "the walk's seconds are returned by its round"
    assert meter.fraction() == pytest.approx(40 / 100) and len(meter.windows) == 2
    assert BusyMeter("cpu").fraction() is None


def test_the_busy_meter_writes_each_windows_timeline_with_the_hosts_calls_as_it_closes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pulseio_engine.serving.gpu_busy import BusyMeter

    kinds: list[list] = []
    written: list[str] = []
    running: list[bool] = []

    class FakeProfiler:
        def __init__(self, activities: list) -> None:
            kinds.append(activities)

        def start(self) -> None:
            running.append(True)

        def stop(self) -> None:
            running[-1] = False

        def export_chrome_trace(self, path: str) -> None:
            written.append(path)

        def events(self) -> list:
            return []

    monkeypatch.setattr(torch.profiler, "profile", FakeProfiler)
    meter = BusyMeter("cuda", every=10, rounds=3, timeline_dir=tmp_path / "t")
    for _ in range(28):                                 # the replay ends inside its third window
        meter.before_round()
        meter.after_round()
    activity = torch.profiler.ProfilerActivity
    names = ("rounds-7-9.json", "rounds-17-19.json", "rounds-27-27.json")
    assert kinds == [[activity.CUDA, activity.CPU]] * 3 and running == [False, False, True]
    assert written == [str(tmp_path / "t" / name) for name in names[:2]], "each closed window is written at once"
    meter.stop()                                        # after the last round: the open window is closed, written
    assert running == [False, False, False] and meter.fraction() is None
    assert written == [str(tmp_path / "t" / name) for name in names]
    assert meter.timelines == [Path(p) for p in written] and (tmp_path / "t").is_dir()


def test_a_cpu_replay_writes_timelines_of_the_host_and_refuses_a_timeline_without_windows(
        reports: dict[str, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rounds = reports["servegen"]["summary"]["rounds"]
    files = sorted(Path(reports["timelines"]["dir"]).glob("rounds-*.json"))
    # 5 rounds in every 20 (the last may be cut); overlapped, the meter counts the round calls, a few more than the
    # rounds collected (each restart after an idle engine launches one before it collects one)
    spans = sorted((int(a), int(b)) for a, b in (f.stem.split("-")[1:] for f in files))
    assert [a for a, _ in spans] == [15 + 20 * i for i in range(len(spans))] and len(spans) >= rounds // 20 > 0
    assert all(b == a + 4 for a, b in spans[:-1]) and spans[-1][0] <= spans[-1][1] <= spans[-1][0] + 4, spans
    names = {e.get("name") for e in json.loads(files[0].read_text())["traceEvents"]}
    assert any(str(n).startswith("aten::") for n in names), sorted(map(str, names))[:20]
    assert reports["servegen"]["summary"]["gpu_busy_fraction"] is None  # on a CPU: no GPU kernel to count

    assert main(["replay", *SLICES["servegen"], *COMMON, "--mode", "vanilla", "--gpu-busy-every", "0",
                 "--timeline-dir", str(tmp_path / "t")]) == 2
    assert "--gpu-busy-every 0 profiles none" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_status_lines_report_at_most_every_interval_and_always_the_last_request() -> None:
    from pulseio_engine.serving.cli import StatusLines

    now, lines = [0.0], []
    status = StatusLines(5, every_s=10.0, clock=lambda: now[0], out=lines.append)
    for t, done in ((1.0, 1), (9.0, 2), (10.5, 2), (12.0, 3), (13.0, 5)):
        now[0] = t
        status.update(done, {"normal": 4, "waiting": 0})
    assert lines == ["replay: 2/5 requests finished after 10 s wall; normal 4 waiting 0",
                     "replay: 5/5 requests finished after 13 s wall; normal 4 waiting 0"]


def test_time_kept_off_the_clock_delays_a_wall_clock_and_leaves_a_virtual_one_as_it_is() -> None:
    from pulseio_engine.serving.clock import Clock, ClockKind

    wall = Clock(ClockKind.WALL)
    before = wall.now()
    wall.exclude(5.0)
    assert wall.now() < before, "five seconds of measuring are not serving time"
    virtual = Clock(ClockKind.VIRTUAL)
    virtual.ran(0.25)
    virtual.exclude(5.0)
    assert virtual.now() == 0.25


def test_the_pacers_naps_move_from_the_launch_to_their_own_phase() -> None:
    from pulseio_engine.serving.host_time import HostTimes

    host = HostTimes()
    host.seconds["launch"] = 0.5
    host.move(0.2, "launch", "pace")
    assert host.ms_per_round(2)["launch"] == pytest.approx(150) and host.ms_per_round(2)["pace"] == pytest.approx(100)


def test_time_kept_out_of_the_host_phases_is_charged_to_none_of_them() -> None:
    import time

    from pulseio_engine.serving.host_time import HostTimes

    host = HostTimes()
    time.sleep(0.2)                     # measuring the run, in the middle of the outer phase
    host.exclude(0.2)
    host.lap("outer")
    host.lap("schedule")
    assert host.seconds["outer"] < 0.1 and host.seconds["schedule"] < 0.1


def test_overlapped_rounds_lose_nothing(tmp_path: Path) -> None:
    """Overlapped rounds (the default) on a slice with moves (requests growing past the threshold) and both classes:
    every request completes with its output length, every recall lands, and the report says the rounds overlapped."""
    report = _replay(tmp_path, "overlap", "servegen", "--mode", "pulseinfer", "--host-kv-gib", "0.25",
                     "--normal-steps", "2")
    s = report["summary"]
    assert report["config"]["overlap_rounds"] is True and s["complete"]
    assert report["moves"]["to_offload"] > 0, "the slice should move requests (each collects the round first)"
    assert s["output_tokens"] == s["expected_tokens"] == sum(r["output_len"] for r in report["requests"])
    assert all(r["tokens"] == r["output_len"] for r in report["requests"])
    assert {r["class"] for r in report["requests"]} == {"normal", "offload"}
    assert report["pulseio"]["submitted"] == report["pulseio"]["completed"] == s["recalls"] > 0


def test_the_gil_switch_interval_is_the_replays_while_it_serves_and_the_interpreters_after() -> None:
    """The main loop's Python holds pulseio's poller off the GIL for up to the switch interval
    (`pulseio.gil_switch_interval`): a replay shortens it while the engine serves, and only then."""
    before = sys.getswitchinterval()
    seen: list[float] = []
    config = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1 << 22, host_kv_bytes=1 << 28, token_budget=128,
                           offload_threshold=256)
    trace = open_trace(TraceOptions("mooncake-sample", max_requests=4, max_input=512, max_output=4))
    report = replay(trace, open_model("tiny"), config, ReplayOptions(gil_switch_s=3e-4, warmup=False),
                    progress=lambda done, info: seen.append(sys.getswitchinterval()))
    assert report["summary"]["complete"] and seen, "progress is reported while the engine serves"
    assert seen == pytest.approx([3e-4] * len(seen), abs=2e-6)
    assert sys.getswitchinterval() == before
    assert report["config"]["gil_switch_us"] == pytest.approx(300)


def test_the_heap_is_frozen_out_of_collection_while_the_engine_serves_and_only_then() -> None:
    """A full collection walks every object the process tracks, and after the warm-up that is torch's, the kernels'
    and the engine's (`pulseio.frozen_heap`): a replay freezes them while it serves and counts every collection."""
    config = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1 << 22, host_kv_bytes=1 << 28, token_budget=128,
                           offload_threshold=256)
    trace = open_trace(TraceOptions("mooncake-sample", max_requests=4, max_input=512, max_output=30))
    for freeze in (True, False):
        frozen: list[int] = []

        def progress(done: int, info: dict, frozen: list[int] = frozen) -> None:
            frozen.append(gc.get_freeze_count())
            gc.collect()

        report = replay(trace, open_model("tiny"), config,
                        ReplayOptions(warmup=False, freeze_heap=freeze, clock=ClockKind.WALL), progress=progress)
        assert report["summary"]["complete"] and frozen, "progress is reported while the engine serves"
        assert all(n > 10_000 for n in frozen) if freeze else frozen == [0] * len(frozen), frozen
        assert gc.get_freeze_count() == 0
        assert report["config"]["freeze_heap"] is freeze
        collections = report["gc"]["collections"]
        assert collections[2] >= len(frozen), "each progress call collected in full, and was counted"
        assert report["gc"]["paused_s"] >= report["gc"]["longest_ms"] / 1e3 > 0
        gaps = report["longest_gaps"]                     # on the wall clock, each pause falls inside a gap
        assert [g["gap_ms"] for g in gaps] == sorted((g["gap_ms"] for g in gaps), reverse=True)
        assert all(g["gap_ms"] >= g["gc_ms"] for g in gaps)
        if not freeze:                                    # a full walk of torch's objects: the longest stretch
            assert gaps[0]["gc_ms"] > gaps[0]["round_ms"], gaps[0]


def test_the_gil_switch_interval_left_alone_and_a_bad_one_refused(reports: dict[str, dict],
                                                                   capsys: pytest.CaptureFixture) -> None:
    assert reports["mooncake"]["config"]["gil_switch_us"] == pytest.approx(100)     # the command's default
    argv = ["replay", *SLICES["servegen"], *COMMON, "--mode", "vanilla", "--gil-switch-us"]
    assert main([*argv, "2e6"]) == 2
    assert "--gil-switch-us 2e+06 is over a second; the interpreter's default is 5000" in capsys.readouterr().err
    assert main([*argv, "-1"]) == 2
    assert "--gil-switch-us" in capsys.readouterr().err
