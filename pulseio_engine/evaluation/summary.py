"""Eval records of several `eval-table` folders as one grid: the table, each sparse mode's gap to full
attention (the accuracy target), and a plot of score against budget.

A grid is often run in pieces (a device session's worth at a time, a cell run again on a newer tree).
`combine` takes the folders in order, and a cell found in more than one keeps the last folder's record
and says so (`Grid.replaced`); two records of one cell in one folder have no order, and are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .run import EvalMode, mode_label
from .table import mode_labels, record_files
from .tasks import Task

Record = dict[str, Any]


def cell_key(record: Record) -> tuple[str, int, str, str, int | None]:
    """(model, context, task, mode label, budget); full attention has no budget. The label names a
    non-default group rule (`mode_label`), so one grid can hold a mode under both rules."""
    budget = None if record["mode"] == EvalMode.VANILLA.value else record["token_budget"]
    return record["model"], record["context_len"], record["task"], mode_label(record), budget


class DuplicateRecordError(ValueError):
    """One folder holds two records of one cell: which is meant cannot be told."""


@dataclass(frozen=True)
class Replaced:
    """A cell found in several folders: the record used (the last folder's) and one it replaced."""

    cell: str
    used: str
    dropped: str


@dataclass(frozen=True)
class Grid:
    records: list[Record]           # one per cell; each has "folder" (and "file") added
    replaced: list[Replaced]


def cell_name(key: tuple[str, int, str, str, int | None]) -> str:
    model, context, task, mode, budget = key
    return f"{model} {task} context {context} {mode}" + ("" if budget is None else f" budget {budget}")


def combine(folders: Sequence[Path]) -> Grid:
    """Every record of `folders`; a cell in several keeps the record of the last folder that has it.
    Raises DuplicateRecordError, naming both files, for two records of one cell in one folder."""
    cells: dict[tuple[str, int, str, str, int | None], Record] = {}
    replaced = []
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} is not a folder of eval records")
        mine: dict[tuple[str, int, str, str, int | None], Path] = {}
        for path, record in record_files(folder):
            key = cell_key(record)
            if key in mine:
                raise DuplicateRecordError(
                    f"{folder} holds two records of one cell ({cell_name(key)}): {mine[key].name} and {path.name}; "
                    "keep one there (a rerun goes in a folder of its own, listed after the older one)")
            mine[key] = path
            record["folder"], record["file"] = str(folder), str(path)
            if key in cells:
                replaced.append(Replaced(cell_name(key), str(path), cells[key]["file"]))
            cells[key] = record
    return Grid(list(cells.values()), replaced)


@dataclass(frozen=True)
class Gap:
    """A sparse mode's mean distance to full attention on one model, in points (score x 100)."""

    model: str
    mode: str
    points: float | None       # mean of (mode - full) over `cells`; None if no cell counts
    cells: int                 # (context, budget, task) cells where full scores >= the floor and the mode ran
    missing: tuple[str, ...]   # such cells the mode has no record of: "context/budget/task"


def gaps(records: Sequence[Record], floor: float = 0.5) -> list[Gap]:
    """Per model and sparse mode, over every scored task (not perplexity) and budget below the context
    where full attention scores at least `floor`: the mean score difference to full attention."""
    full = {(r["model"], r["context_len"], r["task"]): r["score"] for r in records
            if r["mode"] == EvalMode.VANILLA.value and r["task"] != Task.PERPLEXITY.value}
    sparse = {cell_key(r): r["score"] for r in records if r["mode"] != EvalMode.VANILLA.value}
    budgets = sorted({key[4] for key in sparse if key[4] is not None})
    out = []
    for model, mode in sorted({(key[0], key[3]) for key in sparse}):
        diffs, missing = [], []
        for (m, n, task), score in sorted(full.items()):
            if m != model or score < floor:
                continue
            for budget in (b for b in budgets if b < n):
                got = sparse.get((model, n, task, mode, budget))
                if got is None:
                    missing.append(f"{n}/{budget}/{task}")
                else:
                    diffs.append(got - score)
        points = 100 * sum(diffs) / len(diffs) if diffs else None
        out.append(Gap(model, mode, points, len(diffs), tuple(missing)))
    return out


def gaps_markdown(found: Sequence[Gap], floor: float) -> str:
    lines = [f"| model | mode | points to full (cells where full >= {floor}) | cells | missing |",
             "|---|---|---:|---:|---|"]
    for g in found:
        points = "-" if g.points is None else f"{g.points:+.1f}"
        lines.append(f"| {g.model} | {g.mode} | {points} | {g.cells} | {', '.join(g.missing) or 'none'} |")
    return "\n".join(lines) + "\n"


def write_plot(path: Path, records: Sequence[Record]) -> None:
    """Score (perplexity: lower is better) against budget, one line per sparse mode and full attention
    as a dashed black line; one row of panels per (model, context), one column per task. A mode keeps its
    colour and marker in every panel; under a non-default group rule (`mode_label`) its line is dotted.
    Scores share the 0..1 axis, so a gap looks as large as it is. One legend for the figure, above it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted({(r["model"], r["context_len"]) for r in records})
    order = [t.value for t in Task]
    tasks = sorted({r["task"] for r in records}, key=lambda t: order.index(t) if t in order else len(order))
    modes = {label: mode for label, mode in mode_labels(list(records)).items() if mode != EvalMode.VANILLA.value}
    labels = list(modes)
    base = [m.value for m in EvalMode if m is not EvalMode.VANILLA]
    style = {label: dict(color=f"C{base.index(mode)}", marker="osD^"[base.index(mode) % 4],
                         linestyle="-" if label == mode else ":") for label, mode in modes.items()}
    budgets = sorted({r["token_budget"] for r in records if mode_label(r) in labels})
    fig, axes = plt.subplots(len(rows), len(tasks), figsize=(3.2 * len(tasks), 2.6 * len(rows) + 0.6), squeeze=False)
    handles: dict[str, Any] = {}
    for (model, n), panels in zip(rows, axes):
        for task, ax in zip(tasks, panels):
            mine = [r for r in records if (r["model"], r["context_len"], r["task"]) == (model, n, task)]
            for label in labels:
                pts = sorted((r["token_budget"], r["score"]) for r in mine if mode_label(r) == label)
                if pts:
                    handles[label] = ax.plot(*zip(*pts), label=label, alpha=0.85, **style[label])[0]
            for r in mine:
                if r["mode"] == EvalMode.VANILLA.value:
                    handles["full"] = ax.axhline(r["score"], color="black", linestyle="--", linewidth=1, label="full")
            ax.set_xscale("log", base=2)
            ax.set_xticks(budgets, [str(b) for b in budgets], minor=False)
            ax.minorticks_off()
            if task != Task.PERPLEXITY.value:
                ax.set_ylim(-0.03, 1.03)   # scores: differences at their true size
            ax.set_title(f"{model} {n // 1024}K: {task}", fontsize=8)
            ax.grid(True, alpha=0.3)
            ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("token budget", fontsize=8)
    shown = [label for label in [*labels, "full"] if label in handles]
    fig.legend([handles[label] for label in shown], shown, loc="upper center", ncol=len(shown), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
