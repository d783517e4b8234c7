"""Riders: the normal engine's requests in the offload batch's step (`StepRiders`), one set of projections for both.
Each request's logits equal those of its own engine's step, step after step, whole or piece by piece."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence as Seq

import pytest
import torch

from pulseio_engine.config import DType
from pulseio_engine.kv.handoff import RandomKV
from pulseio_engine.kv.recall import PendingRecall, Recaller
from pulseio_engine.kv.retrieval_heads import RetrievalHeads
from pulseio_engine.model.checkpoint import load_checkpoint
from pulseio_engine.offload import DeviceSparseBatch
from pulseio_engine.offload_graph import StepRiders
from pulseio_engine.request import Sequence
from pulseio_engine.runner import RiderSeqs, rider_rows
from pulseio_engine.serving.budget import KVClass
from pulseio_engine.serving.config import ServeMode, ServingConfig
from pulseio_engine.serving.engine import ServingEngine

NRM, OFF = KVClass.NORMAL, KVClass.OFFLOAD
HEADS = RetrievalHeads(2, best=(0, 1, 0), worst=(1, 0, 1))
CLASSES = {0: NRM, 1: OFF, 2: NRM, 3: OFF, 4: OFF}


def _serving(path: str, *, dense_layers: int = 1) -> ServingEngine:
    """Requests of both classes, prompts of 60-330 tokens handed in, each to decode 8 tokens."""
    ckpt = load_checkpoint(path, dtype=torch.float32, device="cpu")
    config = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=64 << 20, host_kv_bytes=64 << 20, token_budget=64,
                           block_size=16, dense_layers=dense_layers, max_batch=16)
    serving = ServingEngine(config, ckpt, device="cpu", dtype=DType.FLOAT32, max_model_len=512, heads=HEADS)
    for rid, kv_class in CLASSES.items():
        rng = random.Random(rid)
        length = 60 + 67 * rid
        serving.add(rid, [rng.randrange(3, 256) for _ in range(length)], 8, kv_class,
                    kv=RandomKV(length - 1, seed=rid, std=0.5))
    return serving


def _decoding(serving: ServingEngine) -> tuple[tuple[Sequence, ...], tuple[Sequence, ...]]:
    """Each engine's decode batch this round (the prompts were handed in: no prefill)."""
    batches = []
    for eng in (serving.normal, serving.offload):
        assert eng is not None
        work = eng.schedule()
        assert not work.prefill and work.decode
        batches.append(tuple(work.decode))
    return batches[0], batches[1]


def _commit(serving: ServingEngine, normal: Seq[Sequence], offload: Seq[Sequence], logits_normal: torch.Tensor,
            logits_offload: torch.Tensor) -> None:
    assert serving.offload is not None
    serving.normal.commit_decode(normal, logits_normal.argmax(dim=-1).tolist())
    serving.offload.commit_decode(offload, logits_offload.argmax(dim=-1).tolist())


@pytest.mark.parametrize("split", [False, True])
def test_riders_get_the_logits_of_their_own_engines_step_for_steps_in_a_row(tiny_qwen3, split: bool) -> None:
    """Two engines built alike: one steps each batch on its own engine, the other runs the offload batch with the
    normal requests riding. Eight steps, the contexts crossing blocks, the hot sets refilling: the same logits
    (float32 on a CPU; only the projections' row count differs) and so the same tokens."""
    path = str(tiny_qwen3[0])
    with _serving(path) as alone, _serving(path) as riding:
        assert alone.offload is not None and riding.offload is not None
        for step in range(8):
            normal, offload = _decoding(alone)
            logits_n = alone.normal.runner.offload_step(normal, alone.normal.offloader, split=split).run().clone()
            logits_o = alone.offload.runner.offload_step(offload, alone.offload.offloader, split=split).run().clone()
            normal_r, offload_r = _decoding(riding)
            assert [s.request_id for s in normal_r] == [s.request_id for s in normal] and len(normal) == 2
            riders = RiderSeqs(riding.normal.kv, riding.normal.offloader, normal_r)
            graph = riding.offload.runner.offload_step(offload_r, riding.offload.offloader, split=split, riders=riders)
            logits = graph.run().clone()
            assert logits.shape[0] == len(offload) + rider_rows(len(normal)), "riders in padded rows"
            rode = logits[len(offload):len(offload) + len(normal)]
            torch.testing.assert_close(logits[:len(offload)], logits_o, rtol=1e-5, atol=1e-5, msg=f"step {step}")
            torch.testing.assert_close(rode, logits_n, rtol=1e-5, atol=1e-5, msg=f"step {step}")
            _commit(alone, normal, offload, logits_n, logits_o)
            _commit(riding, normal_r, offload_r, rode, logits[:len(offload)])
        assert riding.offload.runner.step_graphs_built == 1, "one graph, reused with its riders every step"
        recalled = [e.offload.offloader.statistics().bytes_recalled for e in (alone, riding)]   # type: ignore[union-attr]
        assert recalled[0] == recalled[1] > 0


@pytest.mark.parametrize("split", [False, True])
def test_riders_attend_while_the_batchs_recall_flies(tiny_qwen3, monkeypatch, split: bool) -> None:
    """A ridden layer's riders store, select and attend between the batch's recall post and its device wait: none
    of it reads a slot the recall writes, so it hides the recall instead of following it."""
    path = str(tiny_qwen3[0])
    events: list[tuple[str, int]] = []

    def logged(name: str, method, tag_of):
        def call(self, *args, **kwargs):
            events.append((name, tag_of(self, args, kwargs)))
            return method(self, *args, **kwargs)
        return call

    monkeypatch.setattr(Recaller, "post", logged("post", Recaller.post, lambda _, a, k: k["tag"]))
    monkeypatch.setattr(PendingRecall, "wait_device", logged("wait", PendingRecall.wait_device, lambda s, a, k: s.tag))
    for name in ("prepare", "finish"):                     # the riders' batch: every block on the GPU
        monkeypatch.setattr(DeviceSparseBatch, name, logged(name, getattr(DeviceSparseBatch, name),
                                                            lambda _, a, k: a[0]))
    with _serving(path) as riding:
        assert riding.offload is not None
        normal, offload = _decoding(riding)
        riders = RiderSeqs(riding.normal.kv, riding.normal.offloader, normal)
        riding.offload.runner.offload_step(offload, riding.offload.offloader, split=split, riders=riders).run()
    posted = [tag for kind, tag in events if kind == "post"]
    assert len(posted) == riding.offload.runner.model.config.num_layers - 1, events      # every offloaded layer
    for layer in posted:
        at = {kind: events.index((kind, layer)) for kind in ("post", "prepare", "finish", "wait")}
        assert at["post"] < at["prepare"] < at["finish"] < at["wait"], (layer, events)


def test_riders_must_keep_every_block_on_the_gpu_and_offload_from_the_same_layer_and_a_second_batch_its_rows(
        tiny_qwen3) -> None:
    path = str(tiny_qwen3[0])
    with _serving(path) as serving, _serving(path, dense_layers=2) as other:
        assert serving.offload is not None and other.normal.offloader is not None
        normal, offload = _decoding(serving)
        with pytest.raises(ValueError, match="keeps every block on the GPU"):
            StepRiders(serving.offload.kv, serving.offload.offloader, (offload[0].request_id,))
        with pytest.raises(ValueError, match="at least one request"):
            StepRiders(serving.normal.kv, serving.normal.offloader, ())
        off = serving.offload.offloader
        later = [s.request_id for s in offload[1:]][::-1]              # a second batch its seats do not hold so
        with pytest.raises(ValueError, match=re.escape(f"requests {later} are not in rows [1, {1 + len(later)})")):
            off.begin(later, first_row=1)
        off.arrange([offload[0].request_id, *later])
        assert off.begin(later, first_row=1).mask.data_ptr() == off.seats.batch("mask", len(later), 1).data_ptr()
        riders = RiderSeqs(other.normal.kv, other.normal.offloader, _decoding(other)[0])
        with pytest.raises(ValueError, match="offloads from layer 2, this batch's from layer 1"):
            serving.offload.runner.offload_step(offload, serving.offload.offloader, riders=riders)


def _serve(path: str, classes: dict[int, KVClass], *, halves: bool, irq: bool = True, overlap: bool = False,
           seed: int = 0, ride: bool = False, hot_cache: float = 1.0,
           ahead: bool = False) -> tuple[dict[int, tuple[int, ...]], ServingEngine]:
    """Requests of random lengths, all arriving at once in the given classes, served to the end; the offload
    requests' hot sets hold `hot_cache` budgets, their layers recalled `ahead` or not."""
    ckpt = load_checkpoint(path, dtype=torch.float32, device="cpu")
    config = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=64 << 20, host_kv_bytes=64 << 20,
                           irq=False if ride else irq, token_budget=64, block_size=16, dense_layers=1, max_batch=32,
                           halves=halves, overlap_rounds=overlap, ride=ride, hot_cache=hot_cache,
                           ahead=ahead)
    out: dict[int, tuple[int, ...]] = {}
    with ServingEngine(config, ckpt, device="cpu", dtype=DType.FLOAT32, max_model_len=512, heads=HEADS) as serving:
        for rid, kv_class in classes.items():
            rng = random.Random(1000 * seed + rid)
            length = 40 + (97 * rid + 31 * seed) % 300
            serving.add(rid, [rng.randrange(3, 256) for _ in range(length)], 6 + rid % 5, kv_class,
                        kv=RandomKV(length - 1, seed=rid, std=0.5))
        pending = None
        while serving.has_unfinished() or pending is not None:
            outcomes, pending = serving.run_round(pending)
            for outcome in outcomes:
                out.update(outcome.finished)
    return out, serving


def _classes(seed: int, requests: int, always: dict[int, KVClass]) -> dict[int, KVClass]:
    """Up to 8 requests of random classes, or `requests` normal ones (batches past 16 riders' rows), then `always`."""
    rng = random.Random(seed)
    if requests <= 8:
        classes = {rid: rng.choice([NRM, OFF]) for rid in range(rng.randint(5, requests))}
    else:
        classes = dict.fromkeys(range(requests), NRM)
    return {**classes, **always}


def _served_alone(path: str, classes: dict[int, KVClass], seed: int) -> dict[int, tuple[int, ...]]:
    """Each request's tokens served by its class alone (one coupled batch)."""
    alone: dict[int, tuple[int, ...]] = {}
    for kv_class in (NRM, OFF):
        alone.update(_serve(path, {r: c for r, c in classes.items() if c is kv_class}, halves=False, irq=False,
                            seed=seed)[0])
    return alone


@pytest.mark.parametrize(("seed", "overlap", "requests", "ahead"), [(0, False, 8, False), (1, True, 8, False),
                                                                  (2, True, 8, False), (3, True, 24, False),
                                                                  (4, True, 8, True), (5, False, 12, True)])
def test_halves_give_each_request_its_tokens_alone(tiny_qwen3, seed: int, overlap: bool, requests: int,
                                                   ahead: bool) -> None:
    """The offload batch in two halves, the normal requests riding in the first (in padded rows): every request's
    tokens are its tokens served by its class alone, rounds overlapped or not, as requests finish and the halves
    change size; also with each half's layers recalled a layer early (hot sets of 1.5 budgets), which moves bytes."""
    path = str(tiny_qwen3[0])
    classes = _classes(seed, requests, {0: NRM, 1: OFF, 2: OFF, 3: OFF})      # halves of two and more, always
    out, serving = _serve(path, classes, halves=True, overlap=overlap, seed=seed, ahead=ahead,
                          hot_cache=1.5 if ahead else 1.0)
    assert out == _served_alone(path, classes, seed) and all(len(out[r]) == 6 + r % 5 for r in classes)
    _, recalled, prefetched = serving.recall_statistics()
    assert (0 < prefetched < recalled) if ahead else prefetched == 0
    both = sum(n for (normal, offload), n in serving.batch_sizes.items() if normal and offload >= 2)
    assert 0 < serving.halves_rounds == both, "halves where both batches run, the offload one of 2 or more"
    assert max(normal for normal, _ in serving.batch_sizes) > 16 or requests <= 16, "riders past 16 rows"


@pytest.mark.parametrize(("seed", "overlap", "requests", "hot_cache", "ahead"),
                         [(0, False, 8, 1.0, False), (1, True, 8, 1.0, False), (3, True, 24, 1.0, False),
                          (4, True, 8, 1.5, False), (5, True, 8, 1.5, True), (6, False, 24, 2.0, True)])
def test_a_ridden_round_gives_each_request_its_tokens_alone(tiny_qwen3, seed: int, overlap: bool,
                                                             requests: int, hot_cache: float, ahead: bool) -> None:
    """`ride`: one step a round, the normal requests riding in the offload batch's (in padded rows). Every request's
    tokens are its tokens served by its class alone (hot sets of one budget), rounds overlapped or not, as batches
    change size, with hot sets of one budget or larger, each layer recalled a layer early or not; rounds with one
    class run its step alone; a ridden step reads the weights once."""
    path = str(tiny_qwen3[0])
    classes = _classes(seed, requests, {0: NRM, 1: OFF})
    out, serving = _serve(path, classes, halves=False, overlap=overlap, seed=seed, ride=True, hot_cache=hot_cache,
                          ahead=ahead)
    assert out == _served_alone(path, classes, seed) and all(len(out[r]) == 6 + r % 5 for r in classes)
    both = sum(n for (normal, offload), n in serving.batch_sizes.items() if normal and offload)
    assert 0 < serving.ridden_rounds == both and serving.halves_rounds == 0
    assert serving.read.steps == serving.rounds, "one forward a round: a ridden round reads the weights once"
    assert max(normal for normal, _ in serving.batch_sizes) > 16 or requests <= 16, "riders past 16 rows"


def test_ride_is_pulseinfer_without_irq() -> None:
    config = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1 << 20, host_kv_bytes=1 << 20, ride=True)
    assert not config.interleaves and config.describe() == "pulseinfer --ride"
    for bad in ({"irq": True}, {"mode": ServeMode.OFFLOAD_SYNC}):
        with pytest.raises(ValueError, match="ride carries the normal requests in pulseinfer's offload step"):
            ServingConfig(**{"mode": ServeMode.PULSEINFER, **bad}, gpu_kv_bytes=1 << 20,  # type: ignore[arg-type]
                          host_kv_bytes=1 << 20, ride=True)
    with pytest.raises(ValueError, match="does not interleave"):
        ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1 << 20, host_kv_bytes=1 << 20, ride=True, halves=True)


def test_ahead_is_pulseinfer_s_in_every_form_and_no_other_mode_s() -> None:
    """`ahead` recalls through pulseinfer's doorbell: ridden, coupled, IRQ's pieces or halves; not offload-sync."""
    kw = {"gpu_kv_bytes": 1 << 20, "host_kv_bytes": 1 << 20, "hot_cache": 1.5, "ahead": True}
    assert ServingConfig(ServeMode.PULSEINFER, ride=True, **kw).describe() == "pulseinfer --ride --ahead"
    assert ServingConfig(ServeMode.PULSEINFER, irq=False, **kw).describe() == "pulseinfer --no-irq --ahead"
    assert ServingConfig(ServeMode.PULSEINFER, **kw).describe() == "pulseinfer --ahead"
    assert ServingConfig(ServeMode.PULSEINFER, halves=True, **kw).ahead
    with pytest.raises(ValueError, match="^ahead recalls each layer's predicted blocks during the layer before, "
                                         "through pulseinfer's doorbell; offload-sync has no such recall$"):
        ServingConfig(ServeMode.OFFLOAD_SYNC, **kw)    # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"needs doorbell recalls and hot_cache > 1 \(got recall 'offload-doorbell', "
                                         r"hot_cache 1.0\)"):
        ServingConfig(ServeMode.PULSEINFER, ride=True, **{**kw, "hot_cache": 1.0})


def test_rider_rows_and_padding_seats() -> None:
    assert [rider_rows(n) for n in (0, 1, 16, 17, 32, 33, 100)] == [16, 16, 16, 32, 32, 64, 128]


def test_padding_seats_are_all_on_gpu_only_and_fit_their_rows(tiny_qwen3) -> None:
    with _serving(str(tiny_qwen3[0])) as serving:
        assert serving.offload is not None and serving.normal.offloader is not None
        with pytest.raises(ValueError, match="an offload request's row needs host units"):
            serving.offload.offloader.padded([1], 4)
        with pytest.raises(ValueError, match="3 requests do not fit 2 rows"):
            serving.normal.offloader.padded([0, 1, 2], 2)
        assert serving.normal.offloader.padded([5], 3) == (5, -1, -2)
        pads = serving.normal.offloader.padded([], 20)
        assert pads == tuple(range(-1, -21, -1)) and serving.normal.offloader.padding_seats == 20
        serving.normal.offloader.arrange(pads)                      # every padding id is seated


def test_halves_need_irq_and_one_normal_step() -> None:
    with pytest.raises(ValueError, match="does not interleave"):
        ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1 << 20, host_kv_bytes=1 << 20, irq=False, halves=True)
    with pytest.raises(ValueError, match="leave normal_steps at 1"):
        ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1 << 20, host_kv_bytes=1 << 20, halves=True, normal_steps=2)


def test_halves_are_kept_as_pairs_by_their_sizes_and_pair_only_split_steps_of_one_offloader(tiny_qwen3) -> None:
    with _serving(str(tiny_qwen3[0])) as serving:
        assert serving.offload is not None
        runner, off = serving.offload.runner, serving.offload.offloader
        normal, offload = _decoding(serving)
        riders = RiderSeqs(serving.normal.kv, serving.normal.offloader, normal)
        pair = runner.offload_halves(offload[:2], offload[2:], off, riders)
        assert runner.offload_halves(offload[:2], offload[2:], off, riders) == pair and runner.step_graphs_built == 2
        alone = RiderSeqs(serving.normal.kv, serving.normal.offloader, normal[:1])
        assert runner.offload_halves(offload[:2], offload[2:], off, alone) == pair, "riders padded to 16 rows"
        seated = [s.request_id for s in normal[:1]] + list(range(-1, -16, -1))
        assert serving.normal.offloader.seats.holds(seated) and runner.step_graphs_built == 2
        other = runner.offload_halves(offload[:1], offload[1:], off, riders)
        assert other != pair and runner.step_graphs_built == 4
        serving.normal.offloader.padded([], 64)              # the riders' seats grow: their pairs read old rows
        assert pair[0].stale and not pair[1].stale
        assert runner.offload_halves(offload[:2], offload[2:], off, riders) != pair and runner.step_graphs_built == 6
        assert off.seats.holds([s.request_id for s in offload]), "the second half's rows follow the first's"
        whole = runner.offload_step(offload, off)
        with pytest.raises(ValueError, match="halves are two split steps"):
            pair[0].pair(whole)
        with pytest.raises(ValueError, match="one offloader's batches"):
            pair[0].pair(serving.normal.runner.offload_step(normal, serving.normal.offloader, split=True))
        with pytest.raises(ValueError, match="halves pair two fresh steps"):
            pair[0].pair(other[1])
