"""What `pulseio bench` shows: a table on the terminal, a JSON file, a plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .records import BenchRecord


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def format_table(meta: dict, records: Sequence[BenchRecord]) -> str:
    lines = [f"device: {meta['device']}   git: {meta['git_sha']}   date: {meta['date']}"]
    if meta.get("measures"):
        lines.append(f"measures: {meta['measures']}")
    peaks = meta.get("peak_gbps", {})
    lines.append("single-copy peak: " + ", ".join(f"{d.upper()} {g:.1f} GB/s" for d, g in peaks.items()))
    recall = [r for r in records if r.kind != "peak" and not r.under_load]
    strategies = list(dict.fromkeys(r.strategy for r in recall))
    counts = sorted({r.num_blocks for r in recall})
    for direction in ("h2d", "d2h"):
        for block_bytes in sorted({r.block_bytes for r in recall}):
            rows = [r for r in recall if r.direction == direction and r.block_bytes == block_bytes]
            if not rows:
                continue
            lines.append("")
            lines.append(f"{direction.upper()} {_size(block_bytes)} blocks: GB/s (fraction of peak)")
            lines.append(f"{'blocks':>8} " + " ".join(f"{s:>18}" for s in strategies))
            for count in counts:
                cells = []
                for s in strategies:
                    r = next((x for x in rows if x.num_blocks == count and x.strategy == s), None)
                    cells.append(f"{r.gbps:8.2f} ({r.fraction_of_peak:4.2f}){'' if r.verified else '!'}"
                                 if r else f"{'-':>18}")
                lines.append(f"{count:>8} " + " ".join(f"{c:>18}" for c in cells))
            chosen = [f"{r.num_blocks}: {r.chosen}" for r in sorted(rows, key=lambda r: r.num_blocks) if r.chosen]
            if chosen:  # auto runs on an engine of its own: its cell and its choice's differ by run noise
                lines.append(f"{'':>8} auto chose " + ", ".join(chosen))
    loaded = [r for r in records if r.under_load]
    for block_bytes in sorted({r.block_bytes for r in loaded}):
        rows = [r for r in loaded if r.block_bytes == block_bytes]
        lines.append("")
        lines.append(f"H2D {rows[0].num_blocks} x {_size(block_bytes)} while a bf16 GEMM runs on another stream:")
        for r in rows:
            noise = ""
            if r.gemm_ms_alone and len(r.gemm_ms_alone) > 1:  # how much the runs alone differ: the noise floor
                noise = f" (runs alone within {100 * (max(r.gemm_ms_alone) / min(r.gemm_ms_alone) - 1):.1f}%)"
            what = (f"{r.gbps:6.2f} GB/s ({r.fraction_of_peak:4.2f} of peak)" if r.strategy != "none"
                    else "no recall (control)")
            lines.append(f"  {r.strategy:>12}: {what}, GEMM slowed {100 * (r.gemm_slowdown or 0.0):+.1f}%{noise}")
    if any(r.verified is False for r in records):
        lines.append("")
        lines.append("! = data check FAILED: recalled bytes differ from what was written")
    return "\n".join(lines)


def write_json(path: Path, meta: dict, records: Sequence[BenchRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "records": [r.to_dict() for r in records]}, indent=1))


def write_plot(path: Path, meta: dict, records: Sequence[BenchRecord]) -> None:
    """Bandwidth against block count per strategy, one panel per (direction, block size), peak as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recall = [r for r in records if r.kind != "peak" and not r.under_load]
    panels = sorted({(r.direction, r.block_bytes) for r in recall}, key=lambda p: (p[0] != "h2d", p[1]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4), squeeze=False, sharey=True)
    markers = "osD^vP*X"
    for ax, (direction, block_bytes) in zip(axes[0], panels):
        rows = [r for r in recall if r.direction == direction and r.block_bytes == block_bytes]
        for i, strategy in enumerate(dict.fromkeys(r.strategy for r in rows)):
            pts = sorted((r.num_blocks, r.gbps) for r in rows if r.strategy == strategy)
            ax.plot(*zip(*pts), marker=markers[i % len(markers)], label=strategy,
                    linestyle="--" if strategy == "auto" else "-", alpha=0.85)
        peak = meta.get("peak_gbps", {}).get(direction)
        if peak:
            ax.axhline(peak, color="black", linewidth=1, linestyle=":", label=f"single-copy peak {peak:.1f}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")   # rates span decades (per_block against the rest)
        ax.set_title(f"{direction.upper()}, {_size(block_bytes)} blocks")
        ax.set_xlabel("blocks per transfer")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("GB/s")
    axes[0][0].legend(fontsize=7, loc="upper left")
    what = "PCIe" if "PCIe transfers" in meta.get("measures", "PCIe transfers") else "host memory copies (no GPU)"
    fig.suptitle(f"pulseio bench: {what}\n{meta['device']}, {meta['git_sha']}, {meta['date'][:10]}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
