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


def test_the_transformers_integration_documents_its_public_names() -> None:
    integration = pytest.importorskip("pulseio.integrations.transformers")
    undocumented = [name for name, obj in _public(integration)
                    if not (obj.__doc__ or "").strip() or (obj.__doc__ or "").strip().startswith(f"{name}(")]
    assert undocumented == []
