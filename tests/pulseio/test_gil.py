"""`pulseio.gil_switch_interval`: the interpreter's switch interval inside the block, the one before after it."""

from __future__ import annotations

import sys

import pytest

import pulseio


def test_the_interval_holds_inside_the_block_and_the_one_before_comes_back_even_after_an_error() -> None:
    before = sys.getswitchinterval()
    with pulseio.gil_switch_interval(2e-4):
        assert sys.getswitchinterval() == pytest.approx(2e-4, abs=2e-6)
        with pulseio.gil_switch_interval(5e-5):                    # nested: each block restores its own
            assert sys.getswitchinterval() == pytest.approx(5e-5, abs=2e-6)
        assert sys.getswitchinterval() == pytest.approx(2e-4, abs=2e-6)
    assert sys.getswitchinterval() == before
    with pytest.raises(KeyError), pulseio.gil_switch_interval(3e-4):
        raise KeyError("inside")
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize("bad", [0, -1e-4, 2.0, True, "1e-4", None])
def test_an_interval_outside_zero_to_one_second_is_refused_before_anything_changes(bad: object) -> None:
    before = sys.getswitchinterval()
    with pytest.raises(ValueError, match=r"^gil_switch_interval takes seconds in \(0, 1\], got "), \
            pulseio.gil_switch_interval(bad):                      # type: ignore[arg-type]
        pass
    assert sys.getswitchinterval() == before
