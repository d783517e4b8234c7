"""Host bookkeeping: block allocator and tables, request lifecycle, scheduler decisions (no torch)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pulseio_engine.config import SchedulerConfig
from pulseio_engine.errors import KVBudgetError
from pulseio_engine.kv.block_table import BlockAllocator, BlockTable, blocks_for
from pulseio_engine.request import FinishReason, SamplingParams, Sequence, Status
from pulseio_engine.scheduler import Scheduler

ENGINE = Path(__file__).resolve().parents[2] / "pulseio_engine"
BOOKKEEPING = ["request.py", "scheduler.py", "config.py", "errors.py", "kv/block_table.py"]


@pytest.mark.parametrize("module", BOOKKEEPING)
def test_bookkeeping_imports_no_torch(module: str) -> None:
    """Walks the module and the sibling modules it imports: none may import torch or numpy."""
    todo, seen = [ENGINE / module], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] in {"torch", "numpy"} for a in node.names), path
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    assert (node.module or "").split(".")[0] not in {"torch", "numpy"}, path
                else:
                    base = path.parent
                    for _ in range(node.level - 1):
                        base = base.parent
                    target = base.joinpath(*(node.module or "").split("."))
                    todo += [p for p in (target.with_suffix(".py"), target / "__init__.py") if p.exists()]


def test_blocks_for_and_allocator() -> None:
    assert [blocks_for(n, 16) for n in (1, 16, 17, 32)] == [1, 1, 2, 2]
    alloc = BlockAllocator(5)
    assert alloc.capacity == 4 and alloc.num_free == 4
    ids = alloc.allocate(3)
    assert 0 not in ids, "block 0 is the padding block"
    assert not alloc.can_allocate(2)
    alloc.free(ids)
    assert alloc.statistics().num_used == 0
    with pytest.raises(ValueError, match="num_blocks must be >= 2"):
        BlockAllocator(1)


def test_block_table_slots() -> None:
    table = BlockTable()
    table.block_ids = [7, 3]
    assert [table.slot(p, 4) for p in (0, 3, 4, 6)] == [28, 31, 12, 14]


def test_block_table_packed_follows_every_setting() -> None:
    """The packed copy a decode step's table is filled from is made once per setting and never goes stale: the ids
    are set whole and cannot be changed in place."""
    table = BlockTable()
    assert list(table.packed()) == [] and len(table) == 0
    table.block_ids = [7, 3, 2**31 - 1]
    first = table.packed()
    assert list(first) == [7, 3, 2**31 - 1] and first.itemsize == 4
    assert table.packed() is first, "made once per setting"
    table.block_ids = [5]
    assert list(table.packed()) == [5] and len(table) == 1
    with pytest.raises(AttributeError):
        table.block_ids.append(9)  # type: ignore[attr-defined]


def test_sampling_params_validation() -> None:
    with pytest.raises(ValueError, match=r"^SamplingParams.max_new_tokens must be an int >= 1, got 0$"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        SamplingParams(temperature=-1.0)


def test_sequence_lifecycle_and_finish_reasons() -> None:
    seq = Sequence(1, [5, 6], SamplingParams(max_new_tokens=2), eos_token_ids=(9,))
    with pytest.raises(RuntimeError, match="illegal transition"):
        seq.set_status(Status.FINISHED)
    seq.set_status(Status.RUNNING)
    assert seq.append_token(4) is None
    assert seq.append_token(9) is FinishReason.EOS
    ignoring = Sequence(2, [5], SamplingParams(max_new_tokens=1, ignore_eos=True), eos_token_ids=(9,))
    assert ignoring.append_token(9) is FinishReason.LENGTH


def test_handed_in_kv_must_leave_a_token_to_feed() -> None:
    with pytest.raises(ValueError, match="covers 3 tokens but the prompt has 3"):
        Sequence(1, [1, 2, 3], SamplingParams(), num_computed=3)


def _scheduler(num_blocks: int = 9, **config) -> Scheduler:
    return Scheduler(SchedulerConfig(**config), BlockAllocator(num_blocks), block_size=4)


def test_prefill_is_chunked_by_token_budget() -> None:
    sched = _scheduler(max_prefill_tokens=6)
    a, b = Sequence(0, list(range(5)), SamplingParams(max_new_tokens=2)), Sequence(1, [1] * 4, SamplingParams(2))
    sched.add(a)
    sched.add(b)
    step = sched.schedule()
    assert step.admitted == (a, b)
    assert [(c.seq, c.start, c.length, c.samples) for c in step.prefill] == [(a, 0, 5, True), (b, 0, 1, False)]
    assert not step.decode


def test_decode_after_prefill_and_finish_frees_blocks() -> None:
    sched = _scheduler()
    seq = Sequence(0, [1, 2, 3], SamplingParams(max_new_tokens=2))
    sched.add(seq)
    chunk = sched.schedule().prefill[0]
    seq.mark_computed(chunk.length)
    seq.append_token(5)
    assert sched.schedule().decode == (seq,)
    sched.finish(seq)
    assert sched.allocator.num_free == 8 and not sched.has_unfinished()


def test_admission_waits_for_blocks_fifo() -> None:
    sched = _scheduler(num_blocks=5)    # 4 usable blocks of 4 tokens
    first = Sequence(0, [1] * 8, SamplingParams(max_new_tokens=4))     # 3 blocks
    second = Sequence(1, [1] * 4, SamplingParams(max_new_tokens=4))    # 2 blocks: must wait
    sched.add(first)
    sched.add(second)
    assert sched.schedule().admitted == (first,)
    assert sched.statistics().num_waiting == 1
    sched.finish(first)
    assert sched.schedule().admitted == (second,)


def test_max_num_seqs_bounds_the_running_set() -> None:
    sched = _scheduler(max_num_seqs=1)
    for i in range(2):
        sched.add(Sequence(i, [1], SamplingParams(max_new_tokens=1)))
    assert len(sched.schedule().decode) == 1


def test_request_larger_than_the_cache_is_refused_naming_both_numbers() -> None:
    sched = _scheduler(num_blocks=3)
    with pytest.raises(KVBudgetError, match=r"needs 3 KV blocks of 4 tokens, but the KV cache holds 2 blocks \(8"):
        sched.add(Sequence(0, [1] * 9, SamplingParams(max_new_tokens=1)))


def test_a_loading_sequence_sits_steps_out_until_it_leaves_loading() -> None:
    sched = _scheduler()
    held, other = Sequence(0, [1, 2], SamplingParams(max_new_tokens=3), num_computed=1), \
        Sequence(1, [3, 4], SamplingParams(max_new_tokens=3), num_computed=1)
    sched.add(held)
    sched.add(other)
    admitted = sched.admit()
    sched.loading.add(held.request_id)
    step = sched.plan(admitted)
    assert step.admitted == (held, other) and step.decode == (other,)
    sched.loading.discard(held.request_id)
    assert sched.plan().decode == (held, other) and sched.plan().admitted == ()
    sched.loading.add(held.request_id)
    sched.remove(held)
    assert not sched.loading, "a sequence that leaves is no longer loading"
