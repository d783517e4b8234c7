"""gil_switch_interval: bound how long pulseio's poller waits for the GIL while the caller's thread runs Python.

The poller spins for the next doorbell request with the GIL released, and the fast lane hands each request to
the resident copier inside that compiled call; between calls the poller takes the GIL (to match requests to
their Completions). A thread taking the GIL back gets it when the holder releases it (a blocking call, most
torch ops) or, if the holder runs pure Python all along, once the interpreter's switch interval has passed
(`sys.getswitchinterval()`, 5 ms by default) and the holder is made to let go. Meanwhile requests published
on the device wait on the host before they reach the copier, and the streams waiting for them stand still.
A serving loop that runs a millisecond of Python at a time (arming a step's recalls, committing tokens,
building the next batch) between its GPU work shortens the interval for as long as it serves.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


@contextmanager
def gil_switch_interval(seconds: float) -> Iterator[None]:
    """Within the block, the interpreter's GIL switch interval is `seconds` (`sys.setswitchinterval`); the one
    before is restored on leaving. The interval is the process's: set it where the process's main loop runs."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 1:
        raise ValueError(f"gil_switch_interval takes seconds in (0, 1], got {seconds!r} (pulseio's serving loops "
                         "use 1e-4; the interpreter's default is 5e-3)")
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    log.info("GIL switch interval %.0f us while serving (it was %.0f us): pulseio's poller takes the GIL between "
             "requests", seconds * 1e6, before * 1e6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
