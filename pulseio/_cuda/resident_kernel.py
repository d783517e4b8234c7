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
  the task's copy / when the task landed. The ids are ids[slot, :cap] (host blocks) and ids[slot, cap:]
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
  are served one after another (each CTA reading it made a 64-block task take 150 us, not 27).

CTA 0 is the leader and copies nothing: its thread 0 polls the host entries (one PCIe read per
poll) and forwards every ready entry into device memory, publishing DEV_POSTED per entry, so the
copy CTAs (1 .. grid - 1) spin on L2, not on the link, and start a task as soon as its entry is
read, never behind the leader's read of the next one. Each copy CTA copies one contiguous span of
a task's blocks (`copy_span`); the last to finish a task raises the watermark and stores the done
word. The leader decides alone when its generation stops; the copy CTAs then finish what it
forwarded and exit.

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
release the copier never runs (`benchmarks/probe_spinner_block.py`).
"""

from __future__ import annotations

import functools

from numba import cuda, int64

from .._native.task_ring import (  # the layout both halves share
    COUNT_BITS,
    CTRL_CLOSE,
    CTRL_LAUNCHED,
    CTRL_PROMISED,
    CTRL_STOPPED,
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
from .kernels import IDS_PER_ROUND, copy_span, span_of
from .sysmem import (
    atomic_add_gpu,
    atomic_max_gpu,
    globaltimer,
    load_acquire_gpu,
    load_acquire_sys,
    load_relaxed_sys,
    pause,
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
                      "int64, int64, int64, int64, int64)")


def dev_words(slots: int) -> int:
    return DEV_HEADER + 4 * slots


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
def _wait_forwarded(task, dev, gen):  # pragma: no cover - runs on the GPU / simulator
    """Thread 0 of a copy CTA: wait until `task` is forwarded (1) or this generation exits (0)."""
    while True:
        if load_acquire_gpu(dev + 8 * DEV_POSTED) >= task:
            return 1
        if load_acquire_gpu(dev + 8 * DEV_EXIT) == gen:  # the leader forwards before it exits
            return 1 if load_acquire_gpu(dev + 8 * DEV_POSTED) >= task else 0
        pause()


def _resident_copy(host, pool, ids, mirror, ctrl, entries, done, dev, gen, idle_ns, hold_at, hold_to,
                   holds):  # pragma: no cover - runs on the GPU / simulator
    """host: [H, words] uint64 pinned; pool: [D, words] uint64 device; ids: [slots, 2 * cap] int64 pinned;
    mirror: [rows, 2 * w] int64 device, the publisher's copy of doorbell requests' ids (rows may be 0);
    hold_at, hold_to: a device wait's word and value (0, 0: none); holds: [HOLD_GENS, 2] int64 pinned, every
    generation's hold. See the module doc."""
    serve = cuda.shared.array(1, int64)
    staged = cuda.shared.array((2, IDS_PER_ROUND), int64)
    t = cuda.threadIdx.x
    if cuda.blockIdx.x == 0:
        if t == 0:
            _lead(ctrl, entries, dev, ids.shape[0], gen, idle_ns, hold_at, hold_to, holds)
        return
    cta, ctas = cuda.blockIdx.x - 1, cuda.gridDim.x - 1  # the copy CTAs
    slots, cap = ids.shape[0], ids.shape[1] // 2
    task = load_acquire_gpu(dev + 8 * (DEV_START + gen % 2))
    while True:
        if t == 0:
            serve[0] = _wait_forwarded(task, dev, gen)
        cuda.syncthreads()
        if serve[0] == 0:
            return
        slot = (task - 1) % slots
        word = load_acquire_gpu(dev + 8 * (DEV_HEADER + slot))
        n = word & MAX_TASK_BLOCKS
        d2h = (word >> COUNT_BITS) & 1
        lo, hi = span_of(cta, ctas, n)
        task_ids, dst_at = ids[slot], cap
        if (word >> MIRROR_BIT) & 1:
            task_ids, dst_at = mirror[(word >> ROW_SHIFT) & (MAX_MIRROR_ROWS - 1)], mirror.shape[1] // 2
        entry = entries + 8 * ENTRY_WORDS * slot
        target = dev + 8 * (DEV_HEADER + 2 * slots + 2 * slot)  # the raise target, kept on the device
        fetch = cta == ctas - 1 and t == cuda.blockDim.x - 1
        raise_at, raise_to = 0, 0
        if fetch:  # read now, stored after the copy: the PCIe read overlaps it
            raise_at = load_relaxed_sys(entry + 8 * ENTRY_RAISE_AT)
            raise_to = load_relaxed_sys(entry + 8 * ENTRY_RAISE_TO)
        if cta == 0 and t == 0:  # publish -> taken is the pickup
            store_relaxed_sys(entry + 8 * ENTRY_TAKEN_NS, globaltimer())
        copy_span(host, task_ids, 0, pool, task_ids, dst_at, lo, hi, d2h != 0, staged)
        if fetch:
            store_release_gpu(target, raise_at)
            store_release_gpu(target + 8, raise_to)
        cuda.threadfence_system()  # this thread's stores are visible (host memory included) ...
        cuda.syncthreads()  # ... before thread 0 counts the CTA done
        if t == 0:
            count = dev + 8 * (DEV_HEADER + slots + slot)
            if atomic_add_gpu(count, 1) == ctas - 1:  # the last CTA of this task
                store_release_gpu(count, 0)
                atomic_max_gpu(dev + 8 * DEV_WATERMARK, task)
                raise_at = load_acquire_gpu(target)
                if raise_at != 0:  # a request's wait word, in pinned host memory: a store, not an atomic
                    store_release_sys(raise_at, load_acquire_gpu(target + 8))
                store_release_sys(entry + 8 * ENTRY_LANDED_NS, globaltimer())
                cuda.threadfence_system()
                store_release_sys(done + 8 * slot, task)
        task += 1


@functools.cache
def compile_resident_copy():
    """The kernel compiled for RESIDENT_SIGNATURE, once per process (compiling needs a GPU or the simulator)."""
    return cuda.jit(RESIDENT_SIGNATURE)(_resident_copy)
