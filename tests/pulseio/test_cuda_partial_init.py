"""The CUDA routes' parts that fail to build free what was built before them (pinned memory, streams, rings)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.needs_package("cuda.bindings")   # pulseio._cuda imports it


class _Pinned:
    def __init__(self, closed: list[int], index: int) -> None:
        self._closed, self._index = closed, index

    def close(self) -> None:
        self._closed.append(self._index)


class _Backend:
    """alloc_host hands out buffers that record their close, and fails at call `fail_at`."""

    device = None

    def __init__(self, fail_at: int) -> None:
        self.closed: list[int] = []
        self._calls, self._fail_at = 0, fail_at

    def alloc_host(self, nbytes: int, *, label: str) -> _Pinned:
        self._calls += 1
        if self._calls == self._fail_at:
            raise MemoryError(f"cannot pin {nbytes} bytes for the {label}")
        return _Pinned(self.closed, self._calls)


def test_a_buffer_ring_that_cannot_pin_every_buffer_frees_those_it_pinned() -> None:
    from pulseio._cuda.buffers import BufferRing

    backend = _Backend(fail_at=3)
    with pytest.raises(MemoryError, match="cannot pin 64 bytes for the staging"):
        BufferRing(backend, 4, 64, False, "staging", lambda: False)  # type: ignore[arg-type]
    assert backend.closed == [1, 2]


def test_a_buffer_ring_that_pins_every_buffer_keeps_them() -> None:
    from pulseio._cuda.buffers import BufferRing

    backend = _Backend(fail_at=0)
    ring = BufferRing(backend, 3, 64, False, "ids", lambda: False)  # type: ignore[arg-type]
    assert backend.closed == [] and len(ring.pinned) == 3
    ring.close()
    assert backend.closed == [1, 2, 3]


def _spy(monkeypatch: pytest.MonkeyPatch, owner: type, name: str, calls: list[str], label: str) -> None:
    original = getattr(owner, name)

    def spy(self, *args, **kwargs):  # noqa: ANN001, ANN202
        calls.append(label)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, spy)


def _watched_pools(monkeypatch: pytest.MonkeyPatch, ring: type):  # noqa: ANN202
    """(backend, host pool, device pool, calls): each close of a `ring` and each stream destroyed appends to calls."""
    import pulseio
    from pulseio._cuda.driver import OwnStream

    backend = pulseio.open_backend("cuda")
    calls: list[str] = []
    _spy(monkeypatch, ring, "close", calls, "ring")
    _spy(monkeypatch, OwnStream, "destroy", calls, "stream")
    return backend, pulseio.HostPool(backend, 64, 4096), pulseio.DevicePool(backend, 16, 4096), calls


def _fail(message: str):  # noqa: ANN202
    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError(message)

    return broken


@pytest.mark.gpu
def test_routes_whose_copier_fails_free_their_rings_and_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    import pulseio
    from pulseio._cuda import backend as cuda_backend
    from pulseio._cuda.buffers import BufferRing

    backend, host, device, calls = _watched_pools(monkeypatch, BufferRing)
    monkeypatch.setattr(cuda_backend, "ResidentCopier", _fail("no resident copier here"))
    with pytest.raises(RuntimeError, match="no resident copier here"):
        backend.open_routes(host, device, pulseio.DmaConfig(), lambda: False)
    assert calls == ["ring", "ring", "stream"], "the id ring, the staging ring, then the stream, in reverse order"


@pytest.mark.gpu
def test_a_copier_whose_warm_up_fails_frees_its_ring_and_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    from pulseio._cuda import resident
    from pulseio._cuda.launch import BlockArray
    from pulseio._resident import TaskRing

    backend, host, device, calls = _watched_pools(monkeypatch, TaskRing)
    monkeypatch.setattr(resident.ResidentCopier, "_warm_up", _fail("the warm-up launch failed"))
    with pytest.raises(RuntimeError, match="the warm-up launch failed"):
        resident.ResidentCopier(backend, BlockArray(host.device_ptr, host.num_blocks, 4096),
                                BlockArray(device.device_ptr, device.num_slots, 4096), ctas=4, slots=4, cap=16,
                                idle_us=100)
    assert calls == ["stream", "ring"]


class _Driver:
    """driver.host_register / host_unregister / set_current, recorded, on a machine with no GPU."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from pulseio._cuda import driver

        self.registered: list[int] = []
        self.unregistered: list[int] = []
        monkeypatch.setattr(driver, "host_register", self._register)
        monkeypatch.setattr(driver, "host_unregister", self.unregistered.append)
        monkeypatch.setattr(driver, "set_current", lambda context: None)

    def _register(self, ptr: int, nbytes: int) -> int:
        self.registered.append(ptr)
        return ptr


def test_a_pinned_buffer_collected_without_close_is_unpinned(monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    import gc

    from pulseio._cuda.hostmem import PinnedBuffer

    driver = _Driver(monkeypatch)
    buffer = PinnedBuffer(3 << 12, context=None, chunk_bytes=1 << 12, label="test pool")
    assert len(driver.registered) == 3 and driver.unregistered == []
    del buffer
    gc.collect()
    assert sorted(driver.unregistered) == sorted(driver.registered), "every chunk unpinned before its memory is freed"
    assert "the test pool was collected without close" in caplog.text, "its owner's missing close is said"


def test_a_closed_pinned_buffer_is_unpinned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from pulseio._cuda.hostmem import PinnedBuffer

    driver = _Driver(monkeypatch)
    buffer = PinnedBuffer(2 << 12, context=None, chunk_bytes=1 << 12)
    buffer.close()
    assert sorted(driver.unregistered) == sorted(driver.registered)
    del buffer
    gc.collect()
    assert len(driver.unregistered) == 2


@pytest.mark.gpu
def test_pinned_buffers_dropped_without_close_leave_their_memory_pinnable() -> None:
    import gc

    import pulseio

    backend = pulseio.open_backend("cuda")
    places = set()
    for _ in range(6):  # the allocator hands the same memory back: pinning it again must not find it registered
        buffer = backend.alloc_host(4 << 20, label="dropped buffer")
        places.add(buffer.host_ptr)
        del buffer
        gc.collect()
    if len(places) == 6:
        pytest.skip("the allocator never placed a buffer where a dropped one was: nothing was re-pinned")
