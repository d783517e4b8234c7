"""`--ahead-budget` and `--early-select`, the same for `bench` and `replay`: the budget of the prediction `--ahead`
recalls a layer early (`OffloadConfig.ahead_budget`), and each layer's own selection beside its projection
(`OffloadConfig.early_select`). A random-weight preset is steered to the share measured at that budget on a real
model (`sparse_bench.AHEAD_HITS`)."""

from __future__ import annotations

import argparse

from pulseio.cliargs import UsageError, float_at_least


def add_ahead_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--ahead-budget", type=float_at_least(1.0), default=1.0, metavar="F",
                        help="with --ahead: the prediction selects F token budgets of blocks (at most --hot-cache), "
                             "so less is left to recall after a layer's own selection, for more traffic ahead of it "
                             "(default 1; a random-weight preset is steered at the budgets measured: "
                             "`sparse_bench.AHEAD_HITS`)")
    parser.add_argument("--early-select", action="store_true",
                        help="with --ahead: each offloaded layer after the first selects from the queries its weights "
                             "make of its own input (the selecting heads' rows of W_q) beside its qkv projection, not "
                             "after it, so its recall is posted that much sooner (the sum group rule only)")


def check_ahead_budget(prog: str, ahead: bool, ahead_budget: float, early_select: bool = False) -> None:
    """`--ahead-budget` sizes `--ahead`'s prediction, and `--early-select` relies on it: both need `--ahead`."""
    if ahead_budget != 1.0 and not ahead:
        raise UsageError(prog, "--ahead-budget sizes the prediction of --ahead: give --ahead too")
    if early_select and not ahead:
        raise UsageError(prog, "--early-select relies on the prediction of --ahead to make the block being written "
                               "resident before a layer selects: give --ahead too")
