"""The resident copier's settings on the command line, the same for `bench` and `replay`: how many copy CTAs
it holds while up (`pulseio.DmaConfig.zero_copy_ctas`) and how long a generation stays up without a task
(`resident_idle_us`). Both trade recall speed against the SMs the model's kernels keep meanwhile."""

from __future__ import annotations

import argparse

from pulseio import DmaConfig
from pulseio.cliargs import int_at_least

from .offload import RECALL_COPY_CTAS, RESIDENT_IDLE_US


def add_copier_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--copier-ctas", metavar="N", type=int_at_least(1), default=None,
                        help=f"offload modes: the resident copier's copy CTAs (pulseio DmaConfig.zero_copy_ctas, "
                             f"default {RECALL_COPY_CTAS} on a GPU)")
    parser.add_argument("--copier-idle-us", metavar="US", type=int_at_least(1), default=None,
                        help=f"offload modes: how long a copier generation stays up without a task, holding its "
                             f"SMs (default {RESIDENT_IDLE_US} on a GPU: through a step)")


def copier_dma(ctas: int | None, idle_us: int | None) -> DmaConfig | None:
    """The offload runtime's DmaConfig for these settings; None (the engine's own) if neither is given."""
    if ctas is None and idle_us is None:
        return None
    return DmaConfig(zero_copy_ctas=ctas or RECALL_COPY_CTAS, resident_idle_us=idle_us or RESIDENT_IDLE_US)
