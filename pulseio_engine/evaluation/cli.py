"""The `eval`, `eval-table` and `locality` subcommands of `pulseio-engine` (parsers and handlers).

    pulseio-engine eval --model smollm2 --task niah-single --context-len 4096 --samples 20 --mode quest \
        --token-budget 1024 --json out/niah.json
    pulseio-engine eval-table --model smollm2 --context-len 2048,4096 --samples 20 --heads heads.json \
        --out out/smollm2      # every task x mode x budget: one JSON each, and out/smollm2/table.md
    pulseio-engine eval-summary out/smollm2 out/smollm2-rerun --plot accuracy.png   # one grid of several runs

Every option is checked before the model is loaded; a mistake is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

from pulseio.cliargs import (
    DEBUG_HELP,
    UsageError,
    check_writable,
    choice_list,
    device_name,
    int_at_least,
    int_list,
    require_device,
)

from ..config import DEFAULT_GROUP_SCORE, GroupScore, RecallMode, SparseMode
from ..errors import EngineError
from ..kv.retrieval_heads import RetrievalHeads
from .locality import LocalityConfig, run_locality
from .run import EvalConfig, EvalMode, check_heads, has_random_weights, random_weights_note, run_eval
from .summary import combine, gaps, gaps_markdown, write_plot
from .table import CellsFailed, TableConfig, markdown, run_table
from .tasks import Task

_TASKS = tuple(t.value for t in Task)
_MODES = tuple(m.value for m in EvalMode)
_BATCH_HELP = "concurrent requests at most; default: all of them, as far as half the free memory holds their KV"
_GROUP_HELP = ("how a GQA group's query heads combine their block scores: sum, or max-norm (each head's against its "
               "own best, then the max)")


def add_parsers(sub: argparse._SubParsersAction, model_help: str) -> None:
    e = sub.add_parser("eval", help="long-context accuracy of a sparse mode (RULER-style tasks, perplexity)",
                       description="Long-context accuracy of a sparse mode: RULER-style tasks generated in code "
                                   "and perplexity; the question is decoded token by token through the sparse path.")
    e.add_argument("--model", required=True, help=model_help + " (it needs a tokenizer)")
    e.add_argument("--task", required=True, choices=_TASKS, help="which task")
    e.add_argument("--context-len", type=int_at_least(64), required=True, help="tokens of context + question")
    e.add_argument("--samples", type=int_at_least(1), default=10, help="samples of the task")
    e.add_argument("--mode", choices=_MODES, default=EvalMode.QUEST.value, help="full attention, or a sparse selection")
    e.add_argument("--token-budget", type=int_at_least(1), default=2048, help="tokens of KV attended per step")
    e.add_argument("--json", metavar="PATH", type=Path, default=None,
                   help="write the record (score and per-sample results) as JSON")
    _shared(e)
    e.set_defaults(func=_eval, prog=e.prog)

    t = sub.add_parser("eval-table", help="a grid of evaluations (tasks x contexts x modes x budgets), one model load",
                       description="A grid of evaluations in one process: the model is loaded once, one engine per "
                                   "(context, mode, budget) runs every task's samples together. One JSON per "
                                   "(task, context, mode, budget) in --out, and --out/table.md over every record "
                                   "there. Sparse modes skip budgets >= the context (they equal vanilla).")
    t.add_argument("--model", required=True, help=model_help + " (it needs a tokenizer)")
    t.add_argument("--task", type=choice_list(_TASKS), default=_TASKS, help="tasks, comma-separated")
    t.add_argument("--context-len", type=int_list(64), required=True, help="context lengths, comma-separated")
    t.add_argument("--samples", type=int_at_least(1), default=20,
                   help="samples per task (perplexity: windows of the text, disjoint where it holds that many, "
                        "else overlapping with disjoint scored tails)")
    t.add_argument("--mode", type=choice_list(_MODES), default=_MODES, help="modes, comma-separated")
    t.add_argument("--token-budget", type=int_list(1), default=(512, 1024, 2048),
                   help="token budgets of the sparse modes, comma-separated")
    t.add_argument("--out", required=True, type=Path, help="folder for the JSON records and table.md")
    t.add_argument("--resume", action="store_true",
                   help="keep the records already in --out (same samples, seed, recall and group rule); run only "
                        "the rest")
    t.add_argument("--shard", type=_shard, default=(0, 1), metavar="K/N",
                   help="run every N-th cell of the grid from the K-th (0-based), e.g. one process per GPU "
                        "with CUDA_VISIBLE_DEVICES=K and the same --out (default: 0/1, every cell)")
    _shared(t)
    t.set_defaults(func=_eval_table, prog=t.prog)

    s = sub.add_parser("eval-summary", help="eval-table folders as one grid: table, gap to full attention, plot",
                       description="Every record of the folders as one grid (a cell in several folders keeps the "
                                   "last one's record): the table, each sparse mode's mean gap to full attention "
                                   "in points where full scores at least --floor, and optionally a plot.")
    s.add_argument("folders", nargs="+", type=Path, metavar="FOLDER", help="folders of eval records, oldest first")
    s.add_argument("--floor", type=float, default=0.5, help="count cells where full attention scores at least this")
    s.add_argument("--out", type=Path, default=None, help="also write the tables here (markdown)")
    s.add_argument("--plot", type=Path, default=None,
                   help="write a plot of score against budget here (needs matplotlib)")
    s.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    s.set_defaults(func=_eval_summary, prog=s.prog)

    lo = sub.add_parser("locality", help="step-to-step overlap of a sparse mode's selections on real text",
                        description="Decode public-domain text through the sparse offload path and report, per "
                                    "offloaded layer, how much of each step's middle selection the previous step "
                                    "had selected, and the fraction of the budget recalled per step.")
    lo.add_argument("--model", required=True, help=model_help + " (it needs a tokenizer)")
    lo.add_argument("--context-len", type=int_at_least(64), required=True, help="tokens prefilled before the steps")
    lo.add_argument("--steps", type=int_at_least(2), default=64, help="decode steps measured (text fed one token each)")
    lo.add_argument("--token-budget", type=int_at_least(1), default=1024, help="tokens of KV attended per step")
    lo.add_argument("--mode", choices=[m.value for m in SparseMode], default=SparseMode.SOLOHEAD.value,
                    help="which heads select: each KV head (quest) or one per layer (solohead)")
    lo.add_argument("--heads", type=Path, default=None, help="retrieval-head JSON of `calibrate` (solohead needs it)")
    lo.add_argument("--samples", type=int_at_least(1), default=1, help="text windows, each one request")
    _group_score(lo)
    lo.add_argument("--device", type=device_name(allow_auto=True), default="cpu", help="cpu, cuda or cuda:N")
    lo.add_argument("--json", metavar="PATH", type=Path, default=None,
                    help="write the record (per-layer figures) as JSON")
    lo.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    lo.set_defaults(func=_locality, prog=lo.prog)


def _shared(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recall", choices=[r.value for r in RecallMode], default=RecallMode.DOORBELL.value,
                   help="doorbell: ids chosen on the device; sync: ids to the host, then the copy")
    p.add_argument("--heads", type=Path, default=None, help="retrieval-head JSON of `calibrate` (solohead needs it)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="sample generation seed")
    p.add_argument("--batch", type=int_at_least(1), default=None, help=_BATCH_HELP)
    _group_score(p)
    p.add_argument("--device", type=device_name(allow_auto=True), default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)


def _group_score(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group-score", choices=[g.value for g in GroupScore], default=DEFAULT_GROUP_SCORE.value,
                   help=_GROUP_HELP)


def _heads(args: argparse.Namespace) -> RetrievalHeads | None:
    """--heads, loaded; a file that is missing, not JSON or not a heads file is one line naming it and what it
    should hold (RetrievalHeads' own errors say what is wrong inside; this adds the file and the fix)."""
    path: Path | None = args.heads
    if path is None:
        return None
    should = (f"it should hold the JSON that `pulseio-engine calibrate --model {args.model} --out heads.json` writes "
              '({"num_kv_heads": ..., "best": [one KV head per layer], "worst": [...]})')
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(args.prog, f"--heads {path} cannot be read ({exc.strerror}); {should}") from None
    except UnicodeDecodeError:
        raise UsageError(args.prog, f"--heads {path} is not text, so not a retrieval-head file; {should}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(args.prog, f"--heads {path} is not JSON ({exc}); {should}") from None
    if not isinstance(data, dict):
        raise UsageError(args.prog, f"--heads {path} holds a JSON {type(data).__name__}, not a retrieval-head "
                                    f"object; {should}")
    try:
        return RetrievalHeads.from_json(text, source=str(path))
    except (ValueError, TypeError) as exc:
        raise UsageError(args.prog, f"--heads {path} is not a retrieval-head file ({exc}); {should}") from None


def _eval(args: argparse.Namespace) -> int:
    prog = args.prog
    if args.json is not None:
        check_writable(prog, "--json", args.json)
    heads = _heads(args)
    try:
        config = EvalConfig(Task(args.task), args.context_len, args.samples, EvalMode(args.mode),
                            args.token_budget, RecallMode(args.recall), args.seed, GroupScore(args.group_score))
        if has_random_weights(args.model):
            print(f"{prog}: {random_weights_note(args.model)}", file=sys.stderr, flush=True)
        result = run_eval(args.model, config, heads=heads, device=require_device(prog, args.device), batch=args.batch)
    except ValueError as exc:           # a config rule (budget, windows): stated by the config's message
        raise EngineError(str(exc)) from exc
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['task']} {result['mode']} budget {result['token_budget']} context {result['context_len']}: "
          f"score {result['score']:.4g} over {result['samples']} samples ({result['seconds']:.1f} s, "
          f"batch {result['batch']})" + (" -- RANDOM WEIGHTS: noise, not accuracy" if result.get("random_weights")
                                         else ""))
    return 0


def _shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N) with 0 <= K < N."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K/N (e.g. 0/2), got {text!r}") from None
    if not 0 <= k < n:
        raise argparse.ArgumentTypeError(f"K/N needs 0 <= K < N, got {text!r}")
    return k, n


def _eval_table(args: argparse.Namespace) -> int:
    prog = args.prog
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(prog, f"--out {args.out} is a file; pass a folder (it is created if missing)")
    check_writable(prog, "--out", args.out / "table.md")
    try:
        table = TableConfig(tuple(Task(t) for t in args.task), args.context_len, tuple(EvalMode(m) for m in args.mode),
                            args.token_budget, args.samples, RecallMode(args.recall), args.seed, args.batch,
                            args.shard, GroupScore(args.group_score))
    except ValueError as exc:
        raise UsageError(prog, str(exc)) from exc
    heads = _heads(args)
    for mode in table.modes:
        check_heads(mode, heads, args.model)
    device = require_device(prog, args.device)
    if has_random_weights(args.model):
        print(f"{prog}: {random_weights_note(args.model)}", file=sys.stderr, flush=True)
    start = time.monotonic()
    say = lambda text: print(f"[{time.monotonic() - start:7.1f} s] {text}", file=sys.stderr, flush=True)
    try:
        records = run_table(args.model, table, args.out, heads=heads, device=device, resume=args.resume, say=say)
    except CellsFailed as exc:
        print(markdown(exc.records, skipped=table.skipped), end="")
        say(f"{len(exc.failed)} cells FAILED (no record; run again with --resume to retry them): "
            + "; ".join(exc.failed))
        return 1
    print(markdown(records, skipped=table.skipped), end="")
    say(f"done: {len(records)} records and table.md in {args.out}")
    return 0


def _eval_summary(args: argparse.Namespace) -> int:
    prog = args.prog
    for folder in args.folders:
        if not folder.is_dir():
            raise UsageError(prog, f"{folder} is not a folder (pass folders of eval records, e.g. eval-table --out)")
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(prog, f"--plot {args.plot} needs matplotlib, which is not installed; "
                               "pip install matplotlib, or leave --plot out")
    for option, path in (("--out", args.out), ("--plot", args.plot)):
        if path is not None:
            check_writable(prog, option, path)
    grid = combine(args.folders)
    records = grid.records
    if not records:
        raise UsageError(prog, f"no eval records in {', '.join(map(str, args.folders))}")
    used = [f for f in map(str, args.folders) if any(r["folder"] == f for r in records)]
    text = (markdown(records) + "\n### Gap to full attention\n\n" + gaps_markdown(gaps(records, args.floor), args.floor)
            + "\nRecords from: " + ", ".join(used) + "\n")
    if grid.replaced:
        text += "\nCells with a record in several folders (the last folder's is used):\n\n" + "".join(
            f"- {r.cell}: {r.used}, not {r.dropped}\n" for r in grid.replaced)
    for r in grid.replaced:
        print(f"{prog}: note: {r.cell} has records in several folders: using {r.used}, not {r.dropped}",
              file=sys.stderr)
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    if args.plot is not None:
        write_plot(args.plot, records)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


def _locality(args: argparse.Namespace) -> int:
    prog = args.prog
    if args.json is not None:
        check_writable(prog, "--json", args.json)
    heads = _heads(args)
    try:
        config = LocalityConfig(args.context_len, args.steps, args.token_budget, SparseMode(args.mode), args.samples,
                                GroupScore(args.group_score))
        result = run_locality(args.model, config, heads=heads, device=require_device(prog, args.device))
    except ValueError as exc:           # a config rule (budget, windows): stated by the config's message
        raise EngineError(str(exc)) from exc
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'layer':>5} {'overlap':>8} {'recall':>7}")
    for layer, overlap, recall in zip(result["layers"], result["overlap"], result["recall_fraction"]):
        print(f"{layer:>5} {overlap:>8.3f} {recall:>7.3f}")
    print(f"{result['model']} {result['mode']} budget {result['token_budget']} context {result['context_len']}: "
          f"mean overlap {result['mean_overlap']:.3f}, mean recall {result['mean_recall_fraction']:.3f} of the budget "
          f"per step ({result['seconds']:.1f} s); with a hot cache of "
          + " / ".join(f"{f:g}" for f in result["hot_cache_factors"]) + " budgets: "
          + " / ".join(f"{r:.3f}" for r in result["mean_hot_cache_recall_fraction"]))
    return 0
