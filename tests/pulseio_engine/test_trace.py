"""Traces: Mooncake records and ServeGen draws, read exactly, bad lines named by file:line, transformations
noted; the shipped samples small, with their source and licence."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from pulseio_engine.trace import (
    SAMPLES,
    TraceError,
    TraceOptions,
    clip_lengths,
    draw_requests,
    open_trace,
    read_client,
    read_mooncake,
    sample_path,
    scale_time,
    take_window,
)
from pulseio_engine.trace.servegen import read_arrivals, read_lengths

GOOD = '{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]}'


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_mooncake_sample_is_the_upstream_head() -> None:
    trace = read_mooncake(sample_path("mooncake-sample"))
    assert len(trace) == 400 and trace.format == "mooncake"
    first, last = trace.requests[0], trace.requests[-1]
    assert (first.arrival_s, first.input_len, first.output_len) == (0.0, 6758, 500)
    assert (last.arrival_s, last.input_len, last.output_len) == (141.0, 18203, 359)
    assert first.origin == "conversation_trace_head400.jsonl:1"


BAD_MOONCAKE = [
    ("{not json", "not JSON"),
    ('[1, 2]', "a JSON list, expected an object"),
    ('{"timestamp": 3000, "input_length": 5}', "no output_length"),
    ('{"timestamp": 3000, "input_length": -4, "output_length": 5}', "input_length must be an integer >= 1, got -4"),
    ('{"timestamp": 3000, "input_length": 4.5, "output_length": 5}', "got 4.5"),
    ('{"timestamp": 3000, "input_length": true, "output_length": 5}', "got True"),
    ('{"timestamp": 3000, "input_length": 4, "output_length": 0}', "output_length must be an integer >= 1, got 0"),
    ('{"timestamp": -1, "input_length": 4, "output_length": 2}', "timestamp must be an integer >= 0"),
    ('{"timestamp": 3000, "input_length": 4, "output_length": 2, "hash_ids": "x"}', "hash_ids must be a list"),
    ("", "empty line"),
]


@pytest.mark.parametrize("bad,says", BAD_MOONCAKE, ids=[s for _, s in BAD_MOONCAKE])
def test_a_bad_mooncake_line_is_named_by_file_and_line(tmp_path: Path, bad: str, says: str) -> None:
    path = _write(tmp_path, "t.jsonl", [GOOD, GOOD.replace('"timestamp": 0', '"timestamp": 3000'), bad, GOOD])
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))}:3: .*{re.escape(says)}"):
        read_mooncake(path)


def test_mooncake_arrivals_must_not_go_back_in_time(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.jsonl", [GOOD.replace('"timestamp": 0', '"timestamp": 9000'), GOOD])
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))}:2: timestamp 0 ms is earlier than the line "
                                         r"before \(9000 ms\)"):
        read_mooncake(path)


BAD_CSV = [
    ("600,1.0,1.0,Gamma,1.0", "5 columns"),
    ("600,fast,1.0,Gamma,1.0,1.0", "a number is not a number"),
    ("600,1.0,1.0,Poisson,1.0,1.0", "pattern 'Poisson'"),
    ("600,1.0,1.0,,0,0", "needs a pattern with shape and scale > 0"),
    ("600,1.0,1.0,Gamma,0,1.0", "needs a pattern with shape and scale > 0"),
    ("600,-1.0,1.0,Gamma,1.0,1.0", "must be finite and >= 0"),
    ("0,1.0,1.0,Gamma,1.0,1.0", "does not follow 0 s"),
]


@pytest.mark.parametrize("bad,says", BAD_CSV, ids=[s for _, s in BAD_CSV])
def test_a_bad_servegen_line_is_named_by_file_and_line(tmp_path: Path, bad: str, says: str) -> None:
    path = _write(tmp_path, "chunk-9-trace.csv", ["0,0,0,,0,0", bad])
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))}:2: .*{re.escape(says)}"):
        read_arrivals(path)


def test_a_bad_length_distribution_names_its_line_and_window(tmp_path: Path) -> None:
    path = tmp_path / "chunk-9-dataset.json"
    path.write_text('{\n  "0": {"input_tokens": "{5: 1.0}", "output_tokens": "{3: 1.0}"},\n'
                    '  "21600": {"input_tokens": "{5: oops}", "output_tokens": "{3: 1.0}"}\n}\n')
    with pytest.raises(TraceError, match=rf"^{re.escape(str(path))}:3 \(window '21600'\) input_tokens: expected a "
                                         r"string holding a dict literal"):
        read_lengths(path)
    path.write_text('{"0": {"input_tokens": "{5: 1.0}"}}')
    with pytest.raises(TraceError, match=r":1 \(window '0'\): expected an object with input_tokens and output_tokens"):
        read_lengths(path)


def test_a_servegen_client_without_its_dataset_is_refused(tmp_path: Path) -> None:
    csv = _write(tmp_path, "chunk-9-trace.csv", ["0,1,1,Gamma,1,1"])
    with pytest.raises(TraceError, match="chunk-9-dataset.json are missing"):
        open_trace(TraceOptions(str(csv)))


def _client():
    path = sample_path("servegen-sample")
    return read_client(path, path.with_name("chunk-3-dataset.json"))


def test_servegen_draws_are_deterministic_and_per_window() -> None:
    client = _client()
    a = draw_requests([client], seed=5, start_s=7200, duration_s=600, source="s")
    b = draw_requests([client], seed=5, start_s=7200, duration_s=600, source="s")
    c = draw_requests([client], seed=6, start_s=7200, duration_s=600, source="s")
    longer = draw_requests([client], seed=5, start_s=7200, duration_s=1200, source="s")
    assert a.requests == b.requests and a.requests != c.requests
    assert longer.requests[:len(a)] == a.requests, "a window's draws do not depend on the windows drawn after it"


def test_servegen_draws_follow_the_window_rate_and_the_length_pmfs() -> None:
    client = _client()
    window = next(w for w in client.windows if w.start_s == 7200)
    trace = draw_requests([client], seed=0, start_s=7200, duration_s=600, source="s")
    assert math.ceil(window.rate * 600) - 1 <= len(trace) <= math.ceil(window.rate * 600)
    assert all(0 <= r.arrival_s < 600 for r in trace.requests)
    pin, pout = client.lengths[0]
    assert {r.input_len for r in trace.requests} <= set(pin.values.tolist())
    assert {r.output_len for r in trace.requests} <= set(pout.values.tolist())
    mean_in = float(np.mean([r.input_len for r in trace.requests]))
    want = float(np.sum(pin.values * np.diff(pin.cdf, prepend=0.0)))
    assert abs(mean_in - want) < 0.05 * want


def test_servegen_starts_at_its_first_active_window_and_notes_what_it_drew() -> None:
    trace = open_trace(TraceOptions("servegen-sample", max_requests=50))
    assert len(trace) == 50 and trace.format == "servegen"
    assert trace.notes[0].startswith("drew 50 requests from ServeGen chunk-3 (seed 0), from 6600 s")


def test_the_servegen_mix_draws_its_long_and_short_clients_together() -> None:
    trace = open_trace(TraceOptions("servegen-mix", duration_s=600))
    by_client = {c: [r for r in trace.requests if r.origin.startswith(f"chunk-{c} ")] for c in ("3", "15", "30")}
    assert not by_client["3"] and len(by_client["15"]) > 200 and len(by_client["30"]) > 100   # 3 starts at 6,600 s
    assert len(trace) == len(by_client["15"]) + len(by_client["30"])
    assert np.median([r.input_len for r in by_client["15"]]) > 8192 > np.median([r.input_len for r in by_client["30"]])
    assert [r.arrival_s for r in trace.requests] == sorted(r.arrival_s for r in trace.requests)
    later = open_trace(TraceOptions("servegen-mix", start_s=6600, duration_s=600))
    assert {r.origin.split(" ")[0] for r in later.requests} == {"chunk-3", "chunk-15", "chunk-30"}


def test_transformations_in_order_each_noted() -> None:
    trace = open_trace(TraceOptions("mooncake-sample", start_s=3.0, duration_s=9.0, max_requests=20,
                                    time_scale=0.5, max_input=1000, max_output=64))
    assert len(trace) == 20 and trace.requests[0].arrival_s == 0.0
    assert all(r.input_len <= 1000 and r.output_len <= 64 for r in trace.requests)
    assert [n.split(" ")[0] for n in trace.notes] == ["read", "window", "arrival", "input", "output"]
    assert trace.notes[1] == ("window from 3 s to 12 s, the first 20: 20 of 400 requests kept, times rebased to start "
                              "at 0")


def test_transform_functions() -> None:
    trace = read_mooncake(sample_path("mooncake-sample"))
    window = take_window(trace, start_s=3.0, duration_s=3.0)
    assert all(0 <= r.arrival_s < 3.0 for r in window.requests) and len(window) > 0
    assert scale_time(window, 2.0).span_s == pytest.approx(2 * window.span_s)
    clipped = clip_lengths(window, max_input=100)
    assert max(r.input_len for r in clipped.requests) == 100
    assert clipped.notes[-1].startswith("input lengths clipped to 100 tokens: ")
    with pytest.raises(ValueError, match=r"time scale must be > 0, got 0"):
        scale_time(trace, 0)


def test_an_empty_window_and_an_unknown_trace_are_refused() -> None:
    with pytest.raises(TraceError, match="no requests left after"):
        open_trace(TraceOptions("mooncake-sample", start_s=1e6))
    with pytest.raises(TraceError, match=r"^--trace nowhere.jsonl: no such file or directory"):
        open_trace(TraceOptions("nowhere.jsonl"))


def test_the_shipped_samples_are_small_and_say_where_they_come_from() -> None:
    root = sample_path("mooncake-sample").parents[1]
    files = [p for p in root.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 800_000
    readme = (root / "README.md").read_text()
    for name in SAMPLES:
        assert sample_path(name).exists()
    for needle in ("Apache", "3b5a594133958449a1feaf1c9e0fc1b553e34a28", "f891d1189eb32b3868dfc443800c4150548c282a",
                   "conversation_trace_head400.jsonl", "chunk-3-dataset.json"):
        assert needle in readme
