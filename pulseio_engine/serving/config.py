"""The serving modes compared on one trace, and the serving engine's configuration. No torch."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..config import OffloadConfig, RecallMode, SparseConfig, SparseMode


class ServeMode(Enum):
    """What a serving run is (`pulseio-engine replay --mode`)."""

    VANILLA = "vanilla"              # every request's KV on the GPU, dense attention; one batch
    QUEST = "quest"                  # every request's KV on the GPU, Quest's sparse attention; one batch
    OFFLOAD_SYNC = "offload-sync"    # long requests offloaded, recalled with a host sync (ArkVale-like); coupled
    PULSEINFER = "pulseinfer"        # long requests offloaded, doorbell recalls, SoloHead; IRQ (irq=False: coupled)


@dataclass(frozen=True)
class ServingConfig:
    """A serving engine: `mode`; `gpu_kv_bytes`, the GPU KV every mode may hold (KV, digests, hot sets); for the
    offload modes `host_kv_bytes`, the host pool, and `offload_threshold`, the tokens from which a request is
    offloaded. `irq` None: the mode's own (pulseinfer interleaves, the others run coupled batches).
    `selection` None: the mode's own (Quest for quest and offload-sync, SoloHead for pulseinfer).
    `max_batch` bounds each batch; `max_offload_seqs` the offload requests with hot sets (None: as many as
    the GPU budget could hold at the threshold's length). `gpu_ahead`: layer pieces the host may enqueue
    ahead of the GPU under IRQ (each one is a decision made that much earlier); None: `pieces_ahead`'s default.
    `normal_steps`: under IRQ, the
    normal batch's decode steps a round, beside the offload batch's one (its layers fill the offload batch's
    recall waits; fewer when a normal request has fewer tokens left). `copier_ctas`,
    `two_streams`: under IRQ on a GPU, the offload batch's pieces on a high-priority stream and the normal batch's
    on a low-priority one (`irq.StreamPair`), so the device fills the offload batch's waits with normal layers
    already enqueued. `copier_idle_us`: the offload runtime's resident copier (`pulseio.DmaConfig.zero_copy_ctas` and
    `resident_idle_us`; None: the engine's defaults). `overlap_rounds`: launch each round before the previous
    one's tokens reach the host (its input ids fed on the device), so the host's work between rounds runs while
    the GPU decodes; finishing is by output length (requests ignore EOS), and moves wait for the tokens. Off here,
    for callers that stop at EOS; `pulseio-engine replay`, whose requests decode their trace's lengths, turns it on
    unless told `--no-overlap-rounds`. `hot_cache`: the offload modes' hot sets, in budgets
    (`OffloadConfig.hot_cache`): each offload request is charged that many budgets' slots per offloaded layer.
    `halves`: under IRQ, a round with both batches and two offload requests or more runs the offload batch as
    two halves whose layer pieces alternate, the normal requests riding in the first half's step, so each half's
    recall flies while the other half computes (`InnerScheduler.halves`). `ride`: pulseinfer without IRQ, a round
    with both batches is one step of the offload batch with the normal requests riding in it (`StepRiders`): one
    forward reads the weights once for both, and the recall is not hidden. `ahead`: the offload engine recalls each
    layer's predicted blocks during the layer before (`OffloadConfig.ahead`), so only what the prediction missed is
    recalled after the layer's own selection (under IRQ, that rest is what the normal layers hide); hot sets above
    one budget.
    `ahead_budget`: the prediction's own budget, in budgets (`OffloadConfig.ahead_budget`)."""

    mode: ServeMode
    gpu_kv_bytes: int
    host_kv_bytes: int = 0
    offload_threshold: int = 8192
    irq: bool | None = None
    token_budget: int = 2048
    selection: SparseMode | None = None
    block_size: int = 16
    dense_layers: int = 2
    max_batch: int = 256
    max_offload_seqs: int | None = None
    gpu_ahead: int | None = None
    normal_steps: int = 1
    copier_ctas: int | None = None
    copier_idle_us: int | None = None
    overlap_rounds: bool = False
    two_streams: bool = False
    hot_cache: float = 1.0
    halves: bool = False
    ride: bool = False
    ahead: bool = False
    ahead_budget: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.mode, ServeMode):
            raise TypeError(f"ServingConfig.mode must be a ServeMode, got {self.mode!r}")
        for name in ("gpu_kv_bytes", "offload_threshold", "max_batch", "gpu_ahead", "normal_steps"):
            value = getattr(self, name)
            if value is None and name == "gpu_ahead":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ServingConfig.{name} must be an int >= 1{' or None' * (name == 'gpu_ahead')}, "
                                 f"got {value!r}")
        if self.has_offload and self.host_kv_bytes < 1:
            raise ValueError(f"ServingConfig.host_kv_bytes must be >= 1 for {self.mode.value} (its host pool), "
                             f"got {self.host_kv_bytes!r}")
        for name in ("max_offload_seqs", "copier_ctas", "copier_idle_us"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ServingConfig.{name} must be an int >= 1 or None, got {value!r}")
            if not self.has_offload:
                raise ValueError(f"{self.mode.value} offloads no request, so it has no "
                                 f"{'offload batch' if name == 'max_offload_seqs' else 'copier'} to set {name} of")
        if self.irq and self.mode is not ServeMode.PULSEINFER:
            raise ValueError(f"IRQ interleaves pulseinfer's normal and offload batches; {self.mode.value} runs "
                             "coupled batches (leave irq unset)")
        if self.two_streams and not self.interleaves:
            raise ValueError(f"two_streams puts IRQ's two batches on two streams; {self.describe()} does not "
                             "interleave")
        if self.ride and (self.mode is not ServeMode.PULSEINFER or self.irq):
            raise ValueError(f"ride carries the normal requests in pulseinfer's offload step, one forward a round "
                             f"instead of IRQ's two batches; {self.mode.value}{' with irq' * bool(self.irq)} has no "
                             "such step (pulseinfer, irq unset or False)")
        if self.halves and not self.interleaves:
            raise ValueError(f"halves split IRQ's offload batch in two; {self.describe()} does not interleave")
        if self.halves and (self.normal_steps > 1 or self.two_streams):
            raise ValueError("halves carry the normal requests in the first half's step, one step a round on one "
                             f"stream: leave normal_steps at 1 (got {self.normal_steps}) and two_streams off")
        if self.normal_steps > 1 and not self.interleaves:
            raise ValueError(f"normal_steps={self.normal_steps} runs the normal batch's steps between the offload "
                             f"batch's layers, which pulseinfer's IRQ does; {self.describe()} does not interleave")
        if self.selection is not None and self.mode is ServeMode.VANILLA:
            raise ValueError("vanilla attends densely; a selection applies to quest, offload-sync and pulseinfer")
        if self.sparse is not None:
            SparseConfig(mode=self.sparse, token_budget=self.token_budget, block_size=self.block_size)
        if self.hot_cache != 1.0 and not self.has_offload:
            raise ValueError(f"{self.mode.value} offloads no request, so it has no hot sets for hot_cache="
                             f"{self.hot_cache!r} to size (leave it 1.0)")
        if self.ahead and self.mode is not ServeMode.PULSEINFER:
            raise ValueError(f"ahead recalls each layer's predicted blocks during the layer before, through "
                             f"pulseinfer's doorbell; {self.mode.value} has no such recall")
        if self.has_offload:
            assert self.recall is not None                                  # (every offload mode recalls)
            OffloadConfig(sparse=self.sparse_config(), hot_cache=self.hot_cache, ahead=self.ahead,   # its rules, in
                          ahead_budget=self.ahead_budget, recall=self.recall)                # its words
        elif self.ahead_budget != 1.0:
            raise ValueError(f"{self.mode.value} offloads no request, so it has no prediction for ahead_budget="
                             f"{self.ahead_budget!r} to size (leave it 1.0)")

    def check_device(self, device: str, use_cuda_graphs: bool) -> None:
        """Several normal steps a round need captured steps on a GPU: the advance between them runs inside the
        offload batch's step, where an eager kernel launched for the first time waits for the copier. Two streams
        need a GPU."""
        if self.two_streams and device.split(":")[0] != "cuda":
            raise ValueError(f"two_streams runs IRQ's batches on two CUDA streams; {device} has none (leave it off "
                             "on a CPU)")
        if self.normal_steps > 1 and not use_cuda_graphs and device.split(":")[0] == "cuda":
            raise ValueError(f"normal_steps={self.normal_steps} advances the normal batch between its steps inside "
                             "the offload batch's step, which only captured steps may do on a GPU (an eager kernel "
                             "launched there for the first time waits for the copier); use CUDA graphs or "
                             "normal_steps=1")

    @property
    def pieces_ahead(self) -> int:
        """`gpu_ahead`, by default 1, or 8 with `overlap_rounds`: an overlapped round's launch runs while the GPU
        works through the pieces the host is ahead by, and the work between two rounds (commit, schedule,
        prepare, the first pieces) outlasts one piece."""
        if self.gpu_ahead is not None:
            return self.gpu_ahead
        return 8 if self.overlap_rounds else 1

    @property
    def has_offload(self) -> bool:
        """Whether long requests keep their KV in the host pool (an offload engine, a threshold)."""
        return self.mode in (ServeMode.OFFLOAD_SYNC, ServeMode.PULSEINFER)

    @property
    def interleaves(self) -> bool:
        """Whether the two batches run under IRQ (layer by layer) rather than coupled."""
        return self.mode is ServeMode.PULSEINFER and self.irq is not False and not self.ride

    @property
    def sparse(self) -> SparseMode | None:
        """The block selection of the sparse layers (None: vanilla, dense)."""
        if self.mode is ServeMode.VANILLA:
            return None
        default = SparseMode.SOLOHEAD if self.mode is ServeMode.PULSEINFER else SparseMode.QUEST
        return self.selection or default

    @property
    def recall(self) -> RecallMode | None:
        """How offload requests' blocks come back (None: no offload engine)."""
        return {ServeMode.OFFLOAD_SYNC: RecallMode.SYNC, ServeMode.PULSEINFER: RecallMode.DOORBELL}.get(self.mode)

    def sparse_config(self) -> SparseConfig:
        assert self.sparse is not None
        return SparseConfig(mode=self.sparse, token_budget=self.token_budget, block_size=self.block_size)

    def describe(self) -> str:
        """The mode as the results name it: 'pulseinfer', 'pulseinfer --no-irq', 'quest'..."""
        if self.ride:
            name = self.mode.value + " --ride"
        else:
            name = self.mode.value + (" --no-irq" if self.mode is ServeMode.PULSEINFER and not self.interleaves else "")
        budget = f" --ahead-budget {self.ahead_budget:g}" * (self.ahead_budget != 1.0)
        return name + " --ahead" * self.ahead + budget
