"""The seam below which hardware lives: what a backend allocates and how its routes move blocks.

Two backends implement it: `HostBackend` (threads copy between host regions; every machine) and
the CUDA backend in `pulseio._cuda` (pinned host pool, copy engine, numba kernels).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch

from .plan import Strategy, TransferPlan

if TYPE_CHECKING:
    from .config import DmaConfig
    from .doorbell import Doorbell
    from .memory import DevicePool, HostPool


class HostMemory(Protocol):
    tensor: torch.Tensor  # [nbytes] uint8, host
    device_ptr: int  # the address a kernel uses for it (UVA); 0 where no device can address it
    segment_bytes: int  # pinned in segments of this size (the last may be shorter): one DMA must not span two

    def close(self) -> None: ...


class Pending(NamedTuple):
    """Work a route left running: wait for `event`, then run `then` (host-side finishing work) if any."""

    event: Any
    then: Callable[[], None] | None = None


class RouteSet(Protocol):
    """The strategies one backend offers over one (host pool, device pool) pair."""

    available: frozenset[Strategy]
    inline: frozenset[Strategy]  # strategies cheap enough to issue on the submitting thread
    posted: frozenset[Strategy]  # strategies whose unordered issue is a thread-safe post with no driver call
    raises_on_device: frozenset[Strategy]  # strategies whose copier sets the `raise_on_landed` word itself
    resident: Any  # the RESIDENT route's copier (its `forwarder` is the doorbell's fast lane), or None

    def record_after(self) -> Any:
        """On the submitting thread: a token for 'work already enqueued on the current stream'."""

    def issue(
        self, strategy: Strategy, plans: Sequence[TransferPlan], after: Sequence[Any],
        emit: Callable[[Pending], None], raise_on_landed: tuple[int, int] | None = None,
        posted_task: int | None = None,
    ) -> None:
        """On the worker thread: enqueue (or, on the host backend, do) the copies of `plans`.

        raise_on_landed: (address of an int64 the copier can store to, value), for strategies in
        `raises_on_device`: the copier stores value there once every plan has landed.
        posted_task: the one plan was already posted as this RESIDENT task (the doorbell's fast lane).

        Each piece left running is handed to `emit` as soon as it is enqueued, so its staging
        buffer can be recycled while later pieces of the same transfer still wait for one. The
        last emitted event is the one a consumer stream waits on.
        """

    def bind_thread(self) -> None:
        """Prepare the calling thread for driver calls (device, context, capture mode); once per thread."""

    def synchronize(self, event: Any) -> None:
        """Wait, GIL released, until `event` has completed."""

    def query(self, event: Any) -> bool:
        """Whether `event` has completed. Never waits."""

    def close(self) -> None: ...


class Backend(Protocol):
    """What a backend provides: host and device allocations and the routes that move blocks."""

    name: str
    device: torch.device  # where DevicePool slots live

    def alloc_host(self, nbytes: int, *, label: str, unit_bytes: int = 1) -> HostMemory:
        """nbytes of host memory the device can reach; its segments are whole multiples of unit_bytes."""

    def alloc_device(self, nbytes: int, *, label: str) -> torch.Tensor: ...

    def open_routes(
        self, host: HostPool, device: DevicePool, config: DmaConfig, reclaim: Callable[[], bool]
    ) -> RouteSet:
        """reclaim(): finish the oldest piece in flight, giving its buffers back (blocks); False when
        nothing is in flight. Routes call it when every staging buffer is taken."""

    def open_publisher(self, doorbell: Doorbell, ids_mirror_rows: int = 0) -> Publisher:
        """The producer side of a doorbell ring: the publish kernel on a GPU, a thread on the host.
        ids_mirror_rows > 0 (a GPU): it also writes each request's ids into row (seq - 1) % rows of a
        device tensor, `ids_mirror`, and the row's head into `mirror_heads`, for a resident copier to read there
        (and to mark the request landed there once its copy CTAs copied all of it early)."""


class Publisher(Protocol):
    """Publishes doorbell requests in post order, and makes streams wait on request wait words."""

    waits_on_device: bool  # False: device waits are host waits (no device)
    ids_mirror: Any  # [rows, 2 * max_blocks] int64 device tensor of the requests' ids, or None
    mirror_heads: Any  # [rows, HEAD_WORDS] int64 device tensor: each mirror row's head (`layout.HEAD_*`), or None

    def post(self, ids: Any, slots: Any, count: Any, tag: int, stream: Any, seq_out: Any = None) -> None:
        """Enqueue the publish of ids[:count] -> slots[:count]; never waits. seq_out: where the publish stores
        the seq it took (a [1] int64 device tensor), for `wait_seq`; None: nowhere."""

    def check_ids(self, name: str, ids: Any) -> None:
        """Refuse ids the producer cannot publish where they lie (InvalidRequestError naming `name`)."""

    def wait_word(self, stream: Any, address: int, value: int) -> None:
        """Enqueue on `stream`: wait until the int64 at `address` reaches value (where waits_on_device)."""

    def wait_seq(self, stream: Any, seq_at: int, words_base: int, words: int) -> None:
        """Enqueue on `stream` (which may be capturing a CUDA graph): wait for the wait word of the request whose
        seq an earlier publish stored at `seq_at` (where waits_on_device)."""

    def drain_sync(self, timeout: float) -> bool:
        """Wait up to `timeout` s until every publish posted has run; False if not."""

    def close(self) -> None: ...
