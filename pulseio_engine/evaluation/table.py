"""A grid of evaluations in one process: `pulseio-engine eval-table`.

The checkpoint is loaded once and each (context length, task) gets its samples once. Then one engine
per (context length, mode, budget) runs the samples of every task together, as concurrent requests
(`run_prompts`): a sample's result does not depend on what shares its batch. Each (task, mode, budget,
context length) gets the JSON record `run_eval` writes, and `markdown` lays the records out per task:
modes as columns, (context, budget) as rows.

A sparse mode at a budget >= the context length attends to every token (a CI test pins that it equals
full attention), so such cells are skipped and marked in the table.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import DEFAULT_GROUP_SCORE, GroupScore, RecallMode, SparseConfig
from ..errors import EngineError
from ..kv.recall import RecallError
from ..kv.retrieval_heads import RetrievalHeads
from ..model.checkpoint import Checkpoint
from ..model.tokenizer import Tokenizer
from .run import (
    EvalConfig,
    EvalMode,
    Prompt,
    check_heads,
    check_prompts,
    eval_engine,
    load_eval_checkpoint,
    make_prompts,
    make_record,
    mode_label,
    model_len,
    record_group_score,
    run_prompts,
    text_ids,
    windows_in,
)
from .tasks import Task


@dataclass(frozen=True)
class Cell:
    """One engine of the grid: vanilla has no budget (None)."""

    context_len: int
    mode: EvalMode
    token_budget: int | None

    @property
    def name(self) -> str:
        return self.mode.value if self.token_budget is None else f"{self.mode.value}_{self.token_budget}"


@dataclass(frozen=True)
class TableConfig:
    tasks: tuple[Task, ...]
    context_lens: tuple[int, ...]
    modes: tuple[EvalMode, ...]
    budgets: tuple[int, ...]
    samples: int
    recall: RecallMode = RecallMode.DOORBELL
    seed: int = 0
    batch: int | None = None       # concurrent requests at most; None: all of a cell's, as memory allows
    shard: tuple[int, int] = (0, 1)    # (k, n): this process runs every n-th cell from the k-th (one per GPU)
    group_score: GroupScore = DEFAULT_GROUP_SCORE
    skipped: tuple[Cell, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        for name in ("tasks", "context_lens", "modes"):
            if not getattr(self, name):
                raise ValueError(f"TableConfig.{name} must not be empty")
        if not self.budgets and any(m is not EvalMode.VANILLA for m in self.modes):
            raise ValueError("TableConfig.budgets must not be empty when a sparse mode is asked for")
        for budget in self.budgets:                      # the budget rules, before any model is loaded
            try:
                SparseConfig(token_budget=budget)
            except ValueError as exc:
                raise ValueError(f"token budget {budget}: {exc}") from None
        index, count = self.shard
        if not 0 <= index < count:
            raise ValueError(f"shard {index}/{count}: k must be in 0 .. n - 1")
        skipped = tuple(Cell(n, m, b) for n in self.context_lens for m in self._sparse_modes
                        for b in self.budgets if b >= n)
        object.__setattr__(self, "skipped", skipped)
        if not self.all_cells():
            raise ValueError(f"every budget ({', '.join(map(str, self.budgets))}) is >= every context length "
                             f"({', '.join(map(str, self.context_lens))}), so there is nothing sparse to run; "
                             "add a smaller budget, a longer context or the vanilla mode")

    @property
    def _sparse_modes(self) -> list[EvalMode]:
        return [m for m in self.modes if m is not EvalMode.VANILLA]

    def cells(self) -> list[Cell]:
        """This shard's engines to build: every n-th of `all_cells`, from the k-th."""
        index, count = self.shard
        return self.all_cells()[index::count]

    def all_cells(self) -> list[Cell]:
        """The grid's engines, vanilla first for each context length."""
        cells = []
        for n in self.context_lens:
            if EvalMode.VANILLA in self.modes:
                cells.append(Cell(n, EvalMode.VANILLA, None))
            cells += [Cell(n, m, b) for b in self.budgets for m in self._sparse_modes if b < n]
        return cells

    def eval_config(self, task: Task, cell: Cell, samples: int) -> EvalConfig:
        """The record's config; vanilla's budget is the context (it attends to every token)."""
        budget = cell.context_len if cell.token_budget is None else cell.token_budget
        return EvalConfig(task, cell.context_len, samples, cell.mode, budget, self.recall, self.seed,
                          self.group_score)


def run_table(model: str, table: TableConfig, out: Path, *, heads: RetrievalHeads | None = None,
              device: str = "cpu", resume: bool = False, say: Callable[[str], None] = print
              ) -> list[dict[str, Any]]:
    """Run every cell of `table`, writing `<model>_<context>_<task>_<cell>.json` into `out` as each cell
    finishes and `table.md` (every record in `out`) after each; -> the records of the table. `resume`:
    a cell whose records are all in `out` already is read, not run again. A cell whose recalls failed
    (`RecallError`) writes no record; the others still run, then `CellsFailed` names it."""
    for mode in table.modes:
        check_heads(mode, heads, model)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    ckpt = load_eval_checkpoint(model, device)
    tok = ckpt.tokenizer
    assert tok is not None                  # load_eval_checkpoint refuses a model without one
    say(f"loaded {model} on {device} in {time.monotonic() - start:.1f} s")
    for cell in table.skipped:
        say(f"skip context {cell.context_len} {cell.mode.value} budget {cell.token_budget}: "
            "a budget >= the context attends to every token (= vanilla)")
    shard = f" (shard {table.shard[0]}/{table.shard[1]} of {len(table.all_cells())})" if table.shard[1] > 1 else ""
    say(f"{len(table.cells())} engines{shard} x {len(table.tasks)} tasks x {table.samples} samples")
    text = text_ids(tok) if Task.PERPLEXITY in table.tasks else []
    prompts: dict[int, dict[Task, list[Prompt]]] = {}
    for n in table.context_lens:           # every context's samples first: a sizing error stops the run at once
        t0 = time.monotonic()
        prompts[n] = {task: make_prompts(tok, task, n, _samples(table, task, n, len(text), say),
                                         table.seed, text=text) for task in table.tasks}
        for made in prompts[n].values():
            check_prompts(made, model_len(ckpt.config, n), model)
        say(f"context {n}: {sum(map(len, prompts[n].values()))} prompts of {len(table.tasks)} tasks made in "
            f"{time.monotonic() - t0:.1f} s")
    records: list[dict[str, Any]] = []
    failed: list[str] = []
    for cell in table.cells():
        kept = _done(out, model, table, cell, prompts[cell.context_len]) if resume else None
        if kept is not None:
            say(f"context {cell.context_len} {cell.name}: done already, kept ({out})")
            records += kept
            continue
        try:
            records += _run_cell(model, ckpt, table, cell, prompts[cell.context_len], out, tok=tok, heads=heads,
                                 device=device, say=say)
        except RecallError as exc:
            failed.append(f"context {cell.context_len} {cell.name}: {exc}")
            say(f"context {cell.context_len} {cell.name}: FAILED, no record written: {exc}")
            continue
        _write_table(out, table)
    if failed:
        raise CellsFailed(records, failed)
    return records


def _write_table(out: Path, table: TableConfig) -> None:
    """table.md over every record in `out`, replaced whole (shards of one table write it in turn)."""
    part = out / f".table.md.{os.getpid()}"
    part.write_text(markdown(load_records(out), skipped=table.skipped))
    part.replace(out / "table.md")


class CellsFailed(EngineError, RuntimeError):
    """Cells of a table whose recalls failed; `records` holds those of the cells that ran."""

    def __init__(self, records: list[dict[str, Any]], failed: list[str]) -> None:
        super().__init__(f"{len(failed)} cells failed: " + "; ".join(failed))
        self.records, self.failed = records, failed


def _done(out: Path, model: str, table: TableConfig, cell: Cell, prompts: dict[Task, list[Prompt]]
          ) -> list[dict[str, Any]] | None:
    """The cell's records in `out` when every task has one made with these samples, seed, recall and
    group rule."""
    records = []
    rule = None if cell.mode is EvalMode.VANILLA else table.group_score.value
    for task in table.tasks:
        path = _path(out, model, cell, task)
        record = json.loads(path.read_text()) if path.is_file() else {}
        want = {"samples": len(prompts[task]), "seed": table.seed, "recall": table.recall.value}
        if any(record.get(k) != v for k, v in want.items()) or record_group_score(record) != rule:
            return None
        records.append(record)
    return records


def _samples(table: TableConfig, task: Task, n: int, text_tokens: int, say: Callable[[str], None]) -> int:
    """`table.samples`, except perplexity: at most the windows the text holds at context n (`windows_in`)."""
    fit = windows_in(text_tokens, n)
    if task is not Task.PERPLEXITY or table.samples <= fit:
        return table.samples
    if fit < 1:
        raise EngineError(f"perplexity at context {n} needs a window of {n - 1} tokens, the text has {text_tokens}; "
                          "leave perplexity out of --task or shorten --context-len")
    say(f"context {n}: perplexity over {fit} windows, not {table.samples}: the text has {text_tokens} tokens")
    return fit


def _run_cell(model: str, ckpt: Checkpoint, table: TableConfig, cell: Cell, prompts: dict[Task, list[Prompt]],
              out: Path, *, tok: Tokenizer, heads: RetrievalHeads | None, device: str, say: Callable[[str], None]
              ) -> list[dict[str, Any]]:
    """One engine for every task's samples of a cell (`tok`: the checkpoint's tokenizer); one record per task."""
    everything = [p for task in table.tasks for p in prompts[task]]
    start = time.monotonic()
    config = table.eval_config(table.tasks[0], cell, table.samples)
    phases: dict[str, float] = {}
    with eval_engine(ckpt, config, heads=heads, device=device, batch=table.batch or len(everything)) as engine:
        phases["build"] = time.monotonic() - start
        answers = run_prompts(engine, everything, offload=cell.mode is not EvalMode.VANILLA, seconds=phases)
        batch = engine.config.scheduler.max_num_seqs
    seconds = time.monotonic() - start
    records, at = [], 0
    for task in table.tasks:
        count = len(prompts[task])
        record = make_record(model, table.eval_config(task, cell, count), prompts[task], answers[at:at + count],
                             tok, seconds, batch)
        record["tasks_batched"] = [t.value for t in table.tasks]      # `seconds` is the cell's, for all of them
        record["cell_seconds"] = {phase: round(value, 2) for phase, value in phases.items()}
        at += count
        _path(out, model, cell, task).write_text(json.dumps(record, indent=1) + "\n")
        records.append(record)
    scores = ", ".join(f"{r['task']} {r['score']:.3g}" for r in records)
    split = ", ".join(f"{phase} {value:.1f}" for phase, value in phases.items())
    say(f"context {cell.context_len} {cell.name}: {scores} ({seconds:.1f} s: {split}; batch {batch})")
    return records


def _path(out: Path, model: str, cell: Cell, task: Task) -> Path:
    return out / f"{Path(model).name.removesuffix('.gguf')}_{cell.context_len}_{task.value}_{cell.name}.json"


def load_records(folder: Path) -> list[dict[str, Any]]:
    """Every eval record (a JSON object with task, mode and score) in `folder`."""
    return [record for _, record in record_files(folder)]


def record_files(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(file, record) of every eval record in `folder`, by file name; other JSON files are skipped."""
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and {"task", "mode", "score", "context_len"} <= record.keys():
            found.append((path, record))
    return found


def markdown(records: list[dict[str, Any]], *, skipped: tuple[Cell, ...] = ()) -> str:
    """Per (model, task): one table, modes as columns, (context, budget) as rows; vanilla (full attention,
    budget-free) repeated on every row; skipped cells say why."""
    lines: list[str] = []
    for model, task in sorted({(r["model"], r["task"]) for r in records}, key=_task_order):
        mine = [r for r in records if (r["model"], r["task"]) == (model, task)]
        modes = list(mode_labels(mine))
        sparse = [m for m in modes if m != EvalMode.VANILLA.value]
        perplexity = task == Task.PERPLEXITY.value
        samples = sorted({r["samples"] for r in mine})
        noise = " -- RANDOM WEIGHTS: noise, not accuracy" if any(r.get("random_weights") for r in mine) else ""
        lines += [f"### {model}: {task} ({'perplexity, lower is better' if perplexity else 'score'}; "
                  f"{'/'.join(map(str, samples))} samples){noise}", "",
                  "| context | budget | " + " | ".join(modes) + " |", "|---:|---:|" + "---:|" * len(modes)]
        for n in sorted({r["context_len"] for r in mine}):
            vanilla = {r["mode"]: r for r in mine if r["context_len"] == n and r["mode"] == EvalMode.VANILLA.value}
            budgets = sorted({r["token_budget"] for r in mine if r["context_len"] == n and mode_label(r) in sparse}
                             | {c.token_budget for c in skipped if c.context_len == n and c.mode.value in sparse
                                and c.token_budget is not None})     # a skipped (sparse) cell has a budget
            for budget in budgets or [n]:
                found = {mode_label(r): r for r in mine if r["context_len"] == n and r["token_budget"] == budget}
                cells = [_cell(vanilla.get(m) if m == EvalMode.VANILLA.value else found.get(m), perplexity,
                               budget >= n and m in sparse) for m in modes]
                lines.append(f"| {n} | {budget} | " + " | ".join(cells) + " |")
        lines.append("")
    lines.append("Skipped: a sparse mode at a budget >= the context attends to every token, i.e. equals vanilla.")
    return "\n".join(lines) + "\n"


def mode_labels(records: list[dict[str, Any]]) -> dict[str, str]:
    """The records' `mode_label`s -> their modes, in `EvalMode` order, each mode's default group rule first."""
    labels = {mode_label(r): r["mode"] for r in records}
    order = [m.value for m in EvalMode]
    return {label: labels[label] for label in
            sorted(labels, key=lambda label: (order.index(labels[label]), label != labels[label], label))}


def _cell(record: dict[str, Any] | None, perplexity: bool, skipped: bool) -> str:
    if record is None:
        return "skipped (budget >= context)" if skipped else "-"
    return f"{record['score']:.3g}" if perplexity else f"{record['score']:.2f}"


def _task_order(key: tuple[str, str]) -> tuple[str, int]:
    order = [t.value for t in Task]
    return key[0], order.index(key[1]) if key[1] in order else len(order)

