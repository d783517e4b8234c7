"""Where the main thread's arming time goes: `pulseio-engine bench` with TimedRecaller.arm wrapped to record each
call's wall time and the main thread's CPU time (time.thread_time_ns): wall >> CPU is waiting (a lock, the GIL),
wall ~ CPU is work. PROBE_PROFILE=1 also runs every arm under cProfile (slower: read its shares, not its times).
Usage: python .devrun/arm_probe.py OUT.json <bench args...>"""
import cProfile
import io
import json
import os
import pstats
import sys
import time

from pulseio_engine import sparse_bench
from pulseio_engine.cli import main

out_path, args = sys.argv[1], sys.argv[2:]
orig = sparse_bench.TimedRecaller.arm
walls: list[int] = []
cpus: list[int] = []
prof = cProfile.Profile() if os.environ.get("PROBE_PROFILE") == "1" else None


def arm(self, recalls):
    w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    if prof is not None:
        prof.enable()
    try:
        return orig(self, recalls)
    finally:
        if prof is not None:
            prof.disable()
        walls.append(time.perf_counter_ns() - w0)
        cpus.append(time.thread_time_ns() - c0)


sparse_bench.TimedRecaller.arm = arm
rc = main(["bench", *args])
walls_us = sorted(w / 1e3 for w in walls)
cpus_us = sorted(c / 1e3 for c in cpus)
pick = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None  # noqa: E731
summary = {"arms": len(walls), "wall_us_p50": pick(walls_us, 0.5), "wall_us_p90": pick(walls_us, 0.9),
           "wall_us_max": pick(walls_us, 1.0), "cpu_us_p50": pick(cpus_us, 0.5), "cpu_us_p90": pick(cpus_us, 0.9),
           "wall_us": [round(w / 1e3, 1) for w in walls], "cpu_us": [round(c / 1e3, 1) for c in cpus]}
if prof is not None:
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    summary["profile"] = text.getvalue()
json.dump(summary, open(out_path, "w"), indent=1)
print("arm probe:", {k: v for k, v in summary.items() if not isinstance(v, (list, str))})
sys.exit(rc)
