"""`--ahead-budget`, the same for `bench` and `replay`: the budget of the prediction `--ahead` recalls a layer early
(`OffloadConfig.ahead_budget`). A random-weight preset is steered to the share measured at that budget on a real
model (`sparse_bench.AHEAD_HITS`)."""

from __future__ import annotations

import argparse

from pulseio.cliargs import UsageError, float_at_least


def add_ahead_budget_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--ahead-budget", type=float_at_least(1.0), default=1.0, metavar="F",
                        help="with --ahead: the prediction selects F token budgets of blocks (at most --hot-cache), "
                             "so less is left to recall after a layer's own selection, for more traffic ahead of it "
                             "(default 1; a random-weight preset is steered at the budgets measured: "
                             "`sparse_bench.AHEAD_HITS`)")


def check_ahead_budget(prog: str, ahead: bool, ahead_budget: float) -> None:
    """`--ahead-budget` sizes `--ahead`'s prediction, so it needs `--ahead`."""
    if ahead_budget != 1.0 and not ahead:
        raise UsageError(prog, "--ahead-budget sizes the prediction of --ahead: give --ahead too")
