"""The resident copy kernel: copy_blocks that stays on the GPU and takes its work from a host ring.

Launching a kernel per transfer costs 6-8 us of host time on the H200 VM, plus an event; for a
64-block recall that is most of the budget. This kernel is launched and then serves tasks the host
posts into pinned memory, until it has been idle for `idle_ns`; the host relaunches it on the next
post. Tasks are numbered 1, 2, 3, ... and served in order.

Memory (int64 words; addresses are passed as int64 so the protocol words get explicit scopes; the
layout constants are in `pulseio/_native/task_ring.py`, with the host half of the protocol):
* host control, pinned: CTRL_PROMISED (host: highest task posted or on its way), CTRL_STOPPED
  (kernel: the generation that last offered to stop), CTRL_CLOSE (host: stop as soon as idle),
  CTRL_LAUNCHED (host: the last generation launched);
* host entries, pinned, ENTRY_WORDS per slot: ENTRY_TASK = pack(s, count, direction), written last by
  the host (or by a stream write, for stream-ordered posts); ENTRY_RAISE_AT / ENTRY_RAISE_TO: a
  word the kernel sets to RAISE_TO once the task has landed, 0 for none: a doorbell request's wait
  word in pinned host memory, which its consumer streams wait on (a system-scope store: atomics on
  host memory need PCIe atomics); ENTRY_TAKEN_NS / ENTRY_LANDED_NS: %globaltimer when copy CTA 0 began
  the task's copy / when the task landed; ENTRY_EARLY_NS: when its request landed early (below), 0 if it
  did not (the host zeroes it as it posts). The ids are ids[slot, :cap] (host blocks) and ids[slot, cap:]
  (device slots), or, for a doorbell request whose task word names a row of the publisher's device
  mirror, mirror[row, :w] and mirror[row, w:] (w = half its width): read from device memory, so a
  copy CTA starts its first data read one PCIe round trip sooner;
* host done words, pinned: done[slot] = s once task s has landed (what host waiters spin on);
* device state: DEV_POSTED (highest task forwarded to the CTAs), DEV_EXIT (generation told to exit),
  DEV_WATERMARK (every task <= it landed: what consumer streams wait on), DEV_START (two words:
  generation g's first task at DEV_START + g % 2, which generation g - 1's leader stored as it stopped;
  two, because a CTA of generation g may start after g's own leader has stopped, a launched CTA waiting
  for a free SM, and must still find where its generation began), then per slot the forwarded entry, a
  count of CTAs done, and the task's raise target (ENTRY_RAISE_AT, ENTRY_RAISE_TO), copied from the host
  entry by one thread while the task copies, so the last CTA raises the word with no PCIe read after the
  data has landed. One thread, not one per CTA: a hundred system-scope reads of one host line at once
  are served one after another (each CTA reading it made a 64-block task take 150 us, not 27). Last,
  per copy CTA index, its early-copy state (EARLY_WORDS), kept from one generation to the next.

CTA 0 is the leader and copies nothing: its thread 0 polls the host entries (one PCIe read per
poll) and forwards every ready entry into device memory, publishing DEV_POSTED per entry, so the
copy CTAs (1 .. grid - 1) spin on L2, not on the link, and start a task as soon as its entry is
read, never behind the leader's read of the next one. Each copy CTA copies one contiguous span of
a task's blocks, or of their parts where its blocks do not divide evenly over the CTAs (`copy_span`); the last
to finish a task raises the watermark and stores the done word. The leader decides alone when its
generation stops; the copy CTAs then finish what it forwarded and exit.

Early copies. With the publisher's ids mirror, a doorbell request is on the device (its ids, and its
row's head: seq and count, `doorbell_kernels.py`) several microseconds before the host has read it and
posted its task. A copy CTA with no task to serve watches the head of the next request's row and copies
its own span of that request at once (`_copy_early`: only if every id of the request lies in its pool,
and each round of ids read under the row's seqlock). When the task naming that row arrives, a CTA that copied its
span lands it without copying again (it remembers its last EARLY_RING early copies: it may have copied later
requests early before this task came), and copy CTA 0 stamps the task taken when its early copy began. A
CTA copies early, in seq order, only requests whose row no task it served has named since they were
published, so never one that has landed (landing takes every CTA's part), and keeps that state for the
next generation's CTA of its index, which serves the same span of each task. For a request the fast lane
does not take, the poller posts a task of no blocks naming its row (`TaskRing.fence_row`) as it reads
it, and the row is written again only once that task has landed, so an early copy never lands on slots
reused since (except those of a request given up before the poller read it, which are garbage anyway:
`pulseio/_device_waits.py`).

Landing on the device. A CTA that copied its part of request q early counts it in q's mirror row head
(HEAD_EARLY, zeroed by the publish); the CTA counting the last part stamps the head's HEAD_LANDED_NS and stores
q in its HEAD_LANDED (release). The last CTA of q's task copies that stamp into the task's ENTRY_EARLY_NS. A
captured device wait for q (`wait_kernel.wait_seq`, a RecallGraph's) ends there as well as on q's wait word
(`device_wait`'s `wait_word` reads the word alone), so a request every CTA copied early lands for its stream
without waiting for the poller to read it, post its task and the leader to forward it. The task still comes and
lands it for the host (its done word, its Completion), copying nothing again. A request with any part copied
from its task lands by its task alone.

Stopping without losing a post (a Dekker handshake): an idle leader stores CTRL_STOPPED = gen,
fences at system scope, then reads CTRL_PROMISED; the host stores CTRL_PROMISED, fences, then reads
CTRL_STOPPED. At least one sees the other: either the kernel sees the promise and keeps serving,
or the host sees the stop and relaunches (the new launch queues behind the old one on its stream
and starts where it stopped). When both see each other the spare launch starts after the old one exits
and serves from where it stopped, so no task is served twice.

Device waits. A generation may be launched for one (`hold_at`, `hold_to`: a request's wait word and
its value), in stream order behind that request's publish (`ResidentCopier.serve_for`): it does not
stop before the word is set. Every launch also writes its hold into `holds` (HOLD_GENS pairs, by
generation), and CTRL_LAUNCHED. An idle generation with a later one launched (that one starts where
it stopped) stops at once if the next generation's request has already landed or it has none: it
served that request itself while the next one queued behind its publish, so the switch is off the
requests' path. Otherwise it stops after idle_ns as usual. So a generation holds its SMs only for a
request whose publish has already run, and launches never pile up on the copier's stream. Holding
them for one still queued behind other work is a deadlock: some operations wait for every running
kernel first, on the host (a kernel's first launch under lazy module loading, a Triton module load,
cudaFree) or on the GPU (some first launches under eager loading), and then the publish that would
release the copier never runs (shown by `git show 0ae30ef:benchmarks/probe_spinner_block.py`).
"""

from __future__ import annotations

import functools

from numba import cuda, int64

from .._native.layout import HEAD_COUNT, HEAD_EARLY, HEAD_LANDED, HEAD_LANDED_NS, HEAD_WORDS  # mirror row heads
from .._native.task_ring import (  # the layout both halves share
    COUNT_BITS,
    CTRL_CLOSE,
    CTRL_LAUNCHED,
    CTRL_PROMISED,
    CTRL_STOPPED,
    ENTRY_EARLY_NS,
    ENTRY_LANDED_NS,
    ENTRY_RAISE_AT,
    ENTRY_RAISE_TO,
    ENTRY_TAKEN_NS,
    ENTRY_TASK,
    ENTRY_WORDS,
    MAX_MIRROR_ROWS,
    MAX_TASK_BLOCKS,
    MIRROR_BIT,
    ROW_SHIFT,
    SEQ_MASK,
    SEQ_SHIFT,
)
from . import _numba_compat  # noqa: F401  (must precede numba.cuda)
from .kernels import IDS_PER_ROUND, copy_span, copy_staged, parts_of, round_rows, span_of
from .sysmem import (
    atomic_add_gpu,
    globaltimer,
    load_acquire_gpu,
    load_acquire_sys,
    load_relaxed_gpu,
    load_relaxed_sys,
    pause,
    reduce_max_release_gpu,
    store_relaxed_sys,
    store_release_gpu,
    store_release_sys,
)

DEV_POSTED, DEV_EXIT, DEV_WATERMARK = 0, 1, 2
DEV_START = 4  # two words, by generation parity
DEV_HEADER = 16
CLOSE_POLL_NS = 100_000  # how often a leader with no entry ready reads the host words (CTRL_CLOSE, holds)
HOLD_GENS = 256  # generations whose holds `holds` keeps (by generation modulo)


RESIDENT_SIGNATURE = ("void(uint64[:, ::1], uint64[:, ::1], int64[:, ::1], int64[:, ::1], int64, int64, int64, int64, "
                      "int64, int64, int64, int64, int64, int64)")
# a copy CTA's shared words: the next doorbell request it may copy early and its last EARLY_RING early copies
# (request, count, start time; request q's at EARLY_AT + 3 * (q % EARLY_RING)), which it keeps in device memory for
# the next generation's CTA of its index (first, EARLY_WORDS of them); then what thread 0 decided, and scratch.
# A ring, not the last copy alone: a CTA may copy the next request early before the task of the one it copied
# comes (a layer's recall ahead is published before its own recall's task is posted), and that task must still
# find its copy.
EARLY_RING = 4
LANE_NEXT, EARLY_AT = 0, 1
EARLY_WORDS = EARLY_AT + 3 * EARLY_RING
WORK, SKIP, SKIP_NS, BAD, NEXT_N, NEXT_NS = range(EARLY_WORDS, EARLY_WORDS + 6)
STATE_WORDS = EARLY_WORDS + 6
SERVE_NONE, SERVE_TASK, SERVE_EARLY = 0, 1, 2


def dev_words(slots: int, ctas: int) -> int:
    return DEV_HEADER + 4 * slots + EARLY_WORDS * ctas


@cuda.jit(device=True)
def _forward(entries, dev, slots, forwarded):  # pragma: no cover - runs on the GPU / simulator
    """Leader: copy every ready entry after `forwarded` to device memory; returns the new `forwarded`."""
    s = forwarded + 1
    while s - forwarded <= slots:
        slot = (s - 1) % slots
        word = load_acquire_sys(entries + 8 * (ENTRY_WORDS * slot + ENTRY_TASK))
        if word >> SEQ_SHIFT != s & SEQ_MASK:
            break
        store_release_gpu(dev + 8 * (DEV_HEADER + slot), word)
        store_release_gpu(dev + 8 * DEV_POSTED, s)  # per entry, released after it: copying starts now
        s += 1
    return s - 1


@cuda.jit(device=True)
def _offer_stop(ctrl, dev, forwarded, gen, handed_over):  # pragma: no cover - runs on the GPU / simulator
    """Leader, idle: stop unless the host promised a task (see the module doc); handed_over: a later
    generation is launched, which serves any promise. True if stopped."""
    store_release_sys(ctrl + 8 * CTRL_STOPPED, gen)
    cuda.threadfence_system()
    if not handed_over and load_acquire_sys(ctrl + 8 * CTRL_PROMISED) > forwarded:
        return False
    store_release_gpu(dev + 8 * (DEV_START + (gen + 1) % 2), forwarded + 1)
    store_release_gpu(dev + 8 * DEV_EXIT, gen)
    return True


@cuda.jit(device=True)
def _held(hold_at, hold_to):  # pragma: no cover - runs on the GPU / simulator
    """A hold (a wait word and its value; 0: none) whose word has not reached the value."""
    return hold_at != 0 and load_acquire_sys(hold_at) - hold_to < 0


@cuda.jit(device=True)
def _lead(ctrl, entries, dev, slots, gen, idle_ns, hold_at, hold_to, holds):  # pragma: no cover - GPU / simulator
    """The leader (thread 0 of CTA 0): forward entries until this generation stops (see the module doc)."""
    forwarded = load_acquire_gpu(dev + 8 * (DEV_START + gen % 2)) - 1
    active, looked = globaltimer(), 0  # last forward; last look at the host words
    while True:
        now_forwarded = _forward(entries, dev, slots, forwarded)
        now = globaltimer()
        if now_forwarded > forwarded:
            forwarded, active = now_forwarded, now
            continue
        if now - looked < CLOSE_POLL_NS:  # the host words are PCIe reads: not on every poll
            pause()
            continue
        looked = now
        # Up to three PCIe round trips in which no entry is polled, so: rarely, and the independent words
        # together (relaxed loads overlap; CTRL_LAUNCHED last, acquire: a successor's hold precedes it).
        closing = load_relaxed_sys(ctrl + 8 * CTRL_CLOSE) != 0
        own = load_relaxed_sys(hold_at) if hold_at != 0 else 0
        launched = load_acquire_sys(ctrl + 8 * CTRL_LAUNCHED)
        if hold_at != 0 and own - hold_to < 0 and not closing:
            active = now
            continue
        handed_over = False
        if launched > gen:
            nxt = holds + 16 * ((gen + 1) % HOLD_GENS)
            handed_over = not _held(load_relaxed_sys(nxt), load_relaxed_sys(nxt + 8))
        if handed_over or closing or now - active >= idle_ns:
            if _offer_stop(ctrl, dev, forwarded, gen, handed_over):
                return
            active = now


@cuda.jit(device=True)
def _wait_work(task, dev, gen, heads, rows, state):  # pragma: no cover - runs on the GPU / simulator
    """Thread 0 of a copy CTA: wait until `task` is forwarded (SERVE_TASK), this generation exits
    (SERVE_NONE), or, with an ids mirror (rows > 0) and no task to serve, doorbell request
    state[LANE_NEXT] is in its mirror row (SERVE_EARLY: copy it early; its count in state[NEXT_N], the time
    in state[NEXT_NS])."""
    while True:
        if load_acquire_gpu(dev + 8 * DEV_POSTED) >= task:
            return SERVE_TASK
        if load_acquire_gpu(dev + 8 * DEV_EXIT) == gen:  # the leader forwards before it exits
            return SERVE_TASK if load_acquire_gpu(dev + 8 * DEV_POSTED) >= task else SERVE_NONE
        if rows > 0:
            q = state[LANE_NEXT]
            head = load_acquire_gpu(heads + 8 * HEAD_WORDS * ((q - 1) % rows))
            if head == q:
                state[NEXT_N] = load_acquire_gpu(heads + 8 * (HEAD_WORDS * ((q - 1) % rows) + HEAD_COUNT))  # before
                state[NEXT_NS] = globaltimer()
                return SERVE_EARLY
            if head > q or head < -q:  # the row holds a later request: q has finished, or is not ours to copy
                state[LANE_NEXT] = q + 1
                continue
        pause()


@cuda.jit(device=True)
def _check_head(heads, row, q, state):  # pragma: no cover - GPU / simulator
    """Every thread of a copy CTA, after reading from mirror row `row`: the seqlock's second look. Sets
    state[BAD] if the row's head is no longer q (a publish began rewriting it: what was read may be torn)."""
    cuda.threadfence()  # this thread's reads of the row are done before the head is read again
    cuda.syncthreads()
    if cuda.threadIdx.x == 0 and load_acquire_gpu(heads + 8 * HEAD_WORDS * row) != q:
        state[BAD] = 1
    cuda.syncthreads()


@cuda.jit(device=True)
def _copy_early(host, pool, mirror, heads, q, n, lo, hi, parts, staged, state):  # pragma: no cover - GPU / simulator
    """Every thread of a copy CTA: this CTA's units [lo, hi) of doorbell request q (n blocks, each in `parts`
    parts: `kernels.copy_span`), from its mirror row, before its task arrives; True if they were all copied.
    Only if every id of the request lies in its pool, so a request the poller refuses for an id out of range
    writes nothing (one it refuses for naming a slot twice may have written its slots). One read of the row
    checks every id and stages the first round of the span's blocks' ids, under the row's seqlock; each later
    round (a span over more than IDS_PER_ROUND blocks) is read under the seqlock again."""
    t = cuda.threadIdx.x
    row = (q - 1) % mirror.shape[0]
    w = mirror.shape[1] // 2
    r0 = lo // parts
    m = round_rows(lo, hi, parts, staged.shape[1])
    if t == 0:
        state[BAD] = 0
    cuda.syncthreads()
    i = t
    while i < n:
        a, b = mirror[row, i], mirror[row, w + i]
        if a < 0 or a >= host.shape[0] or b < 0 or b >= pool.shape[0]:
            state[BAD] = 1
        if r0 <= i < r0 + m:
            staged[0, i - r0], staged[1, i - r0] = a, b
        i += cuda.blockDim.x
    _check_head(heads, row, q, state)
    while state[BAD] == 0:
        end = min(hi, (r0 + m) * parts)
        copy_staged(host, pool, staged, r0, lo, end, parts, False)
        cuda.syncthreads()  # every thread is done with these ids (and has read state[BAD]) before the next round
        lo = max(lo, end)
        if lo >= hi:
            return True
        r0 = lo // parts
        m = round_rows(lo, hi, parts, staged.shape[1])
        if t == 0:
            state[BAD] = 0
        cuda.syncthreads()
        i = t
        while i < m:
            staged[0, i], staged[1, i] = mirror[row, r0 + i], mirror[row, w + r0 + i]
            i += cuda.blockDim.x
        _check_head(heads, row, q, state)
    return False


@cuda.jit(device=True)
def _count_early(heads, row, q, ctas):  # pragma: no cover - GPU / simulator
    """Thread 0 of a copy CTA that copied its part of request q early (mirror row `row`), after its threads
    fenced: count the part in the row's HEAD_EARLY (the publish zeroed it; the row holds q until q's task lands,
    after every CTA is done with q, so no other request's parts are counted there meanwhile). The CTA that counts
    the last part stores q into HEAD_LANDED, releasing every part the count acquired: q has landed on the device,
    and a device wait for it may end before its task lands it (`wait_kernel.wait_seq`)."""
    at = heads + 8 * HEAD_WORDS * row
    if atomic_add_gpu(at + 8 * HEAD_EARLY, 1) == ctas - 1:
        store_relaxed_sys(at + 8 * HEAD_LANDED_NS, globaltimer())    # a stamp: the release below orders it
        store_release_gpu(at + 8 * HEAD_LANDED, q)


def _resident_copy(host, pool, ids, mirror, ctrl, entries, done, dev, gen, idle_ns, hold_at, hold_to,
                   holds, heads):  # pragma: no cover - runs on the GPU / simulator
    """host: [H, words] uint64 pinned; pool: [D, words] uint64 device; ids: [slots, 2 * cap] int64 pinned;
    mirror: [rows, 2 * w] int64 device, the publisher's copy of doorbell requests' ids (rows may be 0);
    hold_at, hold_to: a device wait's word and value (0, 0: none); holds: [HOLD_GENS, 2] int64 pinned, every
    generation's hold; heads: the address of the mirror rows' [rows, HEAD_WORDS] int64 heads, on the device
    (unread without a mirror). See the module doc."""
    state = cuda.shared.array(STATE_WORDS, int64)
    staged = cuda.shared.array((2, IDS_PER_ROUND), int64)
    if cuda.blockIdx.x == 0:
        if cuda.threadIdx.x == 0:
            _lead(ctrl, entries, dev, ids.shape[0], gen, idle_ns, hold_at, hold_to, holds)
        return
    _serve_copies(host, pool, ids, mirror, entries, done, dev, gen, heads, cuda.blockIdx.x - 1,
                  cuda.gridDim.x - 1, state, staged)


@cuda.jit(device=True)
def _serve_copies(host, pool, ids, mirror, entries, done, dev, gen, heads, cta, ctas, state,
                  staged):  # pragma: no cover - runs on the GPU / simulator
    """Every thread of copy CTA `cta` of `ctas`: serve the tasks the leader forwards until the generation
    exits; state: shared [STATE_WORDS] int64; staged: shared [2, IDS_PER_ROUND] int64."""
    t = cuda.threadIdx.x
    slots, cap = ids.shape[0], ids.shape[1] // 2
    rows, w = mirror.shape[0], mirror.shape[1] // 2
    task = load_acquire_gpu(dev + 8 * (DEV_START + gen % 2))
    kept = dev + 8 * (DEV_HEADER + 4 * slots + EARLY_WORDS * cta)  # this CTA index's early-copy state
    if t == 0:
        for i in range(EARLY_WORDS):  # stored by the last generation, which exited before this one started:
            state[i] = load_relaxed_gpu(kept + 8 * i)  # relaxed, so the ring's loads overlap on a CTA's start
        state[LANE_NEXT] = max(state[LANE_NEXT], 1)
    while True:
        if t == 0:
            state[WORK] = _wait_work(task, dev, gen, heads, rows, state)
        cuda.syncthreads()
        if state[WORK] == SERVE_NONE:
            if t == 0:  # for the next generation's CTA of this index (it starts after this kernel exits)
                for i in range(EARLY_WORDS):
                    store_release_gpu(kept + 8 * i, state[i])
            return
        if state[WORK] == SERVE_EARLY:  # a doorbell request on the device, its task not here yet
            q, n = state[LANE_NEXT], state[NEXT_N]
            copied = False
            if 0 < n <= min(cap, w):  # what the fast lane posts as one task; other requests are left to theirs
                parts = parts_of(ctas, n)
                lo, hi = span_of(cta, ctas, n * parts)
                copied = _copy_early(host, pool, mirror, heads, q, n, lo, hi, parts, staged, state)
            if copied:
                cuda.threadfence()  # this thread's part is visible on the device before thread 0 counts it
            cuda.syncthreads()  # every thread has read q and n (and fenced its part) before thread 0 moves on
            if t == 0:
                if copied:
                    e = EARLY_AT + 3 * (q % EARLY_RING)
                    state[e], state[e + 1], state[e + 2] = q, n, state[NEXT_NS]
                    _count_early(heads, (q - 1) % rows, q, ctas)
                state[LANE_NEXT] = q + 1
            cuda.syncthreads()
            continue
        slot = (task - 1) % slots
        word = load_acquire_gpu(dev + 8 * (DEV_HEADER + slot))
        n = word & MAX_TASK_BLOCKS
        d2h = (word >> COUNT_BITS) & 1
        parts = parts_of(ctas, n)     # the same units as an early copy of the request: see SKIP
        lo, hi = span_of(cta, ctas, n * parts)
        task_ids, dst_at = ids[slot], cap
        if (word >> MIRROR_BIT) & 1:
            row = (word >> ROW_SHIFT) & (MAX_MIRROR_ROWS - 1)
            task_ids, dst_at = mirror[row], w
            if t == 0:
                # the row holds this task's request until the task lands; copied early by this CTA?
                q = load_acquire_gpu(heads + 8 * HEAD_WORDS * row)
                e = EARLY_AT + 3 * (max(q, 0) % EARLY_RING)
                state[SKIP] = 1 if 0 < q == state[e] and n == state[e + 1] and d2h == 0 else 0
                state[SKIP_NS] = state[e + 2]
                if q >= state[LANE_NEXT]:  # served now: never copied early after this
                    state[LANE_NEXT] = q + 1
        elif t == 0:
            state[SKIP] = 0
        cuda.syncthreads()
        skip = state[SKIP] != 0
        entry = entries + 8 * ENTRY_WORDS * slot
        target = dev + 8 * (DEV_HEADER + 2 * slots + 2 * slot)  # the raise target, kept on the device
        fetch = cta == ctas - 1 and t == cuda.blockDim.x - 1
        raise_at, raise_to = 0, 0
        if fetch:  # read now, stored after the copy: the PCIe read overlaps it
            raise_at = load_relaxed_sys(entry + 8 * ENTRY_RAISE_AT)
            raise_to = load_relaxed_sys(entry + 8 * ENTRY_RAISE_TO)
        if cta == 0 and t == 0:  # publish -> taken is the pickup: when this request's copy began
            store_relaxed_sys(entry + 8 * ENTRY_TAKEN_NS, state[SKIP_NS] if skip else globaltimer())
        if not skip:
            copy_span(host, task_ids, 0, pool, task_ids, dst_at, lo, hi, parts, d2h != 0, staged)
        if fetch:
            store_release_gpu(target, raise_at)
            store_release_gpu(target + 8, raise_to)
        # this thread's stores are visible before thread 0 counts the CTA done: to the host for D2H; for
        # H2D to this GPU, whose kernels read the slots only after acquiring what the last CTA releases
        if d2h != 0:
            cuda.threadfence_system()
        else:
            cuda.threadfence()
        cuda.syncthreads()
        if t == 0:
            count = dev + 8 * (DEV_HEADER + slots + slot)
            if atomic_add_gpu(count, 1) == ctas - 1:  # the last CTA of this task (acquires every CTA's part)
                store_release_gpu(count, 0)
                reduce_max_release_gpu(dev + 8 * DEV_WATERMARK, task)
                raise_at, raise_to = load_relaxed_gpu(target), load_relaxed_gpu(target + 8)  # after the add
                if raise_at != 0:  # a request's wait word, in pinned host memory: a store, not an atomic
                    store_release_sys(raise_at, raise_to)
                if n > 0 and ((word >> MIRROR_BIT) & 1) != 0:  # when its request landed early: every CTA copied it so
                    head = heads + 8 * HEAD_WORDS * ((word >> ROW_SHIFT) & (MAX_MIRROR_ROWS - 1))
                    q = load_acquire_gpu(head)  # the row holds the task's request until the task has landed
                    if q > 0 and load_acquire_gpu(head + 8 * HEAD_LANDED) == q:
                        store_relaxed_sys(entry + 8 * ENTRY_EARLY_NS, load_relaxed_gpu(head + 8 * HEAD_LANDED_NS))
                store_release_sys(entry + 8 * ENTRY_LANDED_NS, globaltimer())
                cuda.threadfence_system()
                store_release_sys(done + 8 * slot, task)
        task += 1


@functools.cache
def compile_resident_copy():
    """The kernel compiled for RESIDENT_SIGNATURE, once per process (compiling needs a GPU or the simulator)."""
    return cuda.jit(RESIDENT_SIGNATURE)(_resident_copy)
