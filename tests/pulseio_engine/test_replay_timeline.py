"""`replay --timeline-dir`'s traces read back: the GPU's idle gaps between model kernels (pulseio's own kernels do
not count), summed by length, and the host calls that overlap each gap most."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pulseio_engine.cli import main
from pulseio_engine.serving.timeline import describe, read_window


def _kernel(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def _host(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur}


def _write(path: Path, events: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": [{"ph": "i", "cat": "Trace", "name": "start", "ts": 0}, *events]}))
    return path


# Model kernels cover 1000-1100, 1105-1200, 1250-1300 and 2800-3000: gaps of 5, 50 and 1500 us; the copier spans
# everything and does not count. The host commits tokens during the long gap and launches a graph in the 50 us one.
EVENTS = [
    _kernel("gemm", 1000, 100), _kernel("norm", 1105, 95), _kernel("attn", 1250, 50), _kernel("gemm", 2800, 200),
    _kernel("_resident_copy_kernel", 900, 2200), _kernel("wait_seq", 1300, 1500),
    _host("cudaGraphLaunch", 1210, 20), _host("serving.commit", 1300, 1000), _host("aten::copy_", 2400, 300),
    _host("aten::copy_", 2790, 100),
]


def test_gaps_are_the_stretches_without_a_model_kernel_with_the_host_calls_that_overlap_them_most(
        tmp_path: Path) -> None:
    w = read_window(_write(tmp_path / "rounds-5-9.json", EVENTS), longest=2, top_host=2)
    assert (w.start_us, w.span_us) == (1000, 2000)
    assert [(g.start_us, g.end_us) for g in w.gaps] == [(1300, 2800), (1200, 1250), (1100, 1105)]
    assert w.idle_us == 1555 and w.idle_by_length() == [5, 50, 0, 1500]
    assert w.gaps[0].host == (("serving.commit", 1000), ("aten::copy_", 310))
    assert w.gaps[1].host == (("cudaGraphLaunch", 20),) and w.gaps[2].host == () and w.listed == 2
    text = describe([w])
    assert "rounds-5-9.json                  2.00  22.3%  0.01 / 0.05 / 0.00 / 1.50" in text, text
    assert "1500.0 us at +0.30 ms: serving.commit 1000 us, aten::copy_ 310 us" in text, text
    assert "+0.10 ms" not in text, "only the 2 longest gaps are listed"



def test_run_time_is_summed_by_model_kernel_over_windows_leaving_pulseio_kernels_out(tmp_path: Path) -> None:
    a = read_window(_write(tmp_path / "rounds-0-4.json", EVENTS))
    b = read_window(_write(tmp_path / "rounds-5-9.json", [_kernel("void gemm<128>(float*)", 0, 30)]))
    assert a.kernels == {"gemm": (300.0, 2), "norm": (95.0, 1), "attn": (50.0, 1)}
    text = describe([a, b], kernels=2)
    lines = text.split("the model's kernels by run time")[1].splitlines()
    assert "(0.5 ms of kernels, 5 launches; the 2 longest)" in lines[0], text
    assert lines[2].split() == ["0.33", f"{330 / 2030:.1%}", "3", "110.0", "gemm"], text
    assert lines[3].split()[-1] == "norm" and "attn" not in text.split("by run time")[1].split("device waits")[0]
    assert "by run time" not in describe([a], kernels=0)

def _on(stream: int, event: dict) -> dict:
    return {**event, "args": {"stream": stream}}


def test_the_main_chain_between_weight_products_where_it_attends_is_summed_by_what_fills_it(tmp_path: Path) -> None:
    """On the stream with the most model-kernel time: each stretch from a weight product's end to the next one's
    start with an attention kernel in it, by kernel (device waits too), the rest idle; a stretch without attention
    (the MLP's activation), another stream's kernels and the copier's are no part of one."""
    chain = [("_skinny_gemm_kernel", 0, 100), ("norm", 102, 3), ("_select_kernel", 106, 10), ("wait_seq", 120, 30),
             ("_paged_decode_split_kernel", 150, 20), ("nvjet_sm90_tst", 175, 25), ("silu", 200, 2),
             ("_skinny_gemm_kernel", 205, 95), ("norm", 300, 4), ("attn", 306, 14), ("_skinny_gemm_kernel", 322, 80)]
    events = [_on(7, _kernel(name, ts, dur)) for name, ts, dur in chain]
    events += [_on(9, _kernel("_select_kernel", 110, 30)), _on(9, _kernel("attn", 140, 20)),
               _on(11, _kernel("_resident_copy_kernel", 0, 400))]
    w = read_window(_write(tmp_path / "rounds-0-4.json", events))
    assert [(s.us, dict(s.parts), s.idle_us) for s in w.sections] == [
        (75.0, {"norm": 3.0, "_select_kernel": 10.0, "wait_seq": 30.0, "_paged_decode_split_kernel": 20.0}, 12.0),
        (22.0, {"norm": 4.0, "attn": 14.0}, 4.0)]
    text = describe([w], kernels=3).split("where it attends: ")[1]
    assert text.startswith("2 stretches, p50 / p90 / mean 48.5 / 69.7 / 48.5 us"), text
    assert [line.split() for line in text.splitlines()[1:5]] == [["15.0", "wait_seq"], [
        "10.0", "_paged_decode_split_kernel"], ["7.0", "attn"], ["8.0", "(the", "chain", "idle)"]]
    assert "where it attends" not in describe([read_window(_write(tmp_path / "none.json", EVENTS[:1]))])


def test_the_cli_reads_a_folder_in_round_order_and_refuses_one_without_timelines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for first in (25, 5, 15):
        _write(tmp_path / "tl" / f"rounds-{first}-{first + 4}.json", EVENTS if first != 15 else EVENTS[:1])
    _write(tmp_path / "tl" / "rounds-copy.json", EVENTS)
    kept = _write(tmp_path / "tl" / "rounds-35-39.json", EVENTS)            # a timeline kept gzipped, read as it is
    kept.with_suffix(".json.gz").write_bytes(gzip.compress(kept.read_bytes()))
    kept.unlink()
    assert main(["replay-gaps", str(tmp_path / "tl"), "--longest", "1"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[1:6]] == ["rounds-5-9.json", "rounds-15-19.json",
                                                                   "rounds-25-29.json", "rounds-35-39.json.gz",
                                                                   "rounds-copy.json"]
    assert "rounds-35-39.json.gz             2.00  22.3%" in out, out
    assert "rounds-15-19.json                0.10 100.0%" in out, out
    assert main(["replay-gaps", str(tmp_path / "empty")]) == 2
    assert "no timeline there" in capsys.readouterr().err


def test_gaps_are_summed_by_the_model_kernels_around_them_with_what_ran_inside(tmp_path: Path) -> None:
    memset = {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 1210, "dur": 5}
    late = [_kernel("void at::native::norm<float>(int)", 3100, 50), _kernel("ns::attn[abi:v1](Array<int>)", 3200, 50)]
    w = read_window(_write(tmp_path / "rounds-5-9.json", [*EVENTS, memset, *late]), longest=1)
    by_pair = {(b.before, b.after, b.inside): v for b, v in w.boundaries.items()}
    assert by_pair == {("gemm", "norm", ""): (105, 2), ("norm", "attn", "Memset"): (50, 1),
                       ("norm", "attn", ""): (50, 1), ("attn", "gemm", "wait_seq"): (1500, 1)}
    text = describe([w], boundaries=2)
    assert "    1.50  66.7%      1   1500.0  attn -> gemm [wait_seq]" in text, text
    assert "    0.10   4.7%      2     52.5  gemm -> norm\n" in text, text
    assert "norm -> attn" not in text, "only the 2 boundaries losing most are listed"


def test_each_device_wait_is_read_against_the_publish_before_it(tmp_path: Path) -> None:
    """A recall published at 1000 is waited for from 1200 to 1500 with model kernels filling 190 us before the wait,
    and the next publish comes 100 us after it; that one, at 1600, is waited for from 1700 to 1720 after 95 us, the
    window's last; a wait with no publish before it is not a recall's."""
    events = [_kernel("wait_seq", 900, 50), _kernel("gemm", 950, 50),
              _kernel("pulseio::_publish_kernel[abi:v1]", 1000, 10), _kernel("norm", 1010, 190),
              _kernel("pulseio::wait_seq[abi:v1]", 1200, 300), _kernel("attn", 1500, 100),
              _kernel("_publish_kernel", 1600, 5), _kernel("gemm", 1605, 95), _kernel("wait_word", 1700, 20),
              _kernel("attn", 1720, 30)]
    w = read_window(_write(tmp_path / "rounds-0-4.json", events))
    assert [(r.recall_us, r.work_us, r.idle_us, r.chain_us) for r in w.recalls] == [(500, 190, 300, 100),
                                                                                       (120, 95, 20, None)]
    text = describe([w])
    assert "device waits for recalls: 2, idle inside them 0.32 ms (40.0% of the timeline)" in text, text
    assert ("per wait, p50 / p90 us: publish -> the wait's end 310.0 / 462.0; the model's kernels in between "
            "142.5 / 180.5; idle in the wait 160.0 / 272.0; the wait's end -> the next publish 100.0 / 100.0"
            ) in text, text
    assert "\n  rounds-0-4.json                   2  310.0 / 142.5 / 160.0 / 100.0\n" in text, text


def test_a_layers_own_recall_runs_from_its_publish_to_the_last_wait_where_the_main_chain_attends(
        tmp_path: Path) -> None:
    """Stream 7 runs the weights (the main chain). Layer 1 projects at 1000-1030, waits for its recall ahead, selects
    the riders at 1035-1045; stream 9 selects the batch's own at 1034-1046 and publishes 1046-1056, then predicts the
    next layer (select 1060-1070) and publishes that recall ahead at 1070 (before the chain's wait, so not the latest
    publish before it but the second since the projection began); the chain attends and waits 1080-1100 (from the
    own publish: 34 us to the wait, 54 to its end), attends, and runs o_proj and the MLP as one run of products.
    Layer 2 selects early, on stream 11 beside its projection (select 1205-1215, publish 1215-1225), and the chain
    waits 1270-1275. Layer 3 waits with no publish since its projection began (no window); a stretch that never
    attends (stream 7's last) is none either."""
    def on(stream: int, event: dict) -> dict:
        return {**event, "args": {"stream": stream}}

    events = [on(7, _kernel("gemm", 1000, 30)), on(7, _kernel("wait_seq", 1032, 2)),
              on(7, _kernel("_select_kernel", 1035, 10)), on(9, _kernel("_select_kernel", 1034, 12)),
              on(9, _kernel("_publish_kernel", 1046, 10)), on(7, _kernel("attn", 1046, 34)),
              on(9, _kernel("_select_kernel", 1060, 10)), on(9, _kernel("_publish_kernel", 1070, 5)),
              on(7, _kernel("wait_seq", 1080, 20)), on(7, _kernel("attn", 1100, 10)),
              on(7, _kernel("gemm", 1110, 20)), on(7, _kernel("gemm", 1130, 70)),
              on(7, _kernel("gemm", 1200, 30)), on(11, _kernel("_select_kernel", 1205, 10)),
              on(11, _kernel("_publish_kernel", 1215, 10)), on(7, _kernel("attn", 1235, 35)),
              on(9, _kernel("_publish_kernel", 1240, 5)), on(7, _kernel("wait_seq", 1270, 5)),
              on(7, _kernel("attn", 1275, 5)), on(7, _kernel("gemm", 1280, 20)),
              on(7, _kernel("attn", 1300, 10)), on(7, _kernel("wait_seq", 1310, 5)), on(7, _kernel("gemm", 1315, 20)),
              on(7, _kernel("norm", 1335, 10)), on(7, _kernel("wait_seq", 1345, 5)), on(7, _kernel("gemm", 1350, 20))]
    w = read_window(_write(tmp_path / "rounds-0-4.json", events))
    assert w.windows == ((12, 10, 34, 54), (10, 10, 55, 60))
    assert ("a layer's own recall, from its publish's start to the last wait where the main chain attends, "
            "p50 / p90 us: the selection before it ran 11.0 / 11.8, the publish 10.0 / 10.0, the chain waits from "
            "44.5 / 52.9, the recall landed at 57.0 / 59.4 (2 windows)") in describe([w])


def test_the_time_no_weight_product_runs_is_shared_among_what_runs_then(tmp_path: Path) -> None:
    """Weight products cover 0-100 and 200-300; outside them a norm, a select and an attention overlapping it by
    20 us (each takes half), 10 us with nothing, a device wait, and the riders' attention past the second product's
    end (its part under the product is the weights' time). The copier, running throughout, is no part of it."""
    events = [_kernel("void gemm<64>(float*)", 0, 100), _kernel("norm", 100, 20), _kernel("_select_kernel", 120, 30),
              _on(2, _kernel("attn", 130, 40)), _kernel("wait_seq", 180, 20), _kernel("nvjet_tst", 200, 100),
              _on(3, _kernel("rider_attn", 250, 70)), _kernel("_resident_copy_kernel", -50, 500)]
    w = read_window(_write(tmp_path / "rounds-0-4.json", events))
    assert w.outside == {"norm": 20, "_select_kernel": 20, "attn": 30, "(no kernel)": 10, "wait_seq": 20,
                         "rider_attn": 20}
    text = describe([w], kernels=2)
    assert "no weight product running: 0.1 ms of 0.3 (37.5%, 0.02 ms a round of 0.06); what runs then" in text, text
    lines = text.split("what runs then")[1].splitlines()
    assert lines[2:4] == ["      0.03  25.0%  attn", "      0.02  16.7%  norm"], lines
    other = read_window(_write(tmp_path / "window.json", events))
    assert "(37.5%); what runs then" in describe([other]), "no rounds in the name: no mean a round"
