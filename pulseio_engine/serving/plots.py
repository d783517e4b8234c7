"""Plots of replay reports (matplotlib, headless): one run's four panels, or several runs side by side."""

from __future__ import annotations

from pathlib import Path

from .metrics import BUCKETS
from .report import labels, table

_BUCKETS = [name for name, _, _ in BUCKETS]


def _pyplot():  # noqa: ANN202
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(report: dict, path: Path) -> None:
    """Throughput, batch sizes and the host's resident memory over time; TPOT p50/p99 per input-length bucket,
    m, and what the run completed (the loss check)."""
    plt = _pyplot()
    fig, ax = plt.subplots(2, 3, figsize=(17, 8))
    tl = report["timeline"]
    ax[0, 0].plot(tl["t_s"], tl["throughput_tok_s"])
    ax[0, 0].set(title="decode throughput", xlabel="time (s)", ylabel="tokens/s")
    ax[0, 1].plot(tl["t_s"], tl["normal_batch"], label="normal")
    ax[0, 1].plot(tl["t_s"], tl["offload_batch"], label="offload")
    ax[0, 1].set(title="batch size", xlabel="time (s)", ylabel="requests")
    ax[0, 1].legend()
    ax[0, 2].plot(tl["rss_t_s"], [b / 2**30 for b in tl["rss_bytes"]])
    ax[0, 2].set(title="host resident memory (pinned pools included)", xlabel="time (s)", ylabel="GiB")
    _tpot_bars(ax[1, 0], [report])
    _m_bars(ax[1, 1], report["m"])
    ax[1, 2].set_axis_off()
    lines = [line for line in table([report]).splitlines()[1:]
             if line.startswith(("completed", "output tokens", "recalls submitted", "host RSS", "decode tok/s"))]
    ax[1, 2].text(0.0, 0.5, "\n".join(lines), family="monospace", va="center", fontsize=10)
    fig.suptitle(f"{report['model']} {report['mode']}, {report['trace']['requests']} requests, "
                 f"GPU KV cap {report['config']['gpu_kv_gib']:g} GiB")
    _save(fig, path)


def _m_bars(ax, m: dict | None) -> None:  # noqa: ANN001
    if m is None or not m["recalls"]:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no IRQ in this mode", ha="center", va="center")
        return
    keys = sorted(m["histogram"], key=int)
    ax.bar([int(k) for k in keys], [m["histogram"][k] for k in keys])
    ax.set_xticks([int(k) for k in keys])                           # m is a count: integer ticks only
    ax.set(title=f"m: normal layers per offload recall\n(mean {m['mean']:.2f}, {m['device_waits']:,} device waits)",
           xlabel="m", ylabel="recalls")


def plot_compare(reports: list[dict], path: Path) -> None:
    """Throughput over time of every run, and their TPOT p50/p99 per bucket."""
    plt = _pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(13, 4.5))
    for r, name in zip(reports, labels(reports)):
        ax[0].plot(r["timeline"]["t_s"], r["timeline"]["throughput_tok_s"], label=name)
    ax[0].set(title="decode throughput", xlabel="time (s)", ylabel="tokens/s")
    ax[0].legend()
    _tpot_bars(ax[1], reports)
    _save(fig, path)


def _tpot_bars(ax, reports: list[dict]) -> None:  # noqa: ANN001
    width = 0.8 / max(1, len(reports))
    for i, (r, name) in enumerate(zip(reports, labels(reports))):
        xs = [b + i * width for b in range(len(_BUCKETS))]
        p50 = [r["tpot_ms"][b]["p50_ms"] or 0.0 for b in _BUCKETS]
        p99 = [r["tpot_ms"][b]["p99_ms"] or 0.0 for b in _BUCKETS]
        ax.bar(xs, p99, width, alpha=0.35, color=f"C{i}")
        ax.bar(xs, p50, width, color=f"C{i}", label=name)
    ax.set_xticks([b + 0.4 - width / 2 for b in range(len(_BUCKETS))], _BUCKETS)
    ax.set(title="TPOT per input length (solid p50, light p99)", ylabel="ms")
    ax.legend()


def _save(fig, path: Path) -> None:  # noqa: ANN001
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
