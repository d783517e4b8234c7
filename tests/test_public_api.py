"""Every public name of both packages is exported from its __init__ and says what it is."""

from __future__ import annotations

import inspect

import pytest

import pulseio
import pulseio_engine


def _public(module):
    for name in dir(module):
        obj = getattr(module, name)
        if name.startswith("_") or inspect.ismodule(obj) or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        yield name, obj


@pytest.mark.parametrize("module", [pulseio, pulseio_engine], ids=lambda m: m.__name__)
def test_public_names_are_documented(module) -> None:
    undocumented = []
    for name, obj in _public(module):
        doc = (obj.__doc__ or "").strip()
        if not doc or doc.startswith(f"{name}("):  # empty, or the dataclass default signature
            undocumented.append(name)
    assert undocumented == []


def test_pulseio_public_api_lives_in_the_package() -> None:
    for name, obj in _public(pulseio):
        assert obj.__module__.startswith("pulseio."), f"{name} comes from {obj.__module__}"
        assert "_cuda" not in obj.__module__, f"{name} exposes the private CUDA layer"


# What a reader of `help(X)` must find in X's own docstring, without a module doc or the README.
STANDALONE = {
    pulseio.HostPool: ["backend", "num_blocks", "block_bytes", "open_backend", "InsufficientMemoryError", "close()"],
    pulseio.DevicePool: ["backend", "num_slots", "block_bytes", "slots", "close()"],
    pulseio.Handle: ["done()", "wait(timeout", "exception()", "await handle", "device_wait(stream)",
                     "add_done_callback", "WaitTimeout", "Transfer", "Completion"],
    pulseio.AutoPolicy: ["Strategy.AUTO", "from_records", "pulseio bench", "DmaConfig(auto=policy)",
                         "RuntimeConfig(dma=", "fallback"],
    pulseio.DmaEngine: ["host, device", "config", "recall(host_ids=", "offload(device_slots=", "submit(plan)",
                        "_nowait", "WouldBlock", "statistics()", "close()"],
}


@pytest.mark.parametrize("cls", list(STANDALONE), ids=lambda c: c.__name__)
def test_the_core_types_document_themselves(cls: type) -> None:
    doc = inspect.getdoc(cls) or ""
    assert "module doc" not in doc and "see the module" not in doc, f"{cls.__name__} sends the reader elsewhere"
    missing = [word for word in STANDALONE[cls] if word not in doc]
    assert missing == [], f"help({cls.__name__}) does not say {missing}"


def test_the_auto_policy_docstring_example_runs(tmp_path) -> None:  # noqa: ANN001
    """The AutoPolicy docstring's lines, a bench record standing in for results/bench.json: AUTO follows it."""
    import json

    import numpy as np

    record = {"kind": "recall", "strategy": "gather_dma", "direction": "h2d", "block_bytes": 64, "num_blocks": 4,
              "gbps": 1.0}
    policy = pulseio.AutoPolicy.from_records(json.loads(json.dumps({"records": [record]}))["records"])
    backend = pulseio.open_backend("cpu")
    host, device = pulseio.HostPool(backend, 16, 64), pulseio.DevicePool(backend, 4, 64)
    with pulseio.DmaEngine(host, device, pulseio.DmaConfig(auto=policy)) as dma:
        host.blocks[3] = 9
        t = dma.recall(host_ids=np.array([3]), device_slots=np.array([1])).wait()
        assert int(device.slots[1, 0]) == 9
        assert dma.statistics().by_strategy == {pulseio.Strategy.GATHER_DMA: 1}, t   # the fallback: ZERO_COPY


def test_the_transformers_integration_documents_its_public_names() -> None:
    integration = pytest.importorskip("pulseio.integrations.transformers")
    undocumented = [name for name, obj in _public(integration)
                    if not (obj.__doc__ or "").strip() or (obj.__doc__ or "").strip().startswith(f"{name}(")]
    assert undocumented == []
