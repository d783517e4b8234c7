"""RecallGraph: doorbell recalls captured into a CUDA graph, so a replay recalls with no host work per recall.

Outside a graph each recall is a `post_recall` (a publish launch) and a `device_wait` (a copier launch and a
wait launch): tens of microseconds of host time a recall, every layer of every step. Inside a captured graph
the same two kernels run on every replay, with nothing from the host:

    recalls = runtime.recall_graph()
    with torch.cuda.graph(graph):
        ids, slots, count = choose(...)                # kernels: [N] int64 ids and slots, [1] int64 count
        recalls.post(host_ids=ids, device_slots=slots, count=count, tag=layer)   # publish + device wait
        attend(...)                                    # kernels that read the recalled slots
    for step in steps:
        done = recalls.arm()                           # before every replay, on the stream it replays on (waits
                                                       # only while the ring is full; arm_nowait raises instead)
        graph.replay()
        ...                                            # done: one Completion per post, in post order

A captured publish takes its seq from the device counter (so each replay publishes new requests) and
stores it where its captured wait reads it (so each replay waits for what it published). `arm` is what
each request needs from the host: its Completion, one resident copier generation for the whole replay
(launched in the stream's order, it stays up until the replay's last request has landed), and the
watchdog, which releases a wait whose request does not land in `device_wait_timeout_s` and fails that
request. Arm before every replay: a replay that was not armed still has its requests copied (the poller
serves requests nobody expects), but the runtime's count of seqs falls behind the device's, so later
Completions name the wrong requests (they fail on a tag mismatch where the tags differ).
Only RESIDENT requests can be captured: every other route needs host driver calls after the publish.

A step captured as several graphs (one per layer, so the host can run other work between them) may capture
only the publish (`post(..., wait=False)`) and make the stream wait later, if at all: `wait_device(index)`
launches, or captures, the wait for that post of the replay in flight. The Completions of `arm` tell the host,
never waiting, whether a request has landed (`done()`), so a host that sees it landed needs no wait. All the
graphs holding one RecallGraph's posts are replayed in capture order, and `arm` comes once before the first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, InvalidRequestError, WaitTimeout, WouldBlock
from .interrupts import Completion

if TYPE_CHECKING:
    from .runtime import Runtime


@dataclass(frozen=True)
class _Post:
    tag: int
    seq_out: Any  # [1] int64 device tensor the captured publish stores its seq into


class RecallGraph:
    """The recalls captured into one CUDA graph (see the module doc). Made by `Runtime.recall_graph()`."""

    def __init__(self, runtime: Runtime, torch: Any) -> None:
        self._runtime = runtime
        self._torch = torch
        self._posts: list[_Post] = []

    @property
    def num_posts(self) -> int:
        """Requests each replay publishes."""
        return len(self._posts)

    def post(self, *, host_ids: Any, device_slots: Any, count: Any = None, tag: int = 0, stream: Any = None,
             wait: bool = True) -> int:
        """Capture, on `stream` (default: current, which must be capturing a CUDA graph), the publish of
        host_ids[:count] -> device_slots[:count] and (`wait`) a device wait for it; -> the post's index (the
        place of its Completion in `arm`'s list). Arguments as `Runtime.post_recall`; the tensors must stay
        alive (and in place) as long as the graph is replayed. Without `wait`, order later work after the
        data with `wait_device(index)`."""
        torch = self._torch
        stream = stream if stream is not None else torch.cuda.current_stream(self._runtime.backend.device)
        with torch.cuda.stream(stream):
            capturing = torch.cuda.is_current_stream_capturing()
        if not capturing:
            raise InvalidRequestError("RecallGraph.post records into a CUDA graph being captured on `stream`; "
                                      "outside a capture use Runtime.post_recall and device_wait")
        seq_out = torch.empty(1, dtype=torch.int64, device=self._runtime.backend.device)
        self._runtime._post_captured(host_ids, device_slots, count, tag, stream, seq_out, wait=wait)
        self._posts.append(_Post(tag, seq_out))
        return len(self._posts) - 1

    def wait_device(self, index: int, *, stream: Any = None) -> None:
        """Later work on `stream` (default: current) runs once post `index` of the replay in flight has landed:
        a one-thread wait kernel reading the seq that post's publish stored, launched now (after the replayed
        publish, in stream order), or captured if `stream` is capturing. The replay was armed, so the
        watchdog releases this wait, failing the request, if it does not land in time."""
        if not 0 <= index < len(self._posts):
            raise InvalidRequestError(f"post index {index} is not one of this RecallGraph's {len(self._posts)} posts")
        self._runtime._wait_captured(self._posts[index].seq_out, stream)

    def arm_nowait(self, *, stream: Any = None) -> list[Completion]:
        """Before a replay on `stream` (default: current): one Completion per captured post, in post order.
        Raises WouldBlock when the ring or the outstanding requests have no room for them all."""
        if not self._posts:
            raise InvalidRequestError("this RecallGraph has captured no post; capture RecallGraph.post first")
        return self._runtime._arm_replay([p.tag for p in self._posts], stream)

    def arm(self, *, stream: Any = None, timeout: float | None = None) -> list[Completion]:
        """`arm_nowait`, waiting (GIL released) while the ring or the outstanding requests are full, as a host
        far ahead of the device does; raises WaitTimeout after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self.arm_nowait(stream=stream)
            except WouldBlock as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"no room to arm {len(self._posts)} recalls within {timeout} s: {exc}") from exc
                time.sleep(20e-6)


def check_capturable(runtime: Runtime) -> None:
    """A RecallGraph needs a device that waits on the device and resident copiers (RESIDENT requests)."""
    if not runtime._publisher.waits_on_device:
        raise ConfigError("a RecallGraph needs a CUDA device: the host backend has no graphs to capture into")
    if not runtime._resident:
        raise ConfigError("a RecallGraph needs RESIDENT requests (a resident copier on every I/O worker): every "
                          "other route needs host driver calls after the publish, which a replay cannot make")
