"""The serving engine: a request moved between classes keeps its tokens (its KV copied to and from the host
pool, counted); every mode serves the same requests; the pools hold what the budget charges."""

from __future__ import annotations

import pytest
import torch
from test_irq import HEADS, NRM, OFF, _serve

from pulseio_engine.config import DType, SparseMode
from pulseio_engine.model.checkpoint import load_checkpoint
from pulseio_engine.serving.budget import KVClass
from pulseio_engine.serving.config import ServeMode, ServingConfig
from pulseio_engine.serving.engine import ServingEngine


def test_requests_moved_between_classes_keep_their_tokens(tiny_qwen3) -> None:
    path = str(tiny_qwen3[0])
    classes = {0: NRM, 1: OFF, 2: NRM, 3: OFF}
    stay, _ = _serve(path, classes)
    moved, serving = _serve(path, classes, moves={2: {0: OFF, 1: NRM}, 5: {0: NRM, 3: NRM}, 6: {2: OFF}})
    assert moved == stay
    m = serving.moves
    assert (m.to_offload, m.to_normal) == (2, 3)
    assert m.bytes_to_host > 0 and m.bytes_from_host > 0
    unit = serving.offload.offloader.layout.unit_bytes                                   # type: ignore[union-attr]
    assert m.bytes_to_host % unit == 0 and m.bytes_from_host % unit == 0
    assert serving.offload.offloader.statistics().requests == 0                          # type: ignore[union-attr]
    assert serving.offload.offloader.statistics().host_units_free == serving.sizes.host_units - 1  # type: ignore


def test_a_move_reads_the_host_copy_of_a_request_that_decoded_there(tiny_qwen3) -> None:
    """Moved back after decoding in the offload class, a request's decoded tokens' KV comes from the host pool:
    had it not been stored there, the tokens after the move would differ."""
    path = str(tiny_qwen3[0])
    stay, _ = _serve(path, {0: OFF})
    moved, serving = _serve(path, {0: OFF}, moves={6: {0: NRM}})
    assert moved == stay and serving.moves.to_normal == 1


@pytest.mark.parametrize("hot_cache", [1.0, 1.5, 2.0])
def test_the_footprint_is_what_the_engines_allocate(tiny_qwen3, hot_cache: float) -> None:
    ckpt = load_checkpoint(str(tiny_qwen3[0]), dtype=torch.float32, device="cpu")
    for selection in (SparseMode.SOLOHEAD, SparseMode.QUEST):
        config = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=8 << 20, host_kv_bytes=8 << 20, token_budget=64,
                               block_size=16, dense_layers=1, selection=selection, hot_cache=hot_cache)
        with ServingEngine(config, ckpt, device="cpu", dtype=DType.FLOAT32, max_model_len=512, heads=HEADS) as s:
            fp, normal, off = s.footprint, s.normal, s.offload.offloader                # type: ignore[union-attr]
            digests = normal.offloader.digests                                          # type: ignore[union-attr]
            per_block = sum(t.nbytes for t in normal.kv.kv) + digests.max.nbytes + digests.min.nbytes
            assert fp.normal_block * normal.kv.num_blocks == per_block
            dense = s.offload.kv.statistics().bytes_total + off.digests.max.nbytes * 2   # type: ignore[union-attr]
            assert fp.offload_block * s.offload.kv.num_blocks == dense                  # type: ignore[union-attr]
            assert fp.offload_fixed == off.store.slots_per_seq * off.layout.unit_bytes   # type: ignore[union-attr]
            assert fp.host_block == off.store.units_for(16) * off.layout.unit_bytes     # type: ignore[union-attr]
            assert off.runtime.host_pool.num_blocks == s.sizes.host_units               # type: ignore[union-attr]
            assert off.offload.hot_blocks == {1.0: 4, 1.5: 6, 2.0: 8}[hot_cache]         # type: ignore[union-attr]
            assert s.normal.offloader.offload.hot_cache == 1.0, "all on the GPU: no hot set"  # type: ignore


@pytest.mark.parametrize("mode", [ServeMode.VANILLA, ServeMode.QUEST, ServeMode.OFFLOAD_SYNC])
def test_every_mode_serves_every_request_its_output_length(tiny_qwen3, mode: ServeMode) -> None:
    ckpt = load_checkpoint(str(tiny_qwen3[0]), dtype=torch.float32, device="cpu")
    config = ServingConfig(mode, gpu_kv_bytes=8 << 20, host_kv_bytes=8 << 20 if mode is ServeMode.OFFLOAD_SYNC else 0,
                           token_budget=64, block_size=16, dense_layers=1,
                           max_offload_seqs=4 if mode is ServeMode.OFFLOAD_SYNC else None)
    with ServingEngine(config, ckpt, device="cpu", dtype=DType.FLOAT32, max_model_len=512, heads=HEADS) as s:
        classes = [KVClass.NORMAL, KVClass.OFFLOAD if config.has_offload else KVClass.NORMAL]
        for rid in range(4):
            s.add(rid, [3 + (rid * 7 + i) % 250 for i in range(50 + 60 * rid)], 5 + rid, classes[rid % 2])
        done: dict[int, tuple[int, ...]] = {}
        while s.has_unfinished():
            done.update(s.step().finished)
    assert {rid: len(out) for rid, out in done.items()} == {0: 5, 1: 6, 2: 7, 3: 8}


def test_interleaving_belongs_to_pulseinfer() -> None:
    with pytest.raises(ValueError, match="IRQ interleaves pulseinfer's normal and offload batches; quest runs"):
        ServingConfig(ServeMode.QUEST, gpu_kv_bytes=1, irq=True)
    with pytest.raises(ValueError, match=r"host_kv_bytes must be >= 1 for offload-sync"):
        ServingConfig(ServeMode.OFFLOAD_SYNC, gpu_kv_bytes=1)
    assert ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1, host_kv_bytes=1, irq=False).describe() == \
        "pulseinfer --no-irq"


def test_overlapped_rounds_let_the_host_further_ahead_unless_told() -> None:
    def ahead(**kw: object) -> int:
        return ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1, host_kv_bytes=1, **kw).pieces_ahead  # type: ignore[arg-type]

    assert (ahead(), ahead(overlap_rounds=True)) == (1, 8)
    assert (ahead(gpu_ahead=3), ahead(gpu_ahead=3, overlap_rounds=True)) == (3, 3)
    with pytest.raises(ValueError, match=r"^ServingConfig.gpu_ahead must be an int >= 1 or None, got 0$"):
        ahead(gpu_ahead=0)
    with pytest.raises(ValueError, match=r"^ServingConfig.normal_steps must be an int >= 1, got 0$"):
        ahead(normal_steps=0)


def test_the_copier_and_the_offload_cap_belong_to_the_offload_modes() -> None:
    with pytest.raises(ValueError, match="vanilla offloads no request, so it has no copier to set copier_ctas of"):
        ServingConfig(ServeMode.VANILLA, gpu_kv_bytes=1, copier_ctas=8)
    with pytest.raises(ValueError, match="quest offloads no request, so it has no offload batch to set max_offload"):
        ServingConfig(ServeMode.QUEST, gpu_kv_bytes=1, max_offload_seqs=8)
    with pytest.raises(ValueError, match=r"max_offload_seqs must be an int >= 1 or None, got 0"):
        ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1, host_kv_bytes=1, max_offload_seqs=0)
    with pytest.raises(ValueError, match=r"copier_idle_us must be an int >= 1 or None, got 0"):
        ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1, host_kv_bytes=1, copier_idle_us=0)
    assert ServingConfig(ServeMode.OFFLOAD_SYNC, gpu_kv_bytes=1, host_kv_bytes=1, copier_ctas=8).copier_ctas == 8


def test_hot_sets_belong_to_the_offload_modes() -> None:
    with pytest.raises(ValueError, match=r"^quest offloads no request, so it has no hot sets for hot_cache=2.0 to "):
        ServingConfig(ServeMode.QUEST, gpu_kv_bytes=1, hot_cache=2.0)
    with pytest.raises(ValueError, match=r"^OffloadConfig.hot_cache must be a finite number >= 1.0 .*, got 0.5$"):
        ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1, host_kv_bytes=1, hot_cache=0.5)
    assert ServingConfig(ServeMode.OFFLOAD_SYNC, gpu_kv_bytes=1, host_kv_bytes=1, hot_cache=1.5).hot_cache == 1.5


def test_several_normal_steps_a_round_need_captured_steps_on_a_gpu(tiny_qwen3) -> None:
    """Refused before anything is allocated (this machine need not have a GPU): an eager advance inside the
    offload batch's step could be a kernel's first launch, which waits for the copier."""
    config = ServingConfig(ServeMode.PULSEINFER, gpu_kv_bytes=1 << 26, host_kv_bytes=1 << 26, normal_steps=2)
    ckpt = load_checkpoint(str(tiny_qwen3[0]), dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match=r"normal_steps=2 advances the normal batch .* use CUDA graphs or "
                                         r"normal_steps=1"):
        ServingEngine(config, ckpt, device="cuda", dtype=DType.BFLOAT16, max_model_len=256, heads=HEADS,
                      use_cuda_graphs=False)


def test_the_offload_batch_builds_one_step_per_size_whatever_its_members(tiny_qwen3, monkeypatch) -> None:
    """Requests finish at different rounds and one leaves the offload class and comes back: the offload batch's
    members change at nearly every round, its step is built once per batch size (then replayed), and the
    tokens are those of the same requests served without interleaving."""
    import pulseio_engine.runner as runner

    built: list[tuple[object, int, bool]] = []

    class Counted(runner.OffloadStepGraph):
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            super().__init__(*args, **kwargs)
            built.append((self.offloader, self.size, self.split))

    monkeypatch.setattr(runner, "OffloadStepGraph", Counted)
    path = str(tiny_qwen3[0])
    classes = {rid: OFF for rid in range(6)}
    moves = {2: {1: NRM}, 4: {1: OFF}}
    tokens, serving = _serve(path, classes, moves=moves)
    offload = [(size, split) for owner, size, split in built if owner is serving.offload.offloader]  # type: ignore
    assert len(offload) == len(set(offload)), f"a step built twice for one size and kind: {offload}"
    assert {size for size, _ in offload} == {off for _, off in serving.batch_sizes if off}
    assert len(offload) < serving.rounds - 2, "the members changed more often than the sizes"
    assert serving.step_graphs_built() == len(built)           # both engines' builds, as the report counts them
    serving.reset_statistics()                                  # every request finished
    assert serving.step_graphs_built() == 0
    assert tokens == _serve(path, classes, moves=moves, irq=False)[0]


def _drive(s: ServingEngine, adds: dict[int, list[tuple]], *, overlap: bool) -> dict[int, tuple[int, ...]]:
    """Rounds until every request is done, `adds[r]` added before round r; overlapped: each round launched before
    the previous one is collected, as the replay does with --overlap-rounds."""
    done: dict[int, tuple[int, ...]] = {}
    pending, r = None, 0
    while s.has_unfinished() or pending is not None or any(k >= r for k in adds):
        for args in adds.get(r, []):
            s.add(*args)
        r += 1
        if not overlap:
            if s.has_unfinished():
                done.update(s.step().finished)
            continue
        outcomes, pending = s.overlapped_round(pending)
        for outcome in outcomes:
            done.update(outcome.finished)
    return done


@pytest.mark.parametrize("mode,normal_steps", [(ServeMode.VANILLA, 1), (ServeMode.OFFLOAD_SYNC, 1),
                                               (ServeMode.PULSEINFER, 1), (ServeMode.PULSEINFER, 2)])
def test_overlapped_rounds_give_every_request_the_tokens_of_rounds_run_one_at_a_time(
        tiny_qwen3, mode: ServeMode, normal_steps: int) -> None:
    """Each round launched before the previous one's tokens are on the host (its ids fed on the device, requests
    finishing by length and leaving when collected), with arrivals while a round is in flight."""
    ckpt = load_checkpoint(str(tiny_qwen3[0]), dtype=torch.float32, device="cpu")
    config = ServingConfig(mode, gpu_kv_bytes=8 << 20, host_kv_bytes=0 if mode is ServeMode.VANILLA else 8 << 20,
                           token_budget=64, block_size=16, dense_layers=1,
                           max_offload_seqs=None if mode is ServeMode.VANILLA else 4,
                           normal_steps=normal_steps, overlap_rounds=True)
    offload = KVClass.OFFLOAD if config.has_offload else KVClass.NORMAL
    adds: dict[int, list[tuple]] = {0: [], 3: [], 7: []}
    for rid in range(6):
        prompt = [3 + (rid * 7 + i) % 250 for i in range(40 + 50 * rid)]
        adds[(0, 3, 7)[rid % 3]].append((rid, prompt, 4 + 3 * rid, (KVClass.NORMAL, offload)[rid % 2]))
    outputs = []
    for overlap in (False, True):
        with ServingEngine(config, ckpt, device="cpu", dtype=DType.FLOAT32, max_model_len=512, heads=HEADS) as s:
            outputs.append(_drive(s, adds, overlap=overlap))
            assert not s.has_unfinished()
    alone, overlapped = outputs
    assert {rid: len(out) for rid, out in overlapped.items()} == {rid: 4 + 3 * rid for rid in range(6)}
    assert overlapped == alone
