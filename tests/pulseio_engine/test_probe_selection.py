"""benchmarks/probe_selection.py's intervention: the wrapped selector hands every KV head of a shared layer
one head's selection and leaves other layers (and SoloHead's single row) alone."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import torch

from pulseio_engine.evaluation.run import EvalMode
from pulseio_engine.offload import OffloadBatch


def _probe_module():
    path = Path(__file__).parents[2] / "benchmarks" / "probe_selection.py"
    spec = importlib.util.spec_from_file_location("probe_selection", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shared_layers_use_the_named_heads_selection_and_others_their_own(monkeypatch):
    monkeypatch.setattr(OffloadBatch, "attend", OffloadBatch.attend)     # the probe patches it; restored after
    probe_selection = _probe_module()
    per_head = torch.arange(2 * 3 * 4).view(2, 3, 4)                        # [B, S=3, K]
    engine = SimpleNamespace(offloader=SimpleNamespace(selector=lambda layer, q, *rest: per_head))
    probe = probe_selection.Probe(heads=None, mode=EvalMode.QUEST, share={5: 2})
    probe.attach(engine)
    shared = engine.offloader.selector(5, None)
    assert torch.equal(shared, per_head[:, 2:3].expand(-1, 3, -1))
    assert torch.equal(engine.offloader.selector(4, None), per_head)
    solo = torch.arange(4).view(1, 1, 4)                                    # SoloHead: one row, untouched
    engine = SimpleNamespace(offloader=SimpleNamespace(selector=lambda layer, q, *rest: solo))
    probe.attach(engine)
    assert torch.equal(engine.offloader.selector(5, None), solo)
