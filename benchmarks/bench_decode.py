"""Vanilla decode against the HBM roofline, one subprocess per configuration (each gets the whole GPU).

    python benchmarks/bench_decode.py --out benchmarks/results/decode_h200      # the acceptance runs
    python benchmarks/bench_decode.py --model tiny --configs 4x256 --device cpu  # a CPU smoke run

Each run writes `decode_<model>_b<B>_ctx<L>[_<tag>].json` (see `pulseio_engine.bench.BenchResult`) and
its log; the summary table goes to stdout and `summary.md`. Acceptance (issue 4): qwen3-14b at
64 x 4K and 16 x 32K within 1.25x of the roofline.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ACCEPTANCE = "64x4096,16x32768"
LIMIT = 1.25


def _run(args: argparse.Namespace, batch: int, ctx: int, tag: str, extra: list[str], timeout: float) -> dict:
    name = f"decode_{args.model}_b{batch}_ctx{ctx}{'_' + tag if tag else ''}"
    path = args.out / f"{name}.json"
    cmd = [sys.executable, "-m", "pulseio_engine.cli", "bench", "--model", args.model, "--mode", "vanilla",
           "--batch-size", str(batch), "--context-len", str(ctx), "--steps", str(args.steps), "--no-progress",
           "--json", str(path), *extra] + (["--device", args.device] if args.device else [])
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        log, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        log, rc = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMED OUT after {timeout:.0f}s", 124
    (args.out / f"{name}.log").write_text(f"$ {' '.join(cmd)}\n{log}")
    row = {"name": name, "rc": rc, "seconds": round(time.monotonic() - start, 1)}
    if rc == 0 and path.exists():
        row |= json.loads(path.read_text())
    else:
        row["error"] = log.strip().splitlines()[-1] if log.strip() else f"exit {rc}"
    return row


def _table(rows: list[dict]) -> str:
    lines = ["| run | B | ctx | step ms | tok/s | GB/step | copy GB/s | roofline ms | ratio | graphs | compiled |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "roofline_ratio" not in r:
            lines.append(f"| {r['name']} | | | FAILED rc={r['rc']}: {r.get('error', '')[:120]} |||||||||")
            continue
        verdict = "ok" if r["roofline_ratio"] <= LIMIT else f"> {LIMIT}"
        lines.append(f"| {r['name']} | {r['batch_size']} | {r['context_len']} | {r['step_ms']:.2f} | "
                     f"{r['tokens_per_s']:,.0f} | {r['bytes_per_step'] / 1e9:.2f} | {r['copy_bandwidth_gbps']:,.0f} | "
                     f"{r['roofline_ms']:.2f} | **{r['roofline_ratio']:.3f}** ({verdict}) | {r['cuda_graphs']} | "
                     f"{r['compiled']} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3-14b")
    p.add_argument("--configs", default=ACCEPTANCE, help="comma-separated BxCTX, e.g. 64x4096,16x32768")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--device", default=None)
    p.add_argument("--eager-too", action="store_true", help="also run the first config without graphs/compile")
    p.add_argument("--timeout-s", type=float, default=170, help="per run")
    p.add_argument("--budget-s", type=float, default=1e9, help="start no run after this many seconds")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/decode"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [(int(b), int(c), "", []) for b, c in (x.split("x") for x in args.configs.split(","))]
    if args.eager_too:
        runs.append((runs[0][0], runs[0][1], "eager", ["--no-cuda-graphs", "--no-compile"]))
    start, rows = time.monotonic(), []
    for batch, ctx, tag, extra in runs:
        left = args.budget_s - (time.monotonic() - start)
        if left < 20:
            rows.append({"name": f"b{batch}_ctx{ctx}_{tag}", "rc": "skipped", "error": "out of time budget"})
            continue
        rows.append(_run(args, batch, ctx, tag, extra, min(args.timeout_s, left)))
        print(f"{rows[-1]['name']}: rc={rows[-1]['rc']} in {rows[-1].get('seconds')}s", flush=True)
    table = _table(rows)
    (args.out / "summary.md").write_text(table + "\n")
    print("SUMMARY (ratio = step time / (bytes read per step / measured copy bandwidth))")
    print(table)
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
