"""The GPU publish kernel under numba's CUDA simulator (a subprocess: the simulator must be chosen
before numba.cuda is imported); the CPU reader must decode exactly what the kernel wrote, and the
device mirror must hold the same ids, and its heads which request each row holds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.needs_package("cuda.bindings")   # the kernels' modules import pulseio._cuda.driver

SCRIPT = textwrap.dedent("""
    import numpy as np
    from pulseio.testing import ManualDoorbell
    from pulseio._cuda.doorbell_kernels import publish_kernel
    from pulseio._native.layout import HEAD_WORDS

    bell = ManualDoorbell(capacity=8, max_blocks=64)
    ring = bell.words.reshape(bell.layout.capacity, bell.layout.slot_words)  # the kernel's [capacity, slot_words] view
    counter = np.zeros(1, dtype=np.int64)
    ids = np.arange(100, 140, dtype=np.int64)
    slots = np.arange(40, dtype=np.int64)[::-1].copy()
    count = np.array([37], dtype=np.int64)
    mirror = np.full((2, 2 * bell.layout.blocks_per_slot), -1, dtype=np.int64)  # rows by seq: 1 -> 0, 2 -> 1, 3 -> 0
    heads = np.zeros((2, HEAD_WORDS), dtype=np.int64)  # (seq, count, early copies counted, landed seq, its time)
    none = np.zeros(0, dtype=np.int64)                      # no seq_out
    seq_out = np.zeros(1, dtype=np.int64)
    publish_kernel[1, 32](ring, counter, mirror, heads, ids, slots, count, -1, 7, none)   # count chosen "on the device"
    assert heads.tolist() == [[1, 37, 0, 0, 0], [0, 0, 0, 0, 0]]
    heads[0, 2:4] = 5, 1                                    # copy CTAs counted request 1's parts, and it landed
    publish_kernel[1, 32](ring, counter, mirror, heads, ids, slots, count, 3, 8, seq_out)  # count passed by the host
    assert seq_out[0] == 2, "the publish stores the seq it took where a captured device wait reads it"
    half = bell.layout.blocks_per_slot
    assert mirror[0, :37].tolist() == ids[:37].tolist() and mirror[0, half:half + 37].tolist() == slots[:37].tolist()
    assert mirror[1, :4].tolist() == [100, 101, 102, -1] and mirror[1, half:half + 3].tolist() == [39, 38, 37]
    publish_kernel[1, 32](ring, counter, mirror, heads, ids, slots, count, 69, 9, none)   # more than a slot holds (68)
    assert heads.tolist() == [[3, -1, 0, 1, 0], [2, 3, 0, 0, 0]], "a bad count: no ids in the row, and the heads say so"
    # (request 3 took row 0: its early copies are counted from zero; the landed seq stays request 1's)
    no_mirror = np.zeros((0, 2 * half), np.int64)
    publish_kernel[1, 32](ring, counter, no_mirror, np.zeros((0, 4), np.int64), ids, slots, count, 2, 10, none)
    publish_kernel[1, 32](ring, counter, mirror, heads, ids, slots, count, 0, 11, none)     # seq 5, row 0: no blocks
    assert heads[0].tolist() == [5, 0, 0, 5, 0], "nothing to copy: landed on the device as it is published"
    publish_kernel[1, 32](ring, counter, mirror, heads, ids, slots, count, 1, 12, none)     # seq 6, row 1: one block
    assert heads[1].tolist() == [6, 1, 0, 0, 0], "a request with blocks lands when its copies do"
    first, second, third, fourth, fifth, sixth = bell.poll_nowait()
    assert fourth.host_ids.tolist() == [100, 101] and fifth.host_ids.tolist() == [] and fifth.error is None
    assert (first.seq, first.tag, first.error) == (1, 7, None), first
    assert first.host_ids.tolist() == list(range(100, 137)) and first.device_slots.tolist() == list(range(39, 2, -1))
    assert (second.seq, second.tag, second.host_ids.tolist()) == (2, 8, [100, 101, 102])
    assert third.error is not None and "asked for 69 blocks" in third.error
    assert bell.layout.blocks_per_slot == 68
    assert first.published_ns > 0 and counter[0] == 6
    print("SIM-OK")
""")


def test_publish_kernel_under_the_simulator() -> None:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "SIM-OK" in result.stdout, result.stdout + result.stderr


WAIT_SCRIPT = textwrap.dedent("""
    import threading, time
    import numpy as np
    from pulseio._cuda.wait_kernel import compile_wait_word

    wait_word = compile_wait_word()
    word = np.zeros(1, dtype=np.int64)
    address = word.ctypes.data
    word[0] = 5
    t0 = time.perf_counter()
    wait_word[1, 32](address, 5)                  # reached: returns at once
    wait_word[1, 32](address, 3)
    assert time.perf_counter() - t0 < 2.0
    late = threading.Timer(0.3, lambda: word.__setitem__(0, 9))
    late.start()
    t0 = time.perf_counter()
    wait_word[1, 32](address, 9)                  # holds until a writer stores the value
    assert time.perf_counter() - t0 >= 0.25 and word[0] == 9
    word[0] = 1 << 62                             # the Runtime's RELEASED: every wait lets go (cyclic compare)
    wait_word[1, 32](address, 12)

    from pulseio._cuda.wait_kernel import compile_wait_seq
    from pulseio._native.layout import HEAD_WORDS
    wait_seq = compile_wait_seq()                 # the seq read on the device: words[(seq - 1) % 4]
    words, cell = np.zeros(4, dtype=np.int64), np.array([6], dtype=np.int64)
    words[:] = [5, 0, 7, 8]                       # only word 1 (seq 6's) is short of its seq
    late = threading.Timer(0.3, lambda: words.__setitem__(1, 6))
    late.start()
    t0 = time.perf_counter()
    wait_seq[1, 32](cell.ctypes.data, words.ctypes.data, 4, 0, 0)
    assert time.perf_counter() - t0 >= 0.25 and words[1] == 6
    # with an ids mirror of 3 rows: the wait for seq 8 (word 3, row 1) also ends when row 1 says seq 8 landed early,
    # its word never raised; another seq's landing in the row does not end it
    cell[0], words[3] = 8, 4
    heads = np.zeros((3, HEAD_WORDS), dtype=np.int64)
    heads[1, 3] = 5
    late = threading.Timer(0.3, lambda: heads.__setitem__((1, 3), 8))
    late.start()
    t0 = time.perf_counter()
    wait_seq[1, 32](cell.ctypes.data, words.ctypes.data, 4, heads.ctypes.data, 3)
    assert time.perf_counter() - t0 >= 0.25 and heads[1, 3] == 8 and words[3] == 4
    # ... and still ends on its word, the row never saying it landed early (a request its task landed)
    cell[0], words[2] = 7, 3                      # seq 7: word 2, row 0, whose head holds no landing
    late = threading.Timer(0.3, lambda: words.__setitem__(2, 7))
    late.start()
    t0 = time.perf_counter()
    wait_seq[1, 32](cell.ctypes.data, words.ctypes.data, 4, heads.ctypes.data, 3)
    assert time.perf_counter() - t0 >= 0.25 and words[2] == 7 and heads[0, 3] == 0
    print("SIM-OK")
""")


def test_wait_kernel_holds_until_the_word_reaches_the_value_under_the_simulator() -> None:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", WAIT_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "SIM-OK" in result.stdout, result.stdout + result.stderr
