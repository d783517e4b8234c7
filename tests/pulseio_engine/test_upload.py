"""`to_device_nowait`: host tensors reach the device in stream order without the host waiting for the GPU."""

from __future__ import annotations

import pytest
import torch

from pulseio_engine.upload import to_device_nowait


def test_on_a_cpu_the_tensor_is_the_hosts() -> None:
    host = torch.arange(7, dtype=torch.int64)
    assert to_device_nowait(host, torch.device("cpu")) is host


@pytest.mark.gpu
def test_the_copy_never_syncs_and_lands_in_stream_order() -> None:
    dev = torch.device("cuda")
    host = torch.arange(1 << 16, dtype=torch.int64)
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)                             # the stream busy: a blocking copy would wait for it
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = to_device_nowait(host, dev)
        with pytest.raises(RuntimeError, match="synchroniz"):   # what a plain copy from pageable memory does
            host.to(dev)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    host.zero_()                                              # the staging copy, not `host`, is what goes over
    assert torch.equal(out.cpu(), torch.arange(1 << 16, dtype=torch.int64))
