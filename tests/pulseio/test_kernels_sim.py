"""The numba copy_blocks kernel, run on the CPU by numba's CUDA simulator (in a subprocess, because
NUMBA_ENABLE_CUDASIM must be set before numba.cuda is imported)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numba")

_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from numba import cuda
    from pulseio._cuda.kernels import compile_copy_blocks

    kernel = compile_copy_blocks()
    rng = np.random.default_rng(7)
    # words per block: a multiple of threads*unroll, a remainder-only size, and a mixed one; spans of
    # unequal length, CTAs with none (n < grid), and spans longer than one round of staged ids
    # (blocks that do not divide evenly over the CTAs, each block then copied in `grid` parts, a CTA's run of parts
    # crossing into the next block: parts of a word or of none; and an even split, whole blocks)
    for words, n, grid, threads in [(2048, 9, 4, 256), (24, 5, 2, 256), (2048 + 40, 3, 2, 256), (2, 600, 2, 32),
                                    (256 + 7, 3, 2, 32), (40, 1, 16, 32), (5, 2, 8, 32), (1024, 3, 8, 256),
                                    (1000, 19, 16, 32), (64, 8, 4, 32), (7, 3, 4, 32)]:
        src = rng.integers(0, 2**63, size=(n + 7, words), dtype=np.uint64)
        dst = np.full((n + 3, words), 0xDEADBEEF, dtype=np.uint64)
        src_ids = rng.choice(n + 7, size=n, replace=False).astype(np.int64)
        dst_ids = rng.choice(n + 3, size=n, replace=False).astype(np.int64)
        untouched = np.setdiff1d(np.arange(n + 3), dst_ids)
        kernel[grid, threads](src, src_ids, dst, dst_ids, n)
        assert np.array_equal(dst[dst_ids], src[src_ids]), (words, n, grid)
        assert (dst[untouched] == 0xDEADBEEF).all(), "rows outside dst_ids were written"
    print("SIM-OK")
    """
)


def _run_simulated(script: str) -> None:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SIM-OK" in result.stdout


@pytest.mark.slow
def test_copy_blocks_kernel_under_simulator() -> None:
    _run_simulated(_SCRIPT)


_RESIDENT_SCRIPT = """
import threading, time
import numpy as np
from numba import cuda
from pulseio._cuda import resident_kernel as rk
from pulseio._native import task_ring as tr
from pulseio._native.layout import HEAD_WORDS

kernel = rk.compile_resident_copy()
rng = np.random.default_rng(3)
words, H, D, slots, cap = 40, 32, 24, 4, 8
host = rng.integers(0, 2**63, size=(H, words), dtype=np.uint64)
pool = np.full((D, words), 0xDEAD, dtype=np.uint64)
ids = np.zeros((slots, 2 * cap), dtype=np.int64)
mirror = np.full((3, 2 * cap), -1, dtype=np.int64)  # a publisher's device copy of doorbell ids, by row
ctrl = np.zeros(tr.CTRL_WORDS, np.int64)
entries = np.zeros((slots, tr.ENTRY_WORDS), np.int64)
target = np.zeros(1, np.int64)  # a consumer's device word that task 3 raises
done = np.zeros(slots, np.int64)
dev = np.zeros(rk.dev_words(slots, 1), np.int64)
dev[rk.DEV_START : rk.DEV_START + 2] = 1
start = lambda gen: dev[rk.DEV_START + gen % 2]  # where generation gen starts
addr = lambda a: a.ctypes.data

def post(seq, h, p, direction, raise_to=0, row=-1):
    slot = (seq - 1) % slots
    where, at = (ids[slot], cap) if row < 0 else (mirror[row], cap)
    where[: len(h)] = h
    where[at : at + len(p)] = p
    entries[slot, tr.ENTRY_RAISE_AT] = addr(target) if raise_to else 0
    entries[slot, tr.ENTRY_RAISE_TO] = raise_to
    entries[slot, tr.ENTRY_TASK] = tr.pack_entry(seq, len(h), direction, row)
    ctrl[tr.CTRL_PROMISED] = seq

holds = np.zeros((rk.HOLD_GENS, 2), np.int64)  # every generation's hold, by generation

heads = np.zeros((3, HEAD_WORDS), np.int64)  # the mirror rows' heads (seq, count, early, landed, its time)

def launch(gen, idle_ms=5, grid=2, hold_at=0, hold_to=0):
    kernel[grid, 32](host, pool, ids, mirror, addr(ctrl), addr(entries), addr(done), addr(dev), gen, int(idle_ms * 1e6),
                     hold_at, hold_to, addr(holds), addr(heads))

h1, h3 = rng.choice(H, 5, replace=False), rng.choice(H, 8, replace=False)
p1, p3 = np.split(rng.choice(D, 13, replace=False), [5])  # tasks in flight together write disjoint slots
post(1, h1, p1, tr.H2D); post(2, [], [], tr.H2D); post(3, h3, p3, tr.H2D, raise_to=33)
launch(1)  # the leader, then one copy CTA: the simulator runs CTAs one after another, so the leader
# forwards and stops before the copy CTA serves what it forwarded
assert np.array_equal(pool[p3], host[h3]) and np.array_equal(pool[p1], host[h1])
assert list(done) == [1, 2, 3, 0], done
assert dev[rk.DEV_WATERMARK] == 3 and start(2) == 4 and dev[rk.DEV_EXIT] == 1 and ctrl[tr.CTRL_STOPPED] == 1
assert (dev[rk.DEV_HEADER + slots : rk.DEV_HEADER + 2 * slots] == 0).all()  # the CTA counts are reset
assert dev[rk.DEV_HEADER + 2 * slots + 2 * 2 + 1] == 33  # task 3's raise target, copied to the device
assert target[0] == 33 and (entries[:3, tr.ENTRY_LANDED_NS] > 0).all() and entries[3, tr.ENTRY_LANDED_NS] == 0
taken = entries[:, tr.ENTRY_TAKEN_NS]
assert (taken[:3] > 0).all() and (taken[:3] <= entries[:3, tr.ENTRY_LANDED_NS]).all() and taken[3] == 0
# gen 2: an offload (pool -> host) and a recall that reuses slot 0, its ids in row 2 of the mirror
h4, p4 = np.array([30, 31, 29]), np.array([p3[0], p3[1], p3[2]])
post(4, h4, p4, tr.D2H)
h5, p5 = np.array([0, 1]), np.array([20, 21])
post(5, h5, p5, tr.H2D, row=2)
assert ids[0, 0] == h1[0]  # slot 0 still holds task 1's ids: task 5 must read the mirror
expect4 = pool[p4].copy()
launch(2)
assert np.array_equal(host[h4], expect4) and np.array_equal(pool[p5], host[h5])
assert list(done) == [5, 2, 3, 4], done
assert dev[rk.DEV_WATERMARK] == 5 and start(3) == 6 and ctrl[tr.CTRL_STOPPED] == 2
# a promise keeps an idle kernel serving until the post lands
# (the simulator hands the kernel a copy of each array argument: ids are written before the launch,
# only the entry word, read by address, arrives late)
ids[1, 0], ids[1, cap] = 5, 6
ctrl[tr.CTRL_PROMISED] = 6
late = threading.Timer(0.3, lambda: entries.__setitem__((1, tr.ENTRY_TASK), tr.pack_entry(6, 1, tr.H2D)))
late.start()
t0 = time.perf_counter()
launch(3, idle_ms=1)
late.join()
assert done[1] == 6 and np.array_equal(pool[6], host[5]) and time.perf_counter() - t0 >= 0.25
assert start(4) == 7
# a generation launched for a device wait stays up, idle, until the wait's word reaches its value
word = np.zeros(1, np.int64)
late = threading.Timer(0.3, lambda: word.__setitem__(0, 9))
late.start()
t0 = time.perf_counter()
launch(4, idle_ms=1, hold_at=addr(word), hold_to=9)
late.join()
assert time.perf_counter() - t0 >= 0.25 and dev[rk.DEV_EXIT] == 4 and start(5) == 7
# a later generation launched whose request has not landed (its publish may be queued behind work that
# waits for us): this one stops after idle_ns as usual, not before
ctrl[tr.CTRL_LAUNCHED] = 6
holds[6] = addr(word), 10
t0 = time.perf_counter()
launch(5, idle_ms=300)
assert time.perf_counter() - t0 >= 0.25 and dev[rk.DEV_EXIT] == 5 and ctrl[tr.CTRL_STOPPED] == 5
# ... and once that request has landed (this one served it), it stops at once, a promise included: the
# promised task is the later generation's to serve
word[0] = 10
ctrl[tr.CTRL_LAUNCHED] = 7
holds[7] = addr(word), 10
ctrl[tr.CTRL_PROMISED] = 7
t0 = time.perf_counter()
launch(6, idle_ms=60_000)
assert time.perf_counter() - t0 < 30 and dev[rk.DEV_EXIT] == 6 and start(7) == 7 and ctrl[tr.CTRL_STOPPED] == 6
ids[2, 0], ids[2, cap] = 7, 8
entries[2, tr.ENTRY_TASK] = tr.pack_entry(7, 1, tr.H2D)
launch(7, idle_ms=1)
assert done[2] == 7 and np.array_equal(pool[8], host[7]) and start(8) == 8
# close: an idle kernel exits without waiting out idle_ns
ctrl[tr.CTRL_CLOSE] = 1
t0 = time.perf_counter()
launch(8, idle_ms=60_000)
assert time.perf_counter() - t0 < 30 and dev[rk.DEV_EXIT] == 8 and start(9) == 8
print("SIM-OK")
"""


@pytest.mark.slow
def test_resident_kernel_protocol_under_simulator() -> None:
    """The resident kernel's leader and one copy CTA. The simulator runs CTAs one after another, so the
    leader forwards and stops before the copy CTA starts: a copy CTA that starts after its leader
    stopped (on a GPU: one launched while the SMs were busy) still serves every task it forwarded. It
    serves posted tasks in order both ways, reuses ring slots, stops
    when idle with its state handed to the next generation, stays while a task is promised but not
    yet posted, stays for a device wait until its word is set, stops at once when idle once a later
    generation is launched whose request has landed (that one serves the promise) but not before that,
    and exits at once on close."""
    _run_simulated(_RESIDENT_SCRIPT)


_EARLY_SCRIPT = """
import threading, time
import numpy as np
from numba import cuda, int64
from pulseio._cuda import resident_kernel as rk
from pulseio._cuda.kernels import IDS_PER_ROUND
from pulseio._native import task_ring as tr
from pulseio._native.layout import HEAD_LANDED_NS, HEAD_WORDS

@cuda.jit
def copies_only(host, pool, ids, mirror, entries, done, dev, gen, heads, cta, ctas):  # copy CTA cta of ctas
    state = cuda.shared.array(rk.STATE_WORDS, int64)
    staged = cuda.shared.array((2, IDS_PER_ROUND), int64)
    rk._serve_copies(host, pool, ids, mirror, entries, done, dev, gen, heads, cta, ctas, state, staged)

rng = np.random.default_rng(5)
words, H, D, slots, cap = 40, 32, 24, 4, 8
host = rng.integers(0, 2**63, size=(H, words), dtype=np.uint64)
pool = np.full((D, words), 0xDEAD, dtype=np.uint64)
ids = np.zeros((slots, 2 * cap), dtype=np.int64)
mirror = np.full((3, 2 * cap), -1, dtype=np.int64)
heads = np.zeros((3, HEAD_WORDS), np.int64)
entries = np.zeros((slots, tr.ENTRY_WORDS), np.int64)
done = np.zeros(slots, np.int64)
dev = np.zeros(rk.dev_words(slots, 4), np.int64)
addr = lambda a: a.ctypes.data

def row(q, h, p):  # the publish kernel's mirror row (written before a launch: the simulator copies arrays)
    mirror[(q - 1) % 3, : len(h)] = h
    mirror[(q - 1) % 3, cap : cap + len(p)] = p

def publish(q, n):  # the publish kernel's last store: the row's head
    heads[(q - 1) % 3, :2] = -q, 0
    heads[(q - 1) % 3, 1] = n
    heads[(q - 1) % 3, 2] = 0
    heads[(q - 1) % 3, 0] = q

def forward(task, n, q):  # the leader's: a task naming request q's mirror row (its entry as the host posts it)
    entries[(task - 1) % slots, tr.ENTRY_EARLY_NS] = 0
    dev[rk.DEV_HEADER + (task - 1) % slots] = tr.pack_entry(task, n, tr.H2D, (q - 1) % 3)
    dev[rk.DEV_POSTED] = task

def run(gen, first_task, steps=((0.3, lambda: None),), ctas=1, cta=0):  # copy CTA cta of `gen`: steps, exit
    dev[rk.DEV_START + gen % 2] = first_task
    t0 = time.time_ns()
    def drive():
        for at, action in steps:
            time.sleep(max(0.0, at - (time.time_ns() - t0) / 1e9))
            action()
        dev[rk.DEV_EXIT] = gen
    driver = threading.Thread(target=drive)
    driver.start()
    copies_only[1, 32](host, pool, ids, mirror, addr(entries), addr(done), addr(dev), gen, addr(heads), cta, ctas)
    driver.join()
    return t0

# gen 1: request 1 is copied as soon as its head shows it (not while its row is being written), and its
# task then only lands it; request 2 names a block outside the host pool: not copied early, and the
# poller's fence (a task of no blocks naming its row) lands
h1, p1 = rng.choice(H, 5, replace=False), np.array([0, 1, 2, 3, 4])
row(1, h1, p1)
heads[0, :2] = -1, 0
row(2, [1, 99, 2], [10, 11, 12])
posted = {}
def post_task_1():
    posted[1] = time.time_ns()
    forward(1, 5, 1)
t0 = run(1, 1, [(0.3, lambda: publish(1, 5)), (0.8, post_task_1), (1.0, lambda: publish(2, 3)),
                (1.3, lambda: forward(2, 0, 2))])
assert np.array_equal(pool[p1], host[h1]) and list(done) == [1, 2, 0, 0], done
taken = entries[0, tr.ENTRY_TAKEN_NS]
assert t0 + 0.25e9 < taken < posted[1], (taken - t0, posted[1] - t0)  # began after the publish, before its task
assert (pool[10:13] == 0xDEAD).all(), "a request naming a block outside the pool is not copied early"
assert heads[0, 2:4].tolist() == [1, 1], "the one copy CTA copied request 1 early: landed on the device"
assert heads[1, 2:4].tolist() == [0, 0], "request 2 was not copied early: not landed on the device"
early = entries[0, tr.ENTRY_EARLY_NS]
assert early == heads[0, HEAD_LANDED_NS] and taken <= early < posted[1] <= entries[0, tr.ENTRY_LANDED_NS], \
    "task 1 carries when request 1 landed early: after its copy began, before its task came"
assert entries[1, tr.ENTRY_EARLY_NS] == 0, "the fence of request 2 (no blocks): no early landing"

# gen 2 copies request 3 early and exits before its task; gen 3 (its CTA of the same index) lands the task
# without copying again
h3, p3 = np.array([5, 6]), np.array([20, 21])
row(3, h3, p3)
publish(3, 2)
t2 = run(2, 3)
assert np.array_equal(pool[p3], host[h3]) and done[2] == 0
pool[p3] = 0xBEEF  # a copy in gen 3 would show
forward(3, 2, 3)
t3 = run(3, 3)
assert done[2] == 3 and (pool[p3] == 0xBEEF).all(), "copied again"
assert t2 < entries[2, tr.ENTRY_TAKEN_NS] < t3, "taken when the early copy began"
assert entries[2, tr.ENTRY_TAKEN_NS] <= entries[2, tr.ENTRY_EARLY_NS] < t3, "landed early in gen 2"

# gen 4: the fence task for request 4's row comes before the CTA looks at its head: never copied early
h4, p4 = np.array([7, 8]), np.array([14, 15])
row(4, h4, p4)
publish(4, 2)
forward(4, 0, 4)
run(4, 4)
assert (pool[p4] == 0xDEAD).all() and done[3] == 4 and heads[0, 2:4].tolist() == [0, 1], "4: not landed early"
# gen 5, the control: request 5, published, no task: copied early
h5, p5 = np.array([9, 10]), np.array([16, 17])
row(5, h5, p5)
publish(5, 2)
run(5, 5)
assert np.array_equal(pool[p5], host[h5])
# gen 6, as CTA 0 of 2: request 6's last id lies outside the pool, in CTA 1's span: CTA 0 copies nothing
# of its own valid span either (a request the poller refuses writes nothing)
row(6, [11, 12, 13, 99], [18, 19, 22, 23])
publish(6, 4)
run(6, 6, ctas=2)
assert (pool[[18, 19, 22, 23]] == 0xDEAD).all()
# gens 7-11, the CTAs of 4: request 7 has one block, so each CTA copies a quarter of it (CTA c words 10c..10c+9).
# CTA 1 copies its part early and nothing else of it; then task 5 names the request: CTA 2 copies its own part,
# CTA 1 skips the part it copied early, CTAs 0 and 3 copy theirs, and the last lands the task
row(7, [14], [5])
publish(7, 1)
dev[rk.DEV_HEADER + 4 * slots + rk.EARLY_WORDS * 1 + rk.LANE_NEXT] = 7  # CTA 1 looked at requests 1-6 already
run(7, 7, steps=((1.0, lambda: None),), ctas=4, cta=1)
assert np.array_equal(pool[5, 10:20], host[14, 10:20]), "CTA 1's part, early"
assert heads[0, 2:4].tolist() == [1, 1], "one part of 4 counted: request 7 has not landed on the device"
assert (pool[5, :10] == 0xDEAD).all() and (pool[5, 20:] == 0xDEAD).all(), "only CTA 1's part"
pool[5, 10:20] = 0xBEEF  # a copy of it again would show
forward(5, 1, 7)
run(8, 5, ctas=4, cta=2)
assert np.array_equal(pool[5, 20:30], host[14, 20:30]) and (pool[5, 30:] == 0xDEAD).all() and done[0] == 1
run(9, 5, ctas=4, cta=1)
run(10, 5, ctas=4, cta=0)
assert (pool[5, 10:20] == 0xBEEF).all(), "CTA 1's part copied again"
assert done[0] == 1, "landed before every CTA's part"
run(11, 5, ctas=4, cta=3)
assert done[0] == 5, "the last part lands the task"
assert np.array_equal(pool[5, :10], host[14, :10]) and np.array_equal(pool[5, 20:], host[14, 20:])
assert heads[0, 2:4].tolist() == [1, 1], "three parts came with the task: request 7 landed by its task alone"
assert entries[0, tr.ENTRY_EARLY_NS] == 0, "task 5 (request 7) did not land early"
# gens 12-13, the CTAs of 2, both idle: each copies its part of request 8 early; the second to count it marks
# it landed in its row's head, with no task
row(8, [3, 4], [6, 7])
publish(8, 2)
run(12, 6, steps=((1.0, lambda: None),), ctas=2, cta=0)
assert heads[1, 2:4].tolist() == [1, 5], "one of two parts: not landed (the row's landed seq is still request 5's)"
run(13, 6, steps=((1.0, lambda: None),), ctas=2, cta=1)
assert heads[1, 2:4].tolist() == [2, 8] and np.array_equal(pool[[6, 7]], host[[3, 4]]) and done[1] == 2
# gens 14-15, the CTAs of 2: request 9's 3 blocks do not divide over them, so each block is cut in 2 parts and each
# CTA copies 3 of the 6: CTA 0 block 0 and the first half of block 1 (words 0-19, one run a block), CTA 1 the rest
row(9, [15, 16, 17], [10, 11, 12])
publish(9, 3)
run(14, 6, steps=((1.0, lambda: None),), ctas=2, cta=0)
assert np.array_equal(pool[10], host[15]) and np.array_equal(pool[11, :20], host[16, :20]), "CTA 0's parts"
assert (pool[11, 20:] == 0xDEAD).all() and (pool[12] == 0xDEAD).all(), "only CTA 0's parts"
assert heads[2, 2] == 1 and heads[2, 3] != 9, "one of two CTAs counted: not landed"
run(15, 6, steps=((1.0, lambda: None),), ctas=2, cta=1)
assert np.array_equal(pool[[10, 11, 12]], host[[15, 16, 17]]) and heads[2, 2:4].tolist() == [2, 9]
# gens 16-17, one copy CTA: it copies requests 10 and 11 early before either task comes (as a layer's recall ahead
# is published before the poller posts the task of its own recall); both tasks then land with no copy again, each
# taken when its own request's early copy began
h10, p10, h11, p11 = np.array([18, 19]), np.array([0, 1]), np.array([20, 21]), np.array([2, 3])
row(10, h10, p10)
publish(10, 2)
row(11, h11, p11)
publish(11, 2)
t16 = run(16, 6)
assert np.array_equal(pool[p10], host[h10]) and np.array_equal(pool[p11], host[h11])
pool[[0, 1, 2, 3]] = 0xBEEF  # a copy from either task would show
forward(6, 2, 10)
forward(7, 2, 11)
t17 = run(17, 6)
assert done[1] == 6 and done[2] == 7, done
assert (pool[p10] == 0xBEEF).all(), "request 10 copied again: its task came after request 11's early copy"
assert (pool[p11] == 0xBEEF).all(), "request 11 copied again"
k10, k11 = entries[1, tr.ENTRY_TAKEN_NS], entries[2, tr.ENTRY_TAKEN_NS]
assert t16 < k10 < k11 < t17, "each task taken when its own request's early copy began"
assert (entries[[1, 2], tr.ENTRY_EARLY_NS] > 0).all(), "both landed early"
print("SIM-OK")
"""


@pytest.mark.slow
def test_copy_ctas_copy_a_published_request_before_its_task_under_simulator() -> None:
    """A copy CTA with no task to serve copies its span of a doorbell request as soon as the request's
    mirror row is published (not while it is being written), and skips the copy when the task comes, in
    its generation or the next one's CTA of its index; it copies no request naming a block outside the
    pools, and none after serving the task that names its row (the poller's fence for a request the fast
    lane did not take). A request whose blocks do not divide evenly over the CTAs is copied in parts, early or
    from its task, each CTA its own parts, the task landing once every part has. The CTAs count their early
    copies in the request's mirror row head, and the last of them marks the request landed there, only if every
    part was copied early. A CTA that copied several requests early before their tasks came skips the copy of each.
    """
    _run_simulated(_EARLY_SCRIPT)
