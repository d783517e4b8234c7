"""A replay's report: its JSON layout (`SCHEMA`, checked by `check_report`) and the side-by-side table of
several runs (`replay-table`). No torch.

The schema names every key a report of some version read here must have and the type of its value; a report
lacks the keys added after its version (`_ADDED`) and those dropped by its version or an earlier one (`_DROPPED`).
A key of a nested dict is named by its path in errors ("summary.decode_throughput_tok_s"). A report keeps every
request's record, so any summary can be recomputed from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import EngineError
from ..kv.recall import FLIGHT_KINDS  # `recall_flights`' keys
from .host_time import PHASES
from .metrics import BUCKETS

_ADDED = {                       # schema version -> the keys it added; a report lacks every key added after its own
    2: ("summary.warmup_s",),
    3: ("host_ms_per_round",),
    4: ("config.gpu_ahead", "config.copier_ctas", "config.copier_idle_us", "summary.step_graphs_built",
        "pulseio.post_to_landed_us", "pulseio.publish_to_taken_us", "pulseio.publish_to_landed_us"),
    5: ("config.normal_steps", "summary.normal_steps_mean"),
    6: ("config.skinny_gemm", "config.overlap_rounds"),
    7: ("host_ms_per_round.pace",),
    8: ("roofline", "config.two_streams"),
    9: ("config.hot_cache",),
    10: ("pulseio.stamped_bytes", "pulseio.stamped_publish_to_landed_s"),
    11: ("config.halves", "summary.halves_rounds"),
    12: ("config.ride", "summary.ridden_rounds"),
    13: ("config.ahead", "summary.ahead_bytes"),
    14: ("config.gil_switch_us",),
    15: ("config.ahead_budget",),
    16: ("pulseio.copy_per_mib_us",),
    17: ("summary.handoffs_landed", "summary.handoffs_waited"),
    18: ("config.freeze_heap", "gc", "longest_gaps"),
    19: ("config.pdl", "config.inductor_pdl"),
    21: ("config.early_select",),
    23: ("pulseio.publish_to_early_landed_us",),
    24: ("pulseio.stamped_requests", "pulseio.landed_early", "recall_flights"),
}
_DROPPED = {                     # schema version -> the keys it dropped; a report lacks every key dropped by then
    20: ("config.pdl", "config.inductor_pdl"),    # programmatic dependent launch, taken out: no faster on an H100
    22: ("config.early_select",),                 # selection beside the projection, taken out: no faster on an H100
}
_LATEST = max(*_ADDED, *_DROPPED)
SCHEMA_VERSION = f"pulseio-replay/{_LATEST}"
_LACKS = {f"pulseio-replay/{v}": (*(path for since, paths in _ADDED.items() if since > v for path in paths),
                                  *(path for since, paths in _DROPPED.items() if since <= v for path in paths))
          for v in range(_LATEST, 0, -1)}            # newest first: the keys of SCHEMA a report of each one lacks
READ_VERSIONS = tuple(_LACKS)

NUM = (int, float)
OPT_NUM = (int, float, type(None))
_TPOT = {"requests": int, "p50_ms": OPT_NUM, "p99_ms": OPT_NUM, "mean_ms": OPT_NUM}
SCHEMA: dict[str, Any] = {
    "schema": str, "mode": str, "irq": bool, "model": str, "device": str, "dtype": str,
    "trace": {"source": str, "format": str, "notes": list, "requests": int, "span_s": NUM},
    "config": {"gpu_kv_gib": NUM, "host_kv_gib": NUM, "offload_threshold": (int, type(None)), "token_budget": int,
               "selection": (str, type(None)), "clock": str, "seed": int, "max_batch": int,
               "steering": (str, type(None)), "kv": str, "gpu_ahead": int, "normal_steps": int,
               "copier_ctas": (int, type(None)), "copier_idle_us": (int, type(None)), "skinny_gemm": bool,
               "overlap_rounds": bool, "two_streams": bool, "hot_cache": NUM, "halves": bool,
               "ride": bool, "ahead": bool, "gil_switch_us": OPT_NUM, "ahead_budget": NUM, "freeze_heap": bool,
               "pdl": bool, "inductor_pdl": bool,           # pdl, inductor_pdl: schema 19 alone (see _DROPPED)
               "early_select": bool},                        # schema 21 alone
    "summary": {"requests": int, "completed": int, "complete": bool, "output_tokens": int, "expected_tokens": int,
                "duration_s": NUM, "decode_throughput_tok_s": NUM, "gpu_busy_fraction": OPT_NUM,
                "recalls": int, "recalled_bytes": int, "rounds": int, "warming_rounds": int, "wall_s": NUM,
                "warmup_s": NUM, "step_graphs_built": int, "normal_steps_mean": OPT_NUM, "halves_rounds": int,
                "ridden_rounds": int, "ahead_bytes": int, "handoffs_landed": int, "handoffs_waited": int},
    "tpot_ms": {**{name: _TPOT for name, _, _ in BUCKETS}, "all": _TPOT},
    "host_ms_per_round": {phase: NUM for phase in PHASES},
    "m": (dict, type(None)),
    "moves": {"to_offload": int, "to_normal": int, "bytes_to_host": int, "bytes_from_host": int},
    "pulseio": (dict, type(None)),
    "recall_flights": (dict, type(None)),
    "memory": {"gpu_kv_cap_bytes": int, "normal_blocks": int, "offload_blocks": int, "max_offload": int,
               "host_units": int, "gpu_pools_bytes": int, "host_pool_bytes": int},
    "timeline": {"t_s": list, "throughput_tok_s": list, "normal_batch": list, "offload_batch": list,
                 "rss_t_s": list, "rss_bytes": list},
    "roofline": {"weights_bytes": int, "kv_bytes": int, "batch_steps": int, "recalled_bytes": int,
                 "copy_gbps": OPT_NUM, "link_gbps": OPT_NUM, "hbm_s": OPT_NUM, "link_s": OPT_NUM, "bound_s": OPT_NUM,
                 "rounds_s": NUM, "ratio": OPT_NUM, "bound_tok_s": OPT_NUM},
    "batches": {"normal": dict, "offload": dict},
    "requests": list,
    "gc": {"collections": list, "paused_s": NUM, "longest_ms": NUM},
    "longest_gaps": list,
}
REQUEST_KEYS = {"id": int, "arrival_s": NUM, "input_len": int, "output_len": int, "origin": str,
                "class": (str, type(None)), "admitted_s": OPT_NUM, "first_token_s": OPT_NUM,
                "finished_s": OPT_NUM, "tokens": int, "moves": int, "tpot_ms": OPT_NUM}
GAP_KEYS = {"t_s": NUM, "gap_ms": NUM, "round_ms": NUM, "gc_ms": NUM, "admitted": int, "finished": int}
M_KEYS = {"recalls": int, "histogram": dict, "mean": OPT_NUM, "p50": OPT_NUM, "p99": OPT_NUM, "seen_landed": int,
          "device_waits": int}
_LATENCY = {"count": int, "p50": OPT_NUM, "p99": OPT_NUM}
PULSEIO_KEYS = {"submitted": int, "completed": int, "failed": int, "device_waits_expired": int,
                "post_to_landed_us": _LATENCY, "publish_to_taken_us": _LATENCY, "publish_to_landed_us": _LATENCY,
                "publish_to_early_landed_us": _LATENCY,
                "copy_per_mib_us": _LATENCY, "stamped_bytes": int, "stamped_publish_to_landed_s": NUM,
                "stamped_requests": int, "landed_early": int}
FLIGHT_KEYS = {"stamped": int, "bytes": int, "landed_early": int, "publish_to_early_landed_us": _LATENCY,
               "publish_to_landed_us": _LATENCY}


class ReportError(EngineError, ValueError):
    """A replay report that does not follow the schema: the message names the key and what it holds."""


def check_report(report: dict, *, source: str = "report") -> dict:
    """Raise ReportError naming the first key missing or of the wrong type; returns the report."""
    if not isinstance(report, dict) or "schema" not in report:
        _check(report, SCHEMA, source, "")                     # names what is wrong
    version = report["schema"]
    if version not in READ_VERSIONS:
        raise ReportError(f"{source}: schema is {version!r}, this engine reads "
                          + ", ".join(map(repr, READ_VERSIONS)))
    spec, pulse_spec = SCHEMA, PULSEIO_KEYS
    for path in _LACKS[version]:
        if path.startswith("pulseio."):
            pulse_spec = _without(pulse_spec, path.removeprefix("pulseio."))
        else:
            spec = _without(spec, path)
    _check(report, spec, source, "")
    for i, record in enumerate(report["requests"]):
        _check(record, REQUEST_KEYS, source, f"requests[{i}].")
    for i, gap in enumerate(report.get("longest_gaps", ())):
        _check(gap, GAP_KEYS, source, f"longest_gaps[{i}].")
    if report["m"] is not None:
        _check(report["m"], M_KEYS, source, "m.")
    if report["pulseio"] is not None:
        _check(report["pulseio"], pulse_spec, source, "pulseio.")
    if report.get("recall_flights") is not None:
        _check(report["recall_flights"], {kind: FLIGHT_KEYS for kind in FLIGHT_KINDS}, source, "recall_flights.")
    return report


def _without(spec: dict, path: str) -> dict:
    """`spec` less the key at `path` ("summary.warmup_s"), copied where it changes."""
    head, _, rest = path.partition(".")
    if not rest:
        return {k: v for k, v in spec.items() if k != head}
    if head not in spec:                          # its parent is gone already: newer than the report too
        return spec
    return {**spec, head: _without(spec[head], rest)}


def _check(value: Any, spec: dict, source: str, prefix: str) -> None:
    if not isinstance(value, dict):
        what = prefix.rstrip(".") or "the report"
        raise ReportError(f"{source}: {what} must be an object, got {type(value).__name__}")
    for key, want in spec.items():
        path = prefix + key
        if key not in value:
            raise ReportError(f"{source}: {path} is missing")
        if isinstance(want, dict):
            _check(value[key], want, source, path + ".")
            continue
        types = want if isinstance(want, tuple) else (want,)
        if not isinstance(value[key], types) or (isinstance(value[key], bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise ReportError(f"{source}: {path} must be {names}, got {value[key]!r:.60}")


def load_report(path: Path) -> dict:
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: not a replay report ({exc})") from None
    return check_report(report, source=str(path))


# The config keys that tell runs of one mode apart, as `labels` says them.
_KNOBS = (("gpu_kv_gib", "cap"), ("host_kv_gib", "host"), ("offload_threshold", "thr"), ("token_budget", "budget"),
          ("gpu_ahead", "ahead"), ("normal_steps", "steps"), ("copier_ctas", "ctas"), ("copier_idle_us", "idle_us"),
          ("skinny_gemm", "skinny"), ("overlap_rounds", "overlap"), ("two_streams", "streams2"), ("hot_cache", "hot"),
          ("halves", "halves"), ("ride", "ride"), ("gil_switch_us", "gil_us"), ("freeze_heap", "freeze"))


def labels(reports: list[dict]) -> list[str]:
    """Each run's mode, followed by the settings in which it differs from other runs of its mode
    ('pulseinfer thr=4096 ahead=4'), so no two columns of a table read the same unless their runs do."""
    out = []
    for report in reports:
        same = [r for r in reports if r["mode"] == report["mode"]]
        knobs = [f"{short}={report['config'].get(key, '-')}" for key, short in _KNOBS     # '-': an older schema
                 if len({repr(r["config"].get(key, "-")) for r in same}) > 1]
        out.append(" ".join([report["mode"], *knobs]))
    return out


def table(reports: list[dict]) -> str:
    """The runs side by side, one column each (in the order given), as aligned text."""
    vanilla = next((r for r in reports if r["mode"] == "vanilla"), None)
    rows: list[tuple[str, list[str]]] = [("", labels(reports))]

    def row(name: str, cell: Any) -> None:
        rows.append((name, [cell(r) for r in reports]))

    row("model / trace", lambda r: f"{r['model']} / {r['trace']['requests']} req")
    row("GPU KV cap (GiB)", lambda r: f"{r['config']['gpu_kv_gib']:g}")
    row("completed", lambda r: f"{r['summary']['completed']}/{r['summary']['requests']}")
    row("output tokens (expected)",
        lambda r: f"{r['summary']['output_tokens']:,} ({r['summary']['expected_tokens']:,})")
    row("recalls submitted/completed/failed", _recall_counts)
    row("host RSS GiB first/peak/last", _rss)
    row("warm-up before the clock (s)", lambda r: f"{r['summary']['warmup_s']:.1f}" if "warmup_s" in r["summary"]
        else "-")
    row("decode tok/s", lambda r: f"{r['summary']['decode_throughput_tok_s']:,.1f}")
    if vanilla is not None:
        base = vanilla["summary"]["decode_throughput_tok_s"]
        row("  x vanilla", lambda r: f"{r['summary']['decode_throughput_tok_s'] / base:.2f}" if base else "-")
    for name, _, _ in (*BUCKETS, ("all", 0, None)):
        row(f"TPOT p50/p99 {name} (ms)", lambda r, n=name: _pair(r["tpot_ms"][n]))
    row("roofline tok/s (rounds / bound)", _roofline)
    row("GPU busy", lambda r: "-" if r["summary"]["gpu_busy_fraction"] is None
        else f"{r['summary']['gpu_busy_fraction']:.1%}")
    row("host ms/round launch/pace/rest/tokens", _host)
    row("recall publish->landed p50/p99 (us)", lambda r: _pulseio_latency(r, "publish_to_landed_us", 0))
    row("recall publish->landed early p50/p99 (us)", lambda r: _pulseio_latency(r, "publish_to_early_landed_us", 0))
    row("recalls landed early / stamped", _landed_early)
    for kind in FLIGHT_KINDS:
        row(f"{kind} recalls sampled: landed early, mean KiB", lambda r, k=kind: _flights(r, k))
        row(f"{kind} recall publish->landed early p50/p99 (us)",
            lambda r, k=kind: _flight_latency(r, k, "publish_to_early_landed_us"))
        row(f"{kind} recall publish->landed p50/p99 (us)",
            lambda r, k=kind: _flight_latency(r, k, "publish_to_landed_us"))
    row("recall publish->landed GB/s (of link)", _recall_rate)
    row("recall copy us/MiB p50/p99", lambda r: _pulseio_latency(r, "copy_per_mib_us", 1))
    row("step graphs built", lambda r: str(r["summary"].get("step_graphs_built", "-")))
    row("rounds as halves", lambda r: str(r["summary"].get("halves_rounds", "-")))
    row("rounds ridden", lambda r: str(r["summary"].get("ridden_rounds", "-")))
    row("normal steps a round (mean)", lambda r: "-" if r["summary"].get("normal_steps_mean") is None
        else f"{r['summary']['normal_steps_mean']:.2f}")
    row("recalled GiB", lambda r: f"{r['summary']['recalled_bytes'] / 2**30:.3f}")
    row("of them recalled ahead GiB", lambda r: f"{r['summary']['ahead_bytes'] / 2**30:.3f}"
        if "ahead_bytes" in r["summary"] else "-")
    row("moves to offload/normal", lambda r: f"{r['moves']['to_offload']}/{r['moves']['to_normal']}")
    row("GC collections gen 0/1/2", lambda r: "-" if "gc" not in r else "/".join(map(str, r["gc"]["collections"])))
    row("GC paused ms (longest)", lambda r: "-" if "gc" not in r
        else f"{r['gc']['paused_s'] * 1e3:,.0f} ({r['gc']['longest_ms']:.1f})")
    row("longest gap ms (round, GC) at s", _longest_gap)
    row("m mean (device waits)", lambda r: "-" if r["m"] is None or r["m"]["mean"] is None
        else f"{r['m']['mean']:.2f} ({r['m']['device_waits']}/{r['m']['recalls']})")
    width = max(len(name) for name, _ in rows)
    cols = [max(len(cells[i]) for _, cells in rows) for i in range(len(reports))]
    return "\n".join(name.ljust(width) + "  " + "  ".join(c.rjust(w) for c, w in zip(cells, cols))
                     for name, cells in rows)


def _host(report: dict) -> str:
    """The main thread's ms a round enqueuing the pieces, napping in IRQ's pacer ('-' before schema 7: counted in
    the launch), in its other phases, and waiting for the tokens (`host_time.py`); '-' before schema 3."""
    phases = report.get("host_ms_per_round")
    if phases is None:
        return "-"
    rest = sum(v for k, v in phases.items() if k not in ("launch", "pace", "tokens"))
    pace = f"{phases['pace']:.2f}" if "pace" in phases else "-"
    return f"{phases['launch']:.2f}/{pace}/{rest:.2f}/{phases['tokens']:.2f}"


def _longest_gap(report: dict) -> str:
    """The longest stretch between two rounds' ends, the round's own run and the collections' pauses inside it, and
    where the replay was ('-' before schema 18 or with fewer than two rounds)."""
    gaps = report.get("longest_gaps")
    if not gaps:
        return "-"
    g = gaps[0]
    return f"{g['gap_ms']:,.1f} ({g['round_ms']:,.1f}, {g['gc_ms']:,.1f}) at {g['t_s']:.1f}"


def _roofline(report: dict) -> str:
    """The decode rounds' bound as a throughput, their time over it, and ', link' where the recalls bound it
    rather than the device's memory ('-' on a CPU or before schema 8)."""
    roof = report.get("roofline")
    if roof is None or roof["bound_tok_s"] is None:
        return "-"
    link = ", link" if roof["link_s"] is not None and roof["link_s"] > roof["hbm_s"] else ""
    return f"{roof['bound_tok_s']:,.1f} ({roof['ratio']:.2f}x{link})"


def _recall_counts(report: dict) -> str:
    """pulseio's recalls over the run: submitted/completed/failed, and the device waits that expired if any."""
    p = report["pulseio"]
    if p is None:
        return "-"
    expired = f" ({p['device_waits_expired']} expired)" if p["device_waits_expired"] else ""
    return f"{p['submitted']:,}/{p['completed']:,}/{p['failed']:,}{expired}"


def _rss(report: dict) -> str:
    """The replay's resident host memory (pinned pools included) at its first sample, its peak and its last."""
    rss = report["timeline"]["rss_bytes"]
    return "-" if not rss else f"{rss[0] / 2**30:.2f}/{max(rss) / 2**30:.2f}/{rss[-1] / 2**30:.2f}"


def _pulseio_latency(report: dict, key: str, digits: int) -> str:
    """One of pulseio's latencies as p50/p99 us (publish -> landed; the copier's began -> landed per MiB, whose p99
    far above its p50 is the copy slowing down, not larger requests); '-' without recalls or in a report from
    before the key (schema 4, 16, 23)."""
    lat = (report["pulseio"] or {}).get(key)
    return "-" if lat is None or lat["p50"] is None else f"{lat['p50']:,.{digits}f}/{lat['p99']:,.{digits}f}"


def _landed_early(report: dict) -> str:
    """Of the recalls with the copier's stamps (RESIDENT), how many every copy CTA copied from the ids mirror before
    their task came, over the whole replay; '-' without recalls or before schema 24."""
    pulse = report["pulseio"] or {}
    stamped = pulse.get("stamped_requests")
    if not stamped:
        return "-"
    return f"{pulse['landed_early']:,} / {stamped:,} ({pulse['landed_early'] / stamped:.0%})"


def _flights(report: dict, kind: str) -> str:
    """Of the sampled recalls of one kind (`recall_flights`), how many landed early, and their mean size; '-' without
    any or before schema 24."""
    f = (report.get("recall_flights") or {}).get(kind)
    if not f or not f["stamped"]:
        return "-"
    return f"{f['landed_early']:,} / {f['stamped']:,} ({f['landed_early'] / f['stamped']:.0%}), " \
           f"{f['bytes'] / f['stamped'] / 1024:,.0f}"


def _flight_latency(report: dict, kind: str, key: str) -> str:
    """One latency of the sampled recalls of one kind as p50/p99 us; '-' without samples or before schema 24."""
    lat = ((report.get("recall_flights") or {}).get(kind) or {}).get(key)
    return "-" if lat is None or lat["p50"] is None else f"{lat['p50']:,.0f}/{lat['p99']:,.0f}"


def _recall_rate(report: dict) -> str:
    """Every stamped recall's bytes over its publish -> landed, summed over the replay (device clock), and that
    over the link's rate the roofline measured; '-' without stamped recalls or before schema 10."""
    pulse = report["pulseio"] or {}
    seconds = pulse.get("stamped_publish_to_landed_s")
    if not seconds:
        return "-"
    gbps = pulse["stamped_bytes"] / seconds / 1e9
    link = (report.get("roofline") or {}).get("link_gbps")
    return f"{gbps:.3g}" + (f" ({gbps / link:.2f})" if link else "")


def _pair(spread: dict) -> str:
    if not spread["requests"]:
        return "-"
    return f"{spread['p50_ms']:.2f}/{spread['p99_ms']:.2f}"
