"""`linear`: the decoder's projections. F.linear, except decode's few rows on a GPU, which go to `skinny_linear`
where it reads the weight faster than cuBLAS (`runs_skinny`).

A decode step multiplies each weight by at most a few rows, so a projection costs the time to read its weight
once. For such skinny shapes cuBLAS picks kernels that fall short of that rate on some shapes, and splits K
with a memset and a reduce kernel around the GEMM; `skinny_linear` (a Triton kernel, its tiles chosen by
shape) reduces its split-K in the same launch (benchmarks/bench_skinny_gemm.py compares the two). It runs as a
torch custom op, so the compiled decode halves call it as one opaque kernel, and it takes the model's
`SkinnyWorkspace` as two tensors: their counters are zero between calls, so nothing clears them, and a CUDA
graph holds one node per projection.

Triton is imported only where a workspace is made (a GPU), so CPU installs without it never load it; a GPU
install without it is told so once and runs every projection on cuBLAS.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from ..config import ModelConfig

MAX_ROWS = 32                                         # skinny_gemm.MAX_ROWS, without importing Triton here
MIN_WEIGHT = 32 << 20                                 # elements (64 MiB in bf16) a weight needs to run skinny
MIN_WEIGHT_PAST_16_ROWS = 64 << 20                    # ... and to run skinny with more than 16 rows
Workspace = tuple[torch.Tensor, torch.Tensor]         # SkinnyWorkspace's (partials, counters)


@torch.library.custom_op("pulseio_engine::skinny_linear", mutates_args=("partials", "counters"))
def _skinny_linear_op(x: torch.Tensor, weight: torch.Tensor, partials: torch.Tensor,
                      counters: torch.Tensor) -> torch.Tensor:
    from .skinny_gemm import SkinnyWorkspace, skinny_linear

    return skinny_linear(x, weight, workspace=SkinnyWorkspace(partials, counters))


@_skinny_linear_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, partials: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           workspace: Workspace | None = None) -> torch.Tensor:
    """x: [T, K]; weight: [N, K]; bias: [N] or None -> [T, N]. With the model's `workspace` (see
    `decode_workspace`) and no bias, the shapes `runs_skinny` names run `skinny_linear`; everything else (no rows
    either: a prefill whose chunks sample nothing asks for no logits) F.linear."""
    if workspace is None or bias is not None or not runs_skinny(x.shape[0], *weight.shape):
        return F.linear(x, weight, bias)
    return _skinny_linear_op(x.contiguous(), weight, *workspace)


def runs_skinny(rows: int, n: int, k: int) -> bool:
    """Whether `linear` multiplies `rows` rows by an [n, k] weight in `skinny_linear` rather than cuBLAS. By a rule
    read off benchmarks/bench_skinny_gemm.py's sweep on an H200 (qwen3-14b's projections, 1 to 32 rows): cuBLAS read
    the smaller weights faster, o_proj's 50 MiB at every row count and qkv's 70 MiB past 16 rows, and the skinny
    kernel the larger ones (gate_up, down, the lm_head) at every row count."""
    weight = n * k
    return 1 <= rows <= MAX_ROWS and weight >= MIN_WEIGHT and (rows <= 16 or weight >= MIN_WEIGHT_PAST_16_ROWS)


def decode_workspace(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> Workspace | None:
    """The workspace every `linear` of a model's decode path shares (calls on one stream), sized for its
    projections' split-K configs; None where `skinny_linear` does not run (not a GPU, or not bf16 / fp16)."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return None
    try:
        from .skinny_gemm import SkinnyWorkspace
    except ImportError as exc:                      # a CUDA torch without Triton: say so once, run on cuBLAS
        warnings.warn(f"skinny_linear needs Triton ({exc}); decode projections run on cuBLAS", stacklevel=2)
        return None
    max_n, max_split = workspace_extent(config, torch.cuda.get_device_properties(device).multi_processor_count)
    ws = SkinnyWorkspace.allocate(max_n, max_split_k=max_split, device=device)
    return ws.partials, ws.counters


def workspace_extent(config: ModelConfig, sm_count: int) -> tuple[int, int]:
    """(the widest N, the most splits) among the model's projections whose tile splits K (16, 1: none does)."""
    from .skinny_gemm import default_config

    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = ((q + 2 * kv, h), (h, q), (2 * i, h), (h, i), (config.vocab_size, h))   # (N, K): qkv o gate_up down lm
    splits = [default_config(MAX_ROWS, n, k, sm_count).split_k for n, k in shapes]
    return max((n for (n, _), split in zip(shapes, splits, strict=True) if split > 1), default=16), max(splits)
