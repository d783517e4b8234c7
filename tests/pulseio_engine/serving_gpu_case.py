"""One GPU serving case in its own process (run by test_serving_gpu.py under a hard timeout, with a thread dump
before it): python serving_gpu_case.py CASE [ARGS]. Prints one JSON line; exits 0 when the case holds.

    tokens [ahead]              the tiny preset in bf16: each batch alone (coupled), both coupled, both under IRQ
                                with captured recalls, and IRQ with recalls made to land late, in one stream and
                                in two (`two_streams`): the same tokens (`ahead`: every run also recalls each
                                layer's predicted blocks during the layer before, into hot sets of 1.5 budgets)
    vanilla                     vanilla's rounds overlapped, the GPU held back so the host enqueues rounds ahead of
                                it: the tokens of rounds run one at a time
    halves [ahead]              the offload batch as two halves (`halves`), the normal requests riding in the first
                                half's step, captured recalls and late ones, overlapped or not: each class's tokens
                                served alone (`ahead`: recalling ahead too)
    ride                        the same with the normal requests riding in the offload batch's one step (`ride`)
    ahead [F]                   ride with each layer's blocks recalled a layer early too (`ahead`, hot sets of 1.5
                                budgets, a prediction of F budgets: `ahead_budget`, default 1): each class's tokens
                                served alone; captured, the prediction, the riders and the resident attention on
                                three streams (branches of the graph)
    nosync ROUNDS [overlap] [two-streams] [halves | ride] [ahead]
                                steady-state IRQ rounds, halves or ridden ones (no admission, no capture), recalling
                                ahead or not, under torch.cuda.set_sync_debug_mode("error")
    nosync-admit [ride] [ahead] overlapped rounds under set_sync_debug_mode("error") while an offload request with
                                handed-in KV is admitted (its load beside the rounds), joins a batch of a size
                                captured before, decodes and finishes; a normal one too
    cost MODEL BATCH CTX ROUNDS a normal batch alone, ms a round: under IRQ (one graph: nothing to interleave
                                with) against without it, each the best of two runs in the order whole, irq,
                                irq, whole; and in per-layer pieces, reported (us a piece)
    replay                      the tiny preset on 50 Mooncake requests: every request complete, pulseio's
                                submitted == completed, no failed recall

CASE_DEVICE=cpu runs a case on the CPU (the tokens and replay cases check themselves there too).
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch

from pulseio_engine.config import DType
from pulseio_engine.kv.handoff import RandomKV
from pulseio_engine.kv.retrieval_heads import RetrievalHeads
from pulseio_engine.model.checkpoint import load_checkpoint, open_model
from pulseio_engine.offload import DeviceSparseBatch, OffloadBatch
from pulseio_engine.offload_graph import OffloadStepGraph
from pulseio_engine.serving.batches import DecodeBatch, HostTokens, pinned_tokens
from pulseio_engine.serving.budget import KVClass
from pulseio_engine.serving.config import ServeMode, ServingConfig
from pulseio_engine.serving.engine import ServingEngine
from pulseio_engine.serving.testing import LateRecaller

DEVICE = os.environ.get("CASE_DEVICE", "cuda")
DTYPE = DType.BFLOAT16 if DEVICE == "cuda" else DType.FLOAT32
NRM, OFF = KVClass.NORMAL, KVClass.OFFLOAD


def _engine(model: str, *, irq: bool, gpu_bytes: int = 1 << 30, budget: int = 256, normal_steps: int = 1,
            overlap: bool = False, mode: ServeMode = ServeMode.PULSEINFER, two_streams: bool = False,
            halves: bool = False, ride: bool = False, ahead: bool = False, ahead_budget: float = 1.0
            ) -> ServingEngine:
    source = open_model(model)
    ckpt = load_checkpoint(source, dtype=torch.bfloat16 if DEVICE == "cuda" else torch.float32, device=DEVICE)
    m = source.config
    heads = RetrievalHeads(m.num_kv_heads, best=(0,) * m.num_layers, worst=(1,) * m.num_layers)
    host = 0 if mode is ServeMode.VANILLA else 4 << 30
    config = ServingConfig(mode, gpu_kv_bytes=gpu_bytes, host_kv_bytes=host, irq=irq,
                           token_budget=budget, max_batch=64, normal_steps=normal_steps,
                           max_offload_seqs=None if mode is ServeMode.VANILLA else 32,
                           overlap_rounds=overlap, two_streams=two_streams and DEVICE == "cuda", halves=halves,
                           ride=ride, ahead=ahead, ahead_budget=ahead_budget if ahead else 1.0,
                           hot_cache=1.5 if ahead else 1.0)
    return ServingEngine(config, ckpt, device=DEVICE, dtype=DTYPE, max_model_len=m.max_position_embeddings,
                         heads=heads)


def _add(serving: ServingEngine, classes: dict[int, KVClass], context: int, new: int, vocab: int) -> None:
    for rid, kv_class in classes.items():
        length = context + 37 * rid
        prompt = [(rid * 31 + 7 * i) % vocab for i in range(length)]
        serving.add(rid, prompt, new, kv_class, kv=RandomKV(length - 1, seed=rid))


def _run(serving: ServingEngine, hold_cycles: int = 0) -> dict[int, list[int]]:
    """Rounds until every request is done; `hold_cycles`: a GPU spin enqueued before each round (a GPU behind)."""
    out: dict[int, list[int]] = {}
    pending = None
    while serving.has_unfinished():
        if hold_cycles:
            torch.cuda._sleep(hold_cycles)
        outcomes, pending = serving.run_round(pending)
        for outcome in outcomes:
            out.update({rid: list(t) for rid, t in outcome.finished.items()})
    return out


def tokens(ahead: bool = False) -> dict:
    classes = {0: NRM, 1: OFF, 2: NRM, 3: OFF, 4: OFF}
    runs = {}
    # the 3-step rounds first, in a process that has launched no kernel yet: their advances between steps must
    # not be the first launch of a kernel inside the offload batch's step (it would wait for the copier)
    for name, irq, late, which, steps, overlap, streams in (
            ("irq 3 steps", True, None, None, 3, False, False), ("irq 3 steps late", True, 6, None, 3, False, False),
            ("normal alone", False, None, NRM, 1, False, False), ("offload alone", False, None, OFF, 1, False, False),
            ("coupled", False, None, None, 1, False, False), ("irq", True, None, None, 1, False, False),
            ("irq late", True, 6, None, 1, False, False), ("irq overlapped", True, None, None, 1, True, False),
            ("irq late overlapped", True, 6, None, 1, True, False),
            ("irq two streams", True, None, None, 1, True, True),
            ("irq late two streams", True, 6, None, 1, True, True),
            ("irq 3 steps late two streams", True, 6, None, 3, True, True)):
        runs[name] = _serve({r: c for r, c in classes.items() if which in (None, c)}, late, irq=irq,
                            normal_steps=steps, overlap=overlap, two_streams=streams, ahead=ahead)
    alone = {**runs["normal alone"]["tokens"], **runs["offload alone"]["tokens"]}
    ok = all(runs[k]["tokens"] == alone for k in runs if k not in ("normal alone", "offload alone"))
    ok = ok and max(runs["irq 3 steps late"]["m"], default=0) > 1       # a late recall spans several normal layers
    ok = ok and _recalls_clean(runs)
    ok = ok and all((runs[k]["ahead_bytes"] > 0) == ahead for k in runs if k != "normal alone")   # every step too
    return {"ok": ok, **_without_tokens(runs)}


def _serve(classes: dict[int, KVClass], late: int | None, **engine: Any) -> dict:
    """The tiny preset's requests of `classes` served to the end by `_engine(**engine)`, their recalls landing
    after up to `late` landing checks (`LateRecaller`; None: as they land) -> their tokens and the run's counters."""
    with _engine("tiny", **engine) as serving:
        if late is not None:
            off = serving.offload.offloader                          # type: ignore[union-attr]
            off.recaller = LateRecaller(off.recaller, max_checks=late, seed=1)
        _add(serving, classes, 700, 24, 256)
        stats = serving.inner.stats
        return {"tokens": _run(serving), "rounds": serving.rounds, "warming_rounds": serving.warming_rounds,
                "halves_rounds": serving.halves_rounds, "ridden_rounds": serving.ridden_rounds, "m": dict(stats.m),
                "device_waits": stats.device_waits, "ahead_bytes": serving.recall_statistics()[2],
                "runtime": _runtime(serving)}


def _recalls_clean(runs: dict[str, dict]) -> bool:
    """Whether every run's pulseio runtime (if it had one) failed and expired no recall."""
    return all(r["runtime"] is None or (r["runtime"]["failed"] == 0 and r["runtime"]["expired"] == 0)
               for r in runs.values())


def _without_tokens(runs: dict[str, dict]) -> dict[str, dict]:
    return {k: {key: v for key, v in r.items() if key != "tokens"} for k, r in runs.items()}


def riders(kind: str, ahead: bool = False, ahead_budget: float = 1.0) -> dict:
    """The normal requests riding in the offload batch's step: `kind` "halves", the offload batch in two halves whose
    pieces are captured into one RecallGraph (IRQ), or "ride", one whole step a round (`ahead`: each layer's blocks
    also recalled during the layer before, into hot sets of 1.5 budgets, predicted at `ahead_budget`). With captured
    recalls and recalls made to land late (eager posts), rounds overlapped or not: every request's tokens are its
    class's served alone."""
    classes = {0: NRM, 1: OFF, 2: NRM, 3: OFF, 4: OFF, 5: OFF}
    runs = {}
    for name, late, which, overlap in (
            (kind, None, None, False), ("normal alone", None, NRM, False), ("offload alone", None, OFF, False),
            (f"{kind} late", 6, None, False), (f"{kind} overlapped", None, None, True),
            (f"{kind} late overlapped", 6, None, True)):
        riding = which is None
        with _captured_streams() as captures:
            runs[name] = _serve({r: c for r, c in classes.items() if which in (None, c)}, late,
                                irq=kind == "halves" and riding, overlap=overlap, ahead=ahead and riding,
                                ahead_budget=ahead_budget,
                                **{kind: riding})
        if name == kind == "ride" and ahead and DEVICE == "cuda":   # (halves are captured piece by piece)
            runs[name]["streams"] = [{k: sorted(v) for k, v in c.items()} for c in captures]
    alone = {**runs["normal alone"]["tokens"], **runs["offload alone"]["tokens"]}
    ridden = [k for k in runs if k.startswith(kind)]
    differ = [k for k in ridden if runs[k]["tokens"] != alone]
    ok = not differ and sorted(len(t) for t in alone.values()) == [24] * len(classes)
    counter = "halves_rounds" if kind == "halves" else "ridden_rounds"
    ok = ok and all(0 < runs[k][counter] for k in ridden)
    ok = ok and all((runs[k]["ahead_bytes"] > 0) == ahead for k in ridden)     # captured and late steps prefetched
    ok = ok and _recalls_clean(runs)
    if "streams" in runs[kind]:      # each ridden capture: three branches of the graph, no stream holds two of them
        captured = runs[kind]["streams"]
        ok = ok and bool(captured) and all(
            all(c.values()) and sum(map(len, c.values())) == len(set().union(*c.values())) for c in captured)
    return {"ok": ok, "differ": differ, **_without_tokens(runs)}


@contextlib.contextmanager
def _captured_streams() -> Iterator[list[dict[str, set[int]]]]:
    """While open: for each capture of a ridden step (`OffloadStepGraph._capture` with riders), the streams it
    enqueued its layers' predictions (`OffloadBatch.prefetch`), riders' selections (`DeviceSparseBatch.prepare`) and
    resident attention (`OffloadBatch.attend_resident`) on. Per capture: torch hands streams out of a pool, so two
    steps' streams may be the same."""
    captures: list[dict[str, set[int]]] = []
    methods = {"prediction": (OffloadBatch, "prefetch"), "riders": (DeviceSparseBatch, "prepare"),
               "resident": (OffloadBatch, "attend_resident"), "capture": (OffloadStepGraph, "_capture")}
    saved = {name: getattr(cls, attr) for name, (cls, attr) in methods.items()}
    capturing: list[dict[str, set[int]] | None] = [None]     # the ridden capture under way, if one is

    def spy(name: str) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if name == "capture":
                ridden = getattr(self, "rider_batch", None) is not None
                capturing[0] = {"prediction": set(), "riders": set(), "resident": set()} if ridden else None
                try:
                    return saved[name](self, *args, **kwargs)
                finally:
                    if capturing[0] is not None:
                        captures.append(capturing[0])
                    capturing[0] = None
            if capturing[0] is not None and torch.cuda.is_current_stream_capturing():
                capturing[0][name].add(torch.cuda.current_stream().cuda_stream)
            return saved[name](self, *args, **kwargs)
        return call

    for name, (cls, attr) in methods.items():
        setattr(cls, attr, spy(name))
    try:
        yield captures
    finally:
        for name, (cls, attr) in methods.items():
            setattr(cls, attr, saved[name])


def vanilla() -> dict:
    """Vanilla's rounds are one graph each, so overlapped the host may enqueue several before the GPU runs the
    first: each must keep its own inputs (their uploads' pinned staging among them)."""
    runs = {}
    for name, overlap, hold in (("alone", False, 0), ("overlapped", True, 0),
                                ("overlapped, GPU behind", True, 4_000_000 if DEVICE == "cuda" else 0)):
        with _engine("tiny", irq=False, overlap=overlap, mode=ServeMode.VANILLA) as serving:
            _add(serving, {0: NRM, 1: NRM, 2: NRM, 3: NRM}, 700, 24, 256)
            runs[name] = _run(serving, hold)
    ok = runs["overlapped"] == runs["alone"] == runs["overlapped, GPU behind"]
    ok = ok and sorted(len(t) for t in runs["alone"].values()) == [24] * 4
    return {"ok": ok, "differ": [k for k, v in runs.items() if v != runs["alone"]]}


@contextlib.contextmanager
def _host_syncs_refused() -> Iterator[list[str]]:
    """Within the block a host sync raises (`torch.cuda.set_sync_debug_mode("error")`; no check on a CPU); the
    error it raised, if any, ends the block and is in the list yielded."""
    errors: list[str] = []
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield errors
    except RuntimeError as exc:
        errors.append(str(exc))
    finally:
        if DEVICE == "cuda":
            torch.cuda.set_sync_debug_mode(0)


def nosync(rounds: int, overlap: bool = False, two_streams: bool = False, halves: bool = False,
           ride: bool = False, ahead: bool = False) -> dict:
    with _engine("tiny", irq=not ride, overlap=overlap, two_streams=two_streams, halves=halves, ride=ride,
                 ahead=ahead) as serving:
        _add(serving, {0: NRM, 1: OFF, 2: NRM, 3: OFF, 4: OFF}, 900, rounds + 8, 256)
        for _ in range(4):                   # admission, the eager steps, the captures
            serving.step()
        pending = None
        for _ in range(2 if overlap else 0):     # the second feeds the first's tokens: its kernels load here
            _, pending = serving.run_round(pending)
        with _host_syncs_refused() as errors:
            for _ in range(rounds):
                _, pending = serving.run_round(pending)
        error = errors[0] if errors else None
        stats = serving.inner.stats
        ran = stats.recalls > 0                                         # IRQ's pieces posted recalls
        if halves or ride:                                               # no IRQ pieces: the rounds as asked
            ran = (serving.halves_rounds if halves else serving.ridden_rounds) >= rounds
        return {"ok": error is None and ran, "error": error, "recalls": stats.recalls,
                "halves_rounds": serving.halves_rounds, "ridden_rounds": serving.ridden_rounds,
                "seen_landed": stats.seen_landed, "device_waits": stats.device_waits}


def nosync_admit(ride: bool = False, ahead: bool = False) -> dict:
    """Admissions, handed-in KV loaded beside the rounds, joins and finishes never sync the host. Every batch size
    the newcomers make runs before the check (a capture synchronizes): offload requests 1 and 3 and normal request 0
    decode long, offload 4 and normal 2 stop early; under the check, offload 5 and normal 6 arrive, join (sizes seen
    before), decode and finish."""
    with _engine("tiny", irq=not ride, overlap=True, ride=ride, ahead=ahead) as serving:
        _add(serving, {0: NRM, 1: OFF, 3: OFF}, 900, 60, 256)
        _add(serving, {2: NRM, 4: OFF}, 900, 6, 256)
        finished: dict[int, tuple[int, ...]] = {}
        pending = None

        def round_() -> None:
            nonlocal pending
            outcomes, pending = serving.run_round(pending)
            finished.update((rid, t) for o in outcomes for rid, t in o.finished.items())

        for _ in range(16):                          # 2 and 4 finish by the 8th round: the smaller sizes run too
            round_()
        warmed = {2, 4} <= finished.keys()
        rounds = 0
        with _host_syncs_refused() as errors:
            _add(serving, {5: OFF, 6: NRM}, 900, 8, 256)
            while not {5, 6} <= finished.keys() and rounds < 40:
                round_()
                rounds += 1
        error = errors[0] if errors else None
        done = {rid: len(t) for rid, t in finished.items()}
        handoffs = serving.handoff_statistics()
        ok = warmed and error is None and done.get(5) == done.get(6) == 8
        return {"ok": ok, "error": error, "warmed": warmed, "finished_tokens": done, "rounds_checked": rounds,
                "handoffs_landed": handoffs.landed, "handoffs_waited": handoffs.waited}


def cost(model: str, batch: int, context: int, rounds: int) -> dict:
    """A normal batch alone, ms a round (each round ends with its tokens on the host, as serving does): under IRQ
    against without it (the case's verdict), and forced into per-layer pieces, as it runs beside an offload batch
    (reported: what a piece boundary costs)."""
    ms: dict[str, float] = {}
    pieces = 0
    for variant in ("whole", "irq", "pieces", "irq", "whole"):     # each variant's best of its runs: the order
        took, n = _ms_per_round(variant, model, batch, context, rounds)   # of the runs cancels out of the ratio
        ms[variant], pieces = min(ms.get(variant, took), took), max(pieces, n)
        gc.collect()                                 # the variant's engine goes before the next one is built
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    ratio = ms["irq"] / ms["whole"]
    return {"ok": ratio <= 1.05, "ms_per_round": ms, "irq_over_whole": ratio, "pieces": pieces,
            "pieces_over_whole": ms["pieces"] / ms["whole"],
            "us_per_piece_boundary": (ms["pieces"] - ms["whole"]) / max(pieces - 1, 1) * 1e3,
            "model": model, "batch": batch, "context": context}


def _ms_per_round(variant: str, model: str, batch: int, context: int, rounds: int) -> tuple[float, int]:
    """ms a round of a normal batch alone (see `cost`), and the pieces a round ran in (1: one graph)."""
    with _engine(model, irq=variant != "whole", gpu_bytes=batch * (context + 64 * batch) * 256 << 10) as serving:
        _add(serving, dict.fromkeys(range(batch), NRM), context, rounds + 8, open_model(model).config.vocab_size)
        step = (lambda: serving.step() and 1) if variant != "pieces" else _pieces_round(serving)
        for _ in range(4):
            step()
        t0 = time.perf_counter()
        for _ in range(rounds):
            pieces = step()
        return (time.perf_counter() - t0) / rounds * 1e3, pieces


def _pieces_round(serving: ServingEngine):  # noqa: ANN202 (a closure)
    """One round of the normal batch in per-layer pieces, as the inner scheduler runs it beside an offload batch;
    the closure returns the number of pieces."""
    eng = serving.normal
    pinned = pinned_tokens(64, torch.device(DEVICE))

    def run() -> int:
        work = eng.schedule()
        decode = DecodeBatch(eng, work.decode, split=True)
        serving.inner.interleave(decode, None)
        eng.commit_decode(decode.seqs, HostTokens(decode.tokens_nowait(), pinned).wait_list())
        return decode.num_pieces
    return run


def replay() -> dict:
    from pulseio_engine.serving.replay import ReplayOptions
    from pulseio_engine.serving.replay import replay as run_replay
    from pulseio_engine.trace import TraceOptions, open_trace

    trace = open_trace(TraceOptions("mooncake-sample", max_requests=50, max_input=3072, max_output=64))
    config = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=int(0.02 * 2**30), host_kv_bytes=1 << 29,
                           offload_threshold=2048, token_budget=256)
    report = run_replay(trace, open_model("tiny"), config, ReplayOptions(device=DEVICE, busy_every=20))
    pulse, summary = report["pulseio"], report["summary"]
    ok = summary["complete"] and pulse["submitted"] == pulse["completed"] and pulse["failed"] == 0
    return {"ok": ok, "summary": summary, "pulseio": pulse, "m": report["m"], "tpot_all": report["tpot_ms"]["all"],
            "roofline": report["roofline"]}


def _runtime(serving: ServingEngine) -> dict | None:
    deadline = time.monotonic() + 10
    while True:
        stats = serving.runtime_statistics()
        if stats is None or stats.in_flight == 0 or time.monotonic() > deadline:       # type: ignore[attr-defined]
            break
        time.sleep(1e-3)
    return None if stats is None else {"submitted": stats.submitted, "completed": stats.completed,  # type: ignore
                                       "failed": stats.failed, "expired": stats.device_waits_expired}  # type: ignore


def main() -> int:
    faulthandler.dump_traceback_later(float(os.environ.get("CASE_DUMP_AFTER_S", "280")), exit=True)
    case, args = sys.argv[1], sys.argv[2:]
    cases = {"tokens": lambda: tokens("ahead" in args), "halves": lambda: riders("halves", ahead="ahead" in args),
             "ride": lambda: riders("ride"),
             "ahead": lambda: riders("ride", ahead=True, ahead_budget=float(args[0]) if args else 1.0),
             "vanilla": vanilla,
             "nosync": lambda: nosync(int(args[0]), "overlap" in args[1:], "two-streams" in args[1:],
                                      "halves" in args[1:], "ride" in args[1:], "ahead" in args[1:]),
             "nosync-admit": lambda: nosync_admit("ride" in args, "ahead" in args),
             "cost": lambda: cost(args[0], int(args[1]), int(args[2]), int(args[3])), "replay": replay}
    out = cases[case]()
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
