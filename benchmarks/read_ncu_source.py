"""Where one kernel's warps spend their time, from Nsight Compute's per-SASS source page.

Usage: python benchmarks/read_ncu_source.py KERNEL.sass.csv[.gz] [--top 12]

The input is `ncu -i REPORT --page source --csv --print-source sass` (what `run_jobs_gpu.sh ncu-select` writes).
Printed: the stall samples by reason; the code as runs of instructions executed equally often (straight-line
code runs once a warp, a loop's body as many times as it iterates), each with its instructions, executions a warp
and share of the samples; and the instructions holding the most samples. A run executed n times a warp with most
of the samples is the loop to shorten; runs executed once with many samples are prologue and epilogue.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io


def read_rows(path: str) -> tuple[list[str], list[list[str]]]:
    """The header and instruction rows of a source-page csv (its first line names the kernel)."""
    raw = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    with raw as f:
        rows = list(csv.reader(io.StringIO(f.read())))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[header], [r for r in rows[header + 1:] if len(r) == len(rows[header])]


def runs(executed: list[int], samples: list[int]) -> list[tuple[int, int, float, float]]:
    """Maximal runs of consecutive instructions executed equally often: (first, last, executions a warp, share of
    the samples). Executions a warp count against the first instruction's, which every warp runs once."""
    total, warps = sum(samples) or 1, executed[0] or 1
    out, start = [], 0
    for i in range(1, len(executed) + 1):
        if i == len(executed) or executed[i] != executed[start]:
            out.append((start, i - 1, executed[start] / warps, sum(samples[start:i]) / total))
            start = i
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu source page, per SASS instruction (.csv or .csv.gz)")
    parser.add_argument("--top", type=int, default=12, help="instructions with the most samples to list")
    args = parser.parse_args()
    header, rows = read_rows(args.csv)
    col = {name: i for i, name in enumerate(header)}
    samples = [int(r[col["Warp Stall Sampling (All Samples)"]] or 0) for r in rows]
    executed = [int(r[col["Instructions Executed"]] or 0) for r in rows]
    reasons = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]
    total = sum(samples) or 1
    warps = executed[0] or 1  # the first instruction runs once in every warp
    print(f"{len(rows)} instructions, {sum(samples)} samples, {sum(executed) / warps:.0f} executed a warp")
    by_reason = collections.Counter({n: sum(int(r[col[n]] or 0) for r in rows) for n in reasons})
    print("stalls: " + ", ".join(f"{n[6:]} {v / total:.0%}" for n, v in by_reason.most_common(8) if v))
    print("runs (first-last instruction, count, executions a warp, share of samples):")
    for first, last, times, share in runs(executed, samples):
        if times and (share >= 0.01 or last - first >= 49):
            print(f"  {first:5d}-{last:5d} {last - first + 1:5d} x{times:6.2f} {share:6.1%}")
    print(f"top {args.top} instructions by samples:")
    for i in sorted(range(len(rows)), key=lambda j: -samples[j])[: args.top]:
        top = max(reasons, key=lambda n: int(rows[i][col[n]] or 0))
        print(f"  {i:5d} {samples[i] / total:6.1%} {top[6:]:14s} {rows[i][col['Source']].strip()[:70]}")


if __name__ == "__main__":
    main()
