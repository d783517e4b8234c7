"""IRQ, the inner scheduler: the order it runs two batches' pieces in, and m, on scripted batches and recalls;
then on the engine: interleaved tokens equal each batch's tokens alone, for random splits and late recalls."""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Iterator

import pytest
import torch

from pulseio_engine.config import DType
from pulseio_engine.kv.handoff import RandomKV
from pulseio_engine.kv.retrieval_heads import RetrievalHeads
from pulseio_engine.model.checkpoint import load_checkpoint
from pulseio_engine.serving.budget import KVClass
from pulseio_engine.serving.config import ServeMode, ServingConfig
from pulseio_engine.serving.engine import ServingEngine
from pulseio_engine.serving.irq import InnerScheduler, NoPacer
from pulseio_engine.serving.testing import LateLoads, LateRecaller

NRM, OFF = KVClass.NORMAL, KVClass.OFFLOAD


class _Pending:
    def __init__(self, log: list[str], name: str, checks: int) -> None:
        self.log, self.name, self.checks = log, name, checks

    def landed_nowait(self) -> bool:
        self.checks -= 1
        return self.checks < 0

    def wait_device(self) -> None:
        self.log.append(f"wait {self.name}")


class _Batch:
    """Pieces that log themselves; piece i < recalls posts a recall that lands after `checks[i]` checks."""

    def __init__(self, log: list[str], name: str, pieces: int, checks: list[int] | None = None) -> None:
        self.log, self.name, self.num_pieces, self.checks = log, name, pieces, checks or []

    def run_piece(self, piece: int) -> _Pending | None:
        self.log.append(f"{self.name}{piece}")
        return _Pending(self.log, f"{self.name}{piece}", self.checks[piece]) if piece < len(self.checks) else None


def test_normal_pieces_run_while_a_recall_is_in_flight_up_to_an_even_share_then_the_device_waits() -> None:
    log: list[str] = []
    inner = InnerScheduler(NoPacer())
    # offload: 4 pieces, recalls after pieces 0..2 landing after 2, 0 and 5 checks; normal: 4 pieces.
    # Shares: 4 normal pieces over 4 offload pieces (1), then 3 over 3 (1), then 3 over 2 (2).
    inner.interleave(_Batch(log, "n", 4), _Batch(log, "o", 4, [2, 0, 5]))
    assert log == ["o0", "n0", "wait o0", "o1", "o2", "n1", "n2", "wait o2", "o3", "n3"]
    assert inner.stats.m == Counter({1: 1, 0: 1, 2: 1})
    assert (inner.stats.seen_landed, inner.stats.device_waits) == (1, 2)


def test_a_recall_that_lands_early_leaves_its_share_to_the_later_ones() -> None:
    log: list[str] = []
    inner = InnerScheduler(NoPacer())
    inner.interleave(_Batch(log, "n", 6), _Batch(log, "o", 3, [0, 9, 9]))       # shares: 2, then 3, then 3
    assert log == ["o0", "o1", "n0", "n1", "n2", "wait o1", "o2", "n3", "n4", "n5", "wait o2"]
    assert inner.stats.m == Counter({0: 1, 3: 2})


def test_without_a_normal_batch_every_recall_is_waited_for_and_without_an_offload_batch_normal_runs_alone() -> None:
    log: list[str] = []
    inner = InnerScheduler(NoPacer())
    inner.interleave(None, _Batch(log, "o", 3, [1, 1]))
    assert log == ["o0", "wait o0", "o1", "wait o1", "o2"] and inner.stats.m == Counter({0: 2})
    log.clear()
    inner.interleave(_Batch(log, "n", 3), None)
    assert log == ["n0", "n1", "n2"]


class _Streams:
    """A `StreamPair` that logs: each entry made under a stream is tagged with it, the fork and join logged."""

    def __init__(self, log: list[str]) -> None:
        self.log, self.current = log, "main"

    @contextlib.contextmanager
    def on(self, batch: str) -> Iterator[None]:
        before, self.current = self.current, batch
        try:
            yield
        finally:
            self.current = before

    @contextlib.contextmanager
    def forked(self) -> Iterator[None]:
        self.log.append("fork")
        yield
        self.log.append("join")


class _TaggedLog(list):
    """Entries as "<entry>@<stream it was enqueued on>" (fork and join as they are)."""

    streams: _Streams

    def append(self, entry: str) -> None:
        super().append(entry if entry in ("fork", "join") else f"{entry}@{self.streams.current}")


def test_two_streams_keep_the_order_and_put_each_batch_and_its_waits_on_its_own_stream() -> None:
    """The same decisions as on one stream (the first test's script), each offload piece and device wait on the
    offload stream, each normal piece on the normal one, all of them between the fork and the join."""
    log = _TaggedLog()
    log.streams = _Streams(log)
    inner = InnerScheduler(NoPacer(), log.streams)                       # type: ignore[arg-type]
    inner.interleave(_Batch(log, "n", 4), _Batch(log, "o", 4, [2, 0, 5]))
    on = {"o": "offload", "n": "normal", "w": "offload"}
    assert [e.split("@")[0] for e in log[1:-1]] == ["o0", "n0", "wait o0", "o1", "o2", "n1", "n2", "wait o2", "o3",
                                                     "n3"]
    assert log[0] == "fork" and log[-1] == "join"
    assert all(e.split("@")[1] == on[e[0]] for e in log[1:-1]), list(log)


def test_coupled_runs_each_batch_whole_waiting_every_recall() -> None:
    log: list[str] = []
    InnerScheduler(NoPacer()).coupled(_Batch(log, "n", 2), _Batch(log, "o", 3, [0, 9]))
    assert log == ["n0", "n1", "o0", "wait o0", "o1", "wait o1", "o2"]


HEADS = RetrievalHeads(2, best=(0, 1, 0), worst=(1, 0, 1))


def _serve(path: str, classes: dict[int, KVClass], *, irq: bool = True, late: int | None = None, seed: int = 0,
           moves: dict[int, dict[int, KVClass]] | None = None, normal_steps: int = 1, ahead: bool = False,
           late_loads: int | None = None) -> tuple[dict[int, tuple[int, ...]], ServingEngine]:
    """Requests of random lengths in the given classes, the first two at once, the others after the first round;
    `moves`: round -> {rid: class}; `ahead`: each layer's predicted blocks recalled during the layer before, into
    hot sets of 1.5 budgets; `late` / `late_loads`: recalls / handed-in KV landing after up to so many landing
    checks."""
    ckpt = load_checkpoint(path, dtype=torch.float32, device="cpu")
    config = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=64 << 20, host_kv_bytes=64 << 20, irq=irq,
                           token_budget=64, block_size=16, dense_layers=1, max_batch=16, normal_steps=normal_steps,
                           ahead=ahead, hot_cache=1.5 if ahead else 1.0)
    out: dict[int, tuple[int, ...]] = {}
    with ServingEngine(config, ckpt, device="cpu", dtype=DType.FLOAT32, max_model_len=512, heads=HEADS) as serving:
        if late is not None:
            off = serving.offload.offloader                                # type: ignore[union-attr]
            off.recaller = LateRecaller(off.recaller, max_checks=late, seed=seed)
        if late_loads is not None:
            for eng in (serving.normal, serving.offload):
                assert eng is not None
                eng.handoff_loads = LateLoads(torch.device("cpu"), max_checks=late_loads, seed=seed)

        def arrive(rids: list[int]) -> None:
            for rid in rids:
                rng = random.Random(1000 * seed + rid)                  # a request's prompt: its own
                length = 40 + (97 * rid + 31 * seed) % 300
                prompt = [rng.randrange(3, 256) for _ in range(length)]
                serving.add(rid, prompt, 10 + rid % 5, classes[rid], kv=RandomKV(length - 1, seed=rid, std=0.5))

        later = [rid for rid in classes if rid >= 2]
        arrive([rid for rid in classes if rid < 2])
        while later or serving.has_unfinished():
            if serving.rounds >= 1 or not serving.has_unfinished():
                arrive(later)
                later = []
            for rid, to in (moves or {}).get(serving.rounds, {}).items():
                serving.move(rid, to)
            out.update(serving.step().finished)
    return out, serving


@pytest.mark.parametrize(("seed", "ahead"), [(0, False), (1, False), (2, False), (10, True), (11, True)])
def test_interleaved_tokens_equal_each_batch_alone_for_random_splits_and_late_recalls(tiny_qwen3, seed: int,
                                                                                      ahead: bool) -> None:
    """Also with `ahead`: each offload piece also posts the next layer's predicted recall, and the next piece waits
    for it before its selection. The selection stays the layer's own, so the tokens are those without it; the
    prefetches moved bytes, and are recalls IRQ never waits on."""
    path = str(tiny_qwen3[0])
    rng = random.Random(seed)
    classes = {rid: rng.choice([NRM, OFF]) for rid in range(rng.randint(3, 7))}
    classes[0], classes[1] = NRM, OFF                                   # both batches, always
    both, serving = _serve(path, classes, late=rng.randint(1, 6), seed=seed, ahead=ahead, late_loads=rng.randint(1, 6))
    alone = {}
    for kv_class in (NRM, OFF):
        alone.update(_serve(path, {r: c for r, c in classes.items() if c is kv_class}, irq=False, seed=seed)[0])
    assert both == alone and all(len(both[r]) == 10 + r % 5 for r in classes)
    stats = serving.inner.stats
    recalls, recalled, prefetched = serving.recall_statistics()
    assert stats.recalls == sum(stats.m.values()) > 0                  # rounds with both batches interleave
    assert stats.recalls <= recalls                                     # an offload batch alone runs whole
    assert (0 < prefetched < recalled and stats.recalls < recalls) if ahead else prefetched == 0
    assert serving.offload.offloader.recaller.held_checks > 0, "no recall landed late"   # type: ignore[union-attr]
    loads = [eng.handoff_loads for eng in (serving.normal, serving.offload)]            # type: ignore[union-attr]
    assert sum(lo.held_checks for lo in loads) > 0, "no handed-in KV landed late"       # type: ignore[attr-defined]


def test_an_offload_request_whose_kv_is_loading_sits_rounds_out_while_the_normal_batch_runs(tiny_qwen3) -> None:
    """Request 2 (offload) arrives after the first round, alone in its engine, while request 0 (normal) decodes: its
    handed-in KV lands late (`LateLoads`), and the rounds go on without it rather than wait for it on the device."""
    path = str(tiny_qwen3[0])
    classes = {0: NRM, 2: OFF}
    both, serving = _serve(path, classes, seed=5, late_loads=4)
    alone = {}
    for kv_class in (NRM, OFF):
        alone.update(_serve(path, {r: c for r, c in classes.items() if c is kv_class}, irq=False, seed=5)[0])
    assert both == alone
    loads = serving.offload.handoff_loads                                   # type: ignore[union-attr]
    assert loads.held_checks > 0 and loads.taken_early == 0                 # type: ignore[attr-defined]
    assert serving.handoff_statistics().landed >= 1                         # request 2's, at a round's start


def test_a_recall_the_host_never_sees_land_is_waited_for_on_the_device_after_its_share(tiny_qwen3) -> None:
    out, serving = _serve(str(tiny_qwen3[0]), {0: NRM, 1: OFF}, late=1000)
    stats = serving.inner.stats
    steps = 10                                  # both requests decode together for request 0's 10 tokens
    assert stats.device_waits == stats.recalls >= 2 * steps and stats.seen_landed == 0    # 2 offloaded layers
    assert set(stats.m) == {1}, stats.m         # the normal pieces spread over the recalls, one each
    assert out == _serve(str(tiny_qwen3[0]), {0: NRM, 1: OFF}, irq=False)[0]


def test_irq_and_coupled_batches_give_the_same_tokens(tiny_qwen3) -> None:
    classes = {0: NRM, 1: OFF, 2: OFF, 3: NRM}
    assert _serve(str(tiny_qwen3[0]), classes)[0] == _serve(str(tiny_qwen3[0]), classes, irq=False)[0]


@pytest.mark.parametrize("steps", [2, 3])
def test_normal_steps_run_between_the_offload_layers_and_each_request_keeps_its_tokens(tiny_qwen3, steps: int) -> None:
    """The normal batch decodes up to `steps` steps a round under IRQ, its tokens fed back on the device between
    them: every request's tokens are its tokens alone, the recalls' shares of normal pieces grow to `steps`, and
    the normal requests finish in fewer rounds."""
    path = str(tiny_qwen3[0])
    classes = {0: OFF, 1: OFF, 2: NRM, 3: NRM, 4: NRM}                  # the normal requests the longest
    out, serving = _serve(path, classes, late=1000, normal_steps=steps)
    alone, single = _serve(path, classes, irq=False)[0], _serve(path, classes, late=1000)[1]
    assert out == alone and all(len(out[r]) == 10 + r % 5 for r in classes)
    assert max(serving.inner.stats.m) == steps and max(single.inner.stats.m) == 1
    assert max(serving.normal_step_counts) == steps and set(single.normal_step_counts) == {1}
    assert serving.rounds < single.rounds
    with pytest.raises(ValueError, match=r"^normal_steps=2 runs the normal batch's steps between the offload "
                                         r"batch's layers, which pulseinfer's IRQ does; pulseinfer --no-irq does "
                                         r"not interleave$"):
        ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1, host_kv_bytes=1, irq=False, normal_steps=2)
