"""Frozen, validated configuration: one dataclass per layer, composed by `EngineConfig`.

Nothing here imports torch: dtypes and devices are named by strings/enums and resolved by the
runner, so configs can be built and validated on any machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from pulseio import DmaConfig


class Architecture(Enum):
    """Model families the engine runs."""

    LLAMA = "llama"    # Llama 2/3, SmolLM2
    QWEN2 = "qwen2"    # Llama + biases on the q, k and v projections (Qwen2, Qwen2.5)
    QWEN3 = "qwen3"    # Llama + per-head RMSNorm on q and k


class DType(Enum):
    """Weight and activation dtypes the engine accepts."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


def _positive(owner: str, **values: int | float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{owner}.{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 `rope_scaling` with `rope_type: llama3`."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        _positive("RopeScaling", factor=self.factor, low_freq_factor=self.low_freq_factor,
                  high_freq_factor=self.high_freq_factor,
                  original_max_position_embeddings=self.original_max_position_embeddings)
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"RopeScaling.high_freq_factor ({self.high_freq_factor}) must exceed "
                f"low_freq_factor ({self.low_freq_factor})"
            )


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama/Qwen2/Qwen3 decoder. `head_dim` may differ from hidden_size // num_heads (Qwen3)."""

    architecture: Architecture
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.architecture, Architecture):
            raise TypeError(f"ModelConfig.architecture must be an Architecture, got {self.architecture!r}")
        _positive("ModelConfig", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                  num_layers=self.num_layers, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                  head_dim=self.head_dim, intermediate_size=self.intermediate_size,
                  max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.rms_norm_eps,
                  rope_theta=self.rope_theta)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")

    @property
    def qk_norm(self) -> bool:
        return self.architecture is Architecture.QWEN3

    @property
    def qkv_bias(self) -> bool:
        return self.architecture is Architecture.QWEN2

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: `num_blocks` blocks of `block_size` tokens per layer (block 0 is reserved
    as the padding block of CUDA-graph buckets). `num_blocks=None` sizes the cache from
    `gpu_memory_fraction` of free memory on CUDA, or to `cpu_default_tokens` on CPU."""

    block_size: int = 16
    num_blocks: int | None = None
    gpu_memory_fraction: float = 0.9
    cpu_default_tokens: int = 16384

    def __post_init__(self) -> None:
        _positive("CacheConfig", block_size=self.block_size, cpu_default_tokens=self.cpu_default_tokens)
        if self.num_blocks is not None and (not isinstance(self.num_blocks, int) or self.num_blocks < 2):
            raise ValueError(
                f"CacheConfig.num_blocks must be an int >= 2 (block 0 is the padding block) or None, "
                f"got {self.num_blocks!r}"
            )
        if not 0.0 < self.gpu_memory_fraction <= 1.0:
            raise ValueError(
                f"CacheConfig.gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction!r}"
            )


class SparseMode(Enum):
    """How decode attention picks the KV blocks it reads (the block digests of `kv/digests.py`)."""

    QUEST = "quest"                            # each KV head picks its own blocks (Quest)
    SOLOHEAD = "solohead"                      # one retrieval KV head per layer picks for all heads
    SOLOHEAD_REVERSED = "solohead-reversed"    # the calibration's worst head picks: the paper's control


class GroupScore(Enum):
    """How the query heads of a GQA group combine their Quest bounds into one score per block."""

    SUM = "sum"             # the bounds added: a head with larger logits outweighs the others
    MAX_NORM = "max-norm"   # each head's bounds less its best block's, then the group's max: a block any head
                            # ranks near its own top ranks high (each head's softmax is its own)


DEFAULT_GROUP_SCORE = GroupScore.SUM   # what SparseConfig, the evaluations and their records assume unless told


@dataclass(frozen=True)
class SparseConfig:
    """Block-sparse decode attention: each request attends to at most `token_budget` tokens, in whole
    blocks of `block_size` (the KV cache's block size): the first `sink_blocks` blocks, the last
    `local_blocks` blocks (the block being written among them), and the best-scoring blocks between."""

    mode: SparseMode = SparseMode.QUEST
    token_budget: int = 2048
    block_size: int = 16
    sink_blocks: int = 1
    local_blocks: int = 2
    group_score: GroupScore = DEFAULT_GROUP_SCORE

    def __post_init__(self) -> None:
        if not isinstance(self.mode, SparseMode):
            raise TypeError(f"SparseConfig.mode must be a SparseMode, got {self.mode!r}")
        if not isinstance(self.group_score, GroupScore):
            raise TypeError(f"SparseConfig.group_score must be a GroupScore, got {self.group_score!r}")
        _positive("SparseConfig", token_budget=self.token_budget, block_size=self.block_size,
                  local_blocks=self.local_blocks)
        if isinstance(self.sink_blocks, bool) or not isinstance(self.sink_blocks, int) or self.sink_blocks < 0:
            raise ValueError(f"SparseConfig.sink_blocks must be an int >= 0, got {self.sink_blocks!r}")
        if self.token_budget % self.block_size:
            raise ValueError(f"SparseConfig.token_budget ({self.token_budget}) must be a multiple of "
                             f"block_size ({self.block_size}); use {self.budget_blocks * self.block_size} or "
                             f"{(self.budget_blocks + 1) * self.block_size}")
        if self.budget_blocks < self.sink_blocks + self.local_blocks:
            raise ValueError(f"SparseConfig.token_budget ({self.token_budget} tokens = {self.budget_blocks} blocks) "
                             f"must cover sink_blocks + local_blocks ({self.sink_blocks} + {self.local_blocks}); "
                             "raise the budget or shrink the windows")

    @property
    def budget_blocks(self) -> int:
        """Blocks a request attends to at most (the width of a selection)."""
        return self.token_budget // self.block_size


class RecallMode(Enum):
    """How an offload request's selected-but-absent blocks reach the device."""

    DOORBELL = "offload-doorbell"   # ids stay on the device: `Runtime.post_recall(count=...)` + device wait
    SYNC = "offload-sync"           # ArkVale-like: ids copied to the host, `Runtime.recall`, then a host wait
    ALL_ON_GPU = "all-on-gpu"       # no offload (Quest as published): every block stays in the paged cache
                                    # and attention reads the selected ones there; saves no memory


def blocks_in_budgets(budgets: float, budget_blocks: int) -> int:
    """`budgets` token budgets of `budget_blocks` blocks each, in whole blocks: the product rounded to a millionth,
    then up (1.1 x 10 blocks is 11, not the 12 of its float)."""
    return math.ceil(round(budgets * budget_blocks, 6))


@dataclass(frozen=True)
class OffloadConfig:
    """Offload requests: their full KV lives in a host pool (`host_blocks` transfer units); the device
    keeps layers [0, dense_layers) whole and, for every other layer, a hot set of `hot_blocks` slots per
    selecting row (the request for SoloHead, each KV head for Quest). At most `max_seqs` offload requests
    hold hot slots at once. `poll_spin_iterations` is how long the runtime's poller
    spins (GIL-free loads; 5M: a few ms) for the next recall before it sleeps, on a GPU: longer than the
    gap between two layers' recalls, so a recall never waits out a sleep (a CPU engine sleeps at once:
    spinning would take a core from the decode). `poll_sleep_s` is the poller's (first, longest) sleep.
    `dma`: the runtime's transfer settings (the resident copier's CTAs, how long it stays up without a
    task, ...); None: pulseio's defaults, except that on a GPU a copier generation stays up 5 ms
    (`offload.RESIDENT_IDLE_US`), through the gaps between layers, so it takes every recall of a step.

    `offload_only`: every request of the engine is an offload request, so the paged cache keeps only
    the dense layers and an offload request's device memory is those, its hot slots and its digests.
    Otherwise the paged cache keeps every layer for normal requests, and offload requests hold
    (unused) blocks of the offloaded layers there too.

    `hot_cache`: the hot set's size in budgets (`hot_blocks` = ceil(hot_cache x budget_blocks) entries, >= 1.0).
    1.0 holds the last selection only; larger sets keep blocks selected earlier, the least recently selected
    evicted first, so a block that comes back is found on the device instead of recalled. It trades the hot
    slots' GPU memory (hot_cache times the budget's, per request and offloaded layer) for recalled bytes: on
    real models 1.5 to 4 budgets recall 3 to 5 times fewer blocks than 1 (`pulseio-engine locality`). The
    selection does not depend on it: tokens are the same at any size, only what is resident differs.

    `kept_step_graphs`: the step graphs the engine keeps, one per batch size and split (a whole step, or one
    split in per-layer pieces), the least recently used dropped. Each holds one decode step's activations (tens
    of MB at a dozen rows); a batch size whose graph was dropped is captured anew when it comes back, a round
    many times slower than the rest, so a server keeps one pair for every size its caps admit.

    `ahead`: each offloaded layer after the first also recalls a layer early. At layer l - 1, layer l's weights make
    a query of the residual stream entering l - 1 (`CausalLM.selection_query`: the selecting heads' rows of W_q
    only); its selection is planned against layer l's hot set and recalled into its least recently selected
    entries while layer l - 1 runs. Layer l then selects from its own query as always, and recalls only what the
    prediction missed. Tokens do not change; the link carries the mispredicted blocks too. The prefetch evicts
    like any recall, so it wants a hot set larger than the budget (`hot_cache` > 1), and doorbell recalls.

    `ahead_budget`: the prediction's own budget, in budgets (`ahead_blocks` = ceil(ahead_budget x budget_blocks)
    blocks a selecting row, at most `hot_blocks`). A prediction larger than the budget misses less of what the
    layer then selects, so less is left to recall after the layer's own query, for more traffic ahead of it."""

    sparse: SparseConfig = field(default_factory=SparseConfig)
    recall: RecallMode = RecallMode.DOORBELL
    host_blocks: int = 65536
    max_seqs: int = 8
    dense_layers: int = 2
    poll_spin_iterations: int = 5_000_000
    poll_sleep_s: tuple[float, float] = (1e-5, 1e-4)
    offload_only: bool = False
    dma: DmaConfig | None = None
    kept_step_graphs: int = 32
    hot_cache: float = 1.0
    ahead: bool = False
    ahead_budget: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.sparse, SparseConfig):
            raise TypeError(f"OffloadConfig.sparse must be a SparseConfig, got {self.sparse!r}")
        if (isinstance(self.hot_cache, bool) or not isinstance(self.hot_cache, (int, float))
                or not math.isfinite(self.hot_cache) or self.hot_cache < 1.0):
            raise ValueError(f"OffloadConfig.hot_cache must be a finite number >= 1.0 (the hot set in budgets; "
                             f"1.0: the last selection only), got {self.hot_cache!r}")
        if not isinstance(self.recall, RecallMode):
            raise TypeError(f"OffloadConfig.recall must be a RecallMode, got {self.recall!r}")
        _positive("OffloadConfig", host_blocks=self.host_blocks, max_seqs=self.max_seqs,
                  poll_spin_iterations=self.poll_spin_iterations, kept_step_graphs=self.kept_step_graphs)
        if isinstance(self.dense_layers, bool) or not isinstance(self.dense_layers, int) or self.dense_layers < 0:
            raise ValueError(f"OffloadConfig.dense_layers must be an int >= 0, got {self.dense_layers!r}")
        if not isinstance(self.offload_only, bool):
            raise TypeError(f"OffloadConfig.offload_only must be a bool, got {self.offload_only!r}")
        if self.dma is not None and not isinstance(self.dma, DmaConfig):
            raise TypeError(f"OffloadConfig.dma must be a pulseio.DmaConfig or None, got {self.dma!r}")
        if self.recall is RecallMode.ALL_ON_GPU and self.hot_cache != 1.0:
            raise ValueError(f"OffloadConfig.hot_cache ({self.hot_cache!r}) sizes the hot sets of offload requests; "
                             "RecallMode.ALL_ON_GPU keeps every block in the paged cache and has none (leave it 1.0)")
        if not isinstance(self.ahead, bool):
            raise TypeError(f"OffloadConfig.ahead must be a bool, got {self.ahead!r}")
        if self.ahead and (self.recall is not RecallMode.DOORBELL or self.hot_cache <= 1.0):
            raise ValueError(f"OffloadConfig.ahead recalls each layer's predicted blocks into its hot set's spare "
                             f"entries while the layer before runs: it needs doorbell recalls and hot_cache > 1 "
                             f"(got recall {self.recall.value!r}, hot_cache {self.hot_cache!r})")
        if (isinstance(self.ahead_budget, bool) or not isinstance(self.ahead_budget, (int, float))
                or not math.isfinite(self.ahead_budget) or self.ahead_budget < 1.0):
            raise ValueError(f"OffloadConfig.ahead_budget must be a finite number >= 1.0 (the prediction's budget in "
                             f"budgets), got {self.ahead_budget!r}")
        if self.ahead_budget != 1.0 and not self.ahead:
            raise ValueError(f"OffloadConfig.ahead_budget ({self.ahead_budget!r}) sizes the prediction of "
                             "OffloadConfig.ahead, which is off: turn ahead on or leave ahead_budget at 1.0")
        if self.ahead_blocks > self.hot_blocks:
            raise ValueError(f"OffloadConfig.ahead_budget ({self.ahead_budget!r}: {self.ahead_blocks} blocks a row) "
                             f"exceeds the hot set ({self.hot_cache!r} budgets: {self.hot_blocks} entries), which must "
                             "hold the whole prediction: raise hot_cache or lower ahead_budget")

    @property
    def hot_blocks(self) -> int:
        """Hot-set entries per selecting row and offloaded layer: `hot_cache` budgets (`blocks_in_budgets`)."""
        return blocks_in_budgets(self.hot_cache, self.sparse.budget_blocks)

    @property
    def ahead_blocks(self) -> int:
        """Blocks a selecting row's prediction selects: `ahead_budget` budgets (`blocks_in_budgets`)."""
        return blocks_in_budgets(self.ahead_budget, self.sparse.budget_blocks)


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching: at most `max_num_seqs` running requests; a prefill step processes at
    most `max_prefill_tokens` prompt tokens (longer prompts are prefilled in chunks)."""

    max_num_seqs: int = 256
    max_prefill_tokens: int = 2048

    def __post_init__(self) -> None:
        _positive("SchedulerConfig", max_num_seqs=self.max_num_seqs,
                  max_prefill_tokens=self.max_prefill_tokens)


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs, built once at the top and handed down in pieces.

    `max_model_len=None` means the model's `max_position_embeddings`. `compile_decode=None` means
    torch.compile the decode path's elementwise work on CUDA and not on CPU. `skinny_gemm`: projections of at
    most 32 rows through the Triton `skinny_linear` where it runs (CUDA, bf16 / fp16), False: all through cuBLAS."""

    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "cpu"
    dtype: DType = DType.FLOAT32
    max_model_len: int | None = None
    use_cuda_graphs: bool = True
    compile_decode: bool | None = None
    offload: OffloadConfig | None = None
    skinny_gemm: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, DType):
            raise TypeError(f"EngineConfig.dtype must be a DType, got {self.dtype!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"EngineConfig.device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.max_model_len is not None:
            _positive("EngineConfig", max_model_len=self.max_model_len)
            if self.max_model_len > self.model.max_position_embeddings:
                raise ValueError(
                    f"EngineConfig.max_model_len ({self.max_model_len}) must not exceed the model's "
                    f"max_position_embeddings ({self.model.max_position_embeddings})"
                )
        if self.offload is not None:
            self._check_offload(self.offload)

    def _check_offload(self, offload: OffloadConfig) -> None:
        if offload.sparse.block_size != self.cache.block_size:
            raise ValueError(f"OffloadConfig.sparse.block_size ({offload.sparse.block_size}) must equal "
                             f"CacheConfig.block_size ({self.cache.block_size}): selection picks cache blocks")
        if offload.offload_only and offload.recall is RecallMode.ALL_ON_GPU:
            raise ValueError("OffloadConfig.offload_only keeps only the dense layers on the device, "
                             "RecallMode.ALL_ON_GPU keeps every layer there; choose one")
        if offload.dense_layers >= self.model.num_layers:
            raise ValueError(f"OffloadConfig.dense_layers ({offload.dense_layers}) leaves no layer of the "
                             f"model's {self.model.num_layers} to offload; use fewer dense layers")
        if offload.ahead and not self.use_cuda_graphs:
            raise ValueError("OffloadConfig.ahead recalls a layer's blocks from the offload step's pieces "
                             "(`OffloadStepGraph`), which use_cuda_graphs=False does not run; turn graphs on (on a CPU "
                             "the pieces run eagerly)")

    @property
    def compile(self) -> bool:
        return self.device.startswith("cuda") if self.compile_decode is None else self.compile_decode

    @property
    def model_len(self) -> int:
        """Largest prompt + generated length a request may reach."""
        return self.max_model_len or self.model.max_position_embeddings
