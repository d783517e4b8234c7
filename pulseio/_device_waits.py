"""DeviceWaits: how a doorbell request's `device_wait` is carried out, so that none can hang the process.

`device_wait(stream)` makes later work on `stream` run only once the request's blocks are in their
slots, or once the request has failed (then `exception()` says why and the slots hold whatever they
held, possibly part of the copy). No wait can hang the process:

* A stream that waits on the device for work the host has yet to enqueue deadlocks the context
  as soon as any thread makes a driver call that waits for the whole device (a kernel's first
  launch under lazy loading, Triton loading a kernel, cudaFree / `empty_cache()`, a device
  synchronize): that call waits for the stream, and our next driver call waits for that call.
  So no device wait here ever depends on a driver call still to be made.
* RESIDENT requests (and AUTO, which in the doorbell path means RESIDENT wherever the backend has a
  resident copier) never wait on the host: the stream waits for the request's wait word in pinned
  host memory (the wait kernel), and the resident copier stores the word when the data lands. Before
  that wait, `device_wait` launches a copier generation for the request in the stream's order: it
  starts only once the stream has run the request's publish, and does not stop before the word is set.
  Between the publish and the word there is no driver call: the poller posts the task with plain stores.
* And no kernel of ours runs ahead of work it depends on that is still queued: some operations wait
  for every running kernel first, on the host (a first launch under lazy module loading, a Triton
  module load, cudaFree; other threads' driver calls then wait too) or on the GPU (some first launches
  under eager loading). A copier kept up on the host's word for a request whose publish is still
  queued behind one of those never sees its task: a deadlock until the watchdog (it was, before).
* Every other strategy needs driver calls after the publish (a launch, a memcpy), so its
  `device_wait` first waits on the host, GIL released, until the copy is enqueued (which needs the
  publish to have run), then makes the stream wait for the copy's event.
* The watchdog: a request a stream waits for that has not finished `device_wait_timeout_s` after the
  wait was enqueued is failed (`TransferError` naming it, its strategy and the stage it was stuck at)
  and its word set, so the stream moves on. If it had not reached a copier yet it never will as a task
  (though a resident copier reading the ids mirror may copy it early, as it is published, until the
  poller has read it); if it had (only a GPU fault or a pulseio bug keeps a running copier from landing
  it), its copy may still write the slots later: treat them as garbage either way.
* A host-side wait for a non-RESIDENT copy to be enqueued is bounded by the same timeout, then raises.
* `device_wait` cannot be captured in a CUDA graph (it raises): a replay would wait for the same
  request again. Publishing from a graph (`publish_device`, `expect_published`) is fine, and so is a
  `RecallGraph` (`pulseio/recall_graph.py`), whose captured wait reads the seq its publish took on the
  device. Before each replay `serve_replay` does for all its requests what `device_wait` does for one:
  one copier generation launched in the stream's order, up until the last request has landed (every
  publish of the replay is enqueued with the replay itself, so none waits on a driver call still to be
  made), and the watchdog armed for each.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from ._poller import Poller
from ._wait_words import WaitWords
from ._watchdog import Watchdog
from .backend import Publisher
from .dma import DmaEngine
from .errors import TransferError, WaitTimeout
from .interrupts import Completion
from .plan import Strategy

log = logging.getLogger(__name__)


class DeviceWaits:
    """Carries out `Completion.device_wait` for a Runtime's doorbell requests; owns the watchdog."""

    def __init__(self, publisher: Publisher, words: WaitWords, poller: Poller, workers: Sequence[DmaEngine], *,
                 timeout_s: float) -> None:
        self._publisher, self._words, self._poller, self._workers = publisher, words, poller, workers
        self._timeout = timeout_s
        self._stacks_logged = False  # the first expiry logs every thread's stack: who kept the request back
        self._watchdog = Watchdog(landed=lambda c: words.reached(c.seq), expire=self._expire, timeout_s=timeout_s)

    @property
    def expired(self) -> int:
        """Requests the watchdog failed to release a waiting stream."""
        return self._watchdog.expired

    def device_wait(self, completion: Completion, stream: Any) -> None:
        """See the module doc."""
        timeout = self._timeout
        if completion.done() or not self._publisher.waits_on_device:
            try:
                completion.wait(timeout)
            except WaitTimeout as exc:
                raise TransferError(f"doorbell request seq={completion.seq} tag={completion.tag} has not landed "
                                    f"within device_wait_timeout_s={timeout} s (waited on the host)") from exc
            return
        if completion.strategy is Strategy.RESIDENT:
            seq, word = completion.seq, self._words.address(completion.seq)
            self._copier(seq).serve_for(stream, word, seq)
            self._watchdog.arm(seq, completion)
            self._publisher.wait_word(stream, word, seq)
            return
        if not completion.wait_issued(timeout):
            raise TransferError(
                f"doorbell request seq={completion.seq} tag={completion.tag} ({completion.strategy.value}) was not "
                f"enqueued within device_wait_timeout_s={timeout} s: has its publish run? (nothing was enqueued "
                "on the stream; the request goes on)")
        error = completion.exception()
        if error is not None:
            raise error
        if completion.transfer is not None:  # None: it finished with nothing to copy
            completion.transfer.device_wait(stream)

    def serve_replay(self, completions: Sequence[Completion], stream: Any) -> None:
        """A graph about to be replayed on `stream` publishes these RESIDENT requests, in this order, and waits for
        them on the device itself (see the module doc)."""
        last: dict[int, Completion] = {}
        for completion in completions:
            last[completion.seq % len(self._workers)] = completion
        for completion in last.values():
            self._copier(completion.seq).serve_for(stream, self._words.address(completion.seq), completion.seq)
        self._watchdog.arm_all([(c.seq, c) for c in completions])

    def _copier(self, seq: int) -> Any:
        return self._workers[seq % len(self._workers)].resident

    def _expire(self, completion: Completion) -> None:
        """The watchdog's call: `completion` is still unfinished at its deadline. Fail it, set its word."""
        if completion.done():
            return
        stage = "never reached a copier (its slots were not written)" if self._poller.cancel(completion) else (
            "was handed to the copier and has not landed: its copy may still write its slots")
        blocks = f", {completion.num_blocks} blocks" if completion.num_blocks else ""
        error = TransferError(
            f"doorbell request seq={completion.seq} tag={completion.tag} ({completion.strategy.value}{blocks}) did "
            f"not land within device_wait_timeout_s={self._timeout} s and {stage}; the waiting streams were "
            f"released [{self._copier(completion.seq).describe()}]")
        log.error("%s", error)
        if not self._stacks_logged:
            self._stacks_logged = True
            log.error("at the first expired device wait: %s\n%s\nthreads:\n%s", self._poller.slot_state(completion.seq),
                      self._words_before(completion.seq), thread_stacks())
        self._poller.fail(completion, error)

    def _words_before(self, seq: int, n: int = 3) -> str:
        """The wait words of seq and the n requests before it: which the device has seen land."""
        seqs = range(max(1, seq - n), seq + 1)
        return "wait words: " + ", ".join(f"seq {s}: {self._words.value(s)}" for s in seqs)

    def close(self) -> None:
        self._watchdog.close()


def thread_stacks() -> str:
    """Every Python thread's stack, named: what each was doing (a thread in a driver call shows the call)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(f"--- {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame)).rstrip()
                     for ident, frame in sys._current_frames().items())
