"""`skinny_linear`: the Triton kernel under TRITON_INTERPRET=1 (a child process on CPU: this file run as a
script prints one JSON line) against x.float() @ weight.float().T, for M in {1, 3, 8, 16, 24, 32}, N and K that
are not multiples of the tiles, split_k 1, 2 and 3, both products (tl.dot and multiply + sum); one
workspace reused across calls and configs (its counters back to zero, outputs bit-equal); argument
errors in-process; benchmarks/bench_skinny_gemm.py --quick; and on a GPU the compiled kernel at
qwen3-14b's shapes against F.linear and replayed from a CUDA graph.

Tolerance: one unit in the last place of the output dtype (finfo.eps relative) plus 1e-3: the interpreter
rounds fp32 -> bf16 toward zero where the GPU rounds to nearest, so it may be one ulp off, not half."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from interpreted import ROOT, interpreted_results, run_cases

ATOL = 1e-3
# name -> (M, N, K, (block_n, block_k, split_k, use_dot) or None for the default config, dtype)
CASES = {
    "m1-dot-split1-ragged": (1, 40, 72, (16, 32, 1, True), "bfloat16"),
    "m3-dot-split2-ragged": (3, 50, 100, (32, 32, 2, True), "bfloat16"),
    "m8-dot-split3-ragged": (8, 70, 200, (16, 32, 3, True), "bfloat16"),     # 7 K tiles: splits of 3, 3, 1
    "m16-dot-split3-even": (16, 64, 192, (32, 32, 3, True), "bfloat16"),
    "m16-sum-split3-ragged": (16, 33, 48, (16, 16, 3, False), "bfloat16"),
    "m3-sum-split1-fp16": (3, 50, 100, (16, 32, 1, False), "float16"),
    "m1-sum-split2-even": (1, 64, 128, (32, 64, 2, False), "bfloat16"),
    "m8-dot-split2-fp16": (8, 48, 96, (16, 32, 2, True), "float16"),
    "m16-default-config": (16, 96, 160, None, "bfloat16"),
    "m24-dot-split3-ragged": (24, 70, 200, (16, 32, 3, True), "bfloat16"),   # padded to 32 rows
    "m32-dot-split2-fp16": (32, 48, 96, (16, 32, 2, True), "float16"),
    "m32-default-config": (32, 96, 160, None, "bfloat16"),
}


def _inputs(m: int, n: int, k: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((m, k), generator=gen).to(dtype)                  # x: [M, K]
    w = (torch.randn((n, k), generator=gen) / k**0.5).to(dtype)       # weight: [N, K]
    return x, w


def _excess(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> dict:
    """How far `got` [M, N] is from the fp32 product, and how many elements break the tolerance."""
    ref = x.float() @ w.float().T
    err = (got.float() - ref).abs()
    bad = ~(err <= ATOL + torch.finfo(got.dtype).eps * ref.abs())  # NaN is bad
    return {"max_err": err.max().item(), "max_ref": ref.abs().max().item(), "bad": int(bad.sum())}


def _run_case(m: int, n: int, k: int, tile, dtype: str) -> dict:  # noqa: ANN001
    from pulseio_engine.model.skinny_gemm import SkinnyConfig, skinny_linear

    x, w = _inputs(m, n, k, getattr(torch, dtype))
    config = None if tile is None else SkinnyConfig(*tile[:3], num_warps=4, num_stages=2, use_dot=tile[3])
    wide = torch.full((m, 2 * n), float("nan"), dtype=x.dtype)
    out = wide[:, ::2]  # a strided view: the kernel follows out's strides and writes nothing else
    got = skinny_linear(x, w, config=config, out=out)
    return {**_excess(got, x, w), "same_out": got is out, "untouched": bool(wide[:, 1::2].isnan().all())}


def _workspace_reuse() -> dict:
    """One workspace through split 3, split 2 (another tile), then split 3 again."""
    from pulseio_engine.model.skinny_gemm import SkinnyConfig, SkinnyWorkspace, skinny_linear

    x, w = _inputs(8, 70, 200, torch.bfloat16, seed=1)
    ws = SkinnyWorkspace.allocate(70, max_split_k=3, device="cpu")
    three, two = SkinnyConfig(16, 32, 3, 4, 2), SkinnyConfig(32, 64, 2, 4, 2)
    first = skinny_linear(x, w, config=three, workspace=ws).clone()
    counters_after_first = ws.counters.tolist()
    other = skinny_linear(x, w, config=two, workspace=ws)
    again = skinny_linear(x, w, config=three, workspace=ws)
    return {"bit_equal": bool(torch.equal(first, again)), "counters_after_first": counters_after_first,
            "counters_after_all": ws.counters.tolist(), "other": _excess(other, x, w), "first": _excess(first, x, w)}


def _linear_op() -> dict:
    """`linear` with a workspace: the custom op for the rows and weights `runs_skinny` names (eager and inside
    torch.compile(fullgraph=True)), F.linear itself for more rows, a smaller weight, none, or a bias."""
    import torch.nn.functional as F

    import pulseio_engine.model.linear as linear_module
    from pulseio_engine.model.linear import linear
    from pulseio_engine.model.skinny_gemm import SkinnyWorkspace

    # this 70 x 200 weight runs skinny up to 16 rows; one of 35 rows, or more rows, go to F.linear
    linear_module.MIN_WEIGHT, linear_module.MIN_WEIGHT_PAST_16_ROWS = 70 * 200, 70 * 200 + 1
    x, w = _inputs(16, 70, 200, torch.bfloat16, seed=2)
    ws = SkinnyWorkspace.allocate(70, max_split_k=8, device="cpu")
    workspace = (ws.partials, ws.counters)
    op, calls = linear_module._skinny_linear_op, []
    linear_module._skinny_linear_op = lambda *args: calls.append(args[0].shape[0]) or op(*args)
    eager = linear(x, w, workspace=workspace)
    x17 = torch.cat([x, x[:1]])
    rows17 = bool(torch.equal(linear(x17, w, workspace=workspace), F.linear(x17, w)))
    small = bool(torch.equal(linear(x, w[:35], workspace=workspace), F.linear(x, w[:35])))
    linear_module._skinny_linear_op = op
    compiled = torch.compile(lambda a: linear(a * 1, w, workspace=workspace), fullgraph=True)(x)
    x0, bias = x[:0], torch.randn(70).to(torch.bfloat16)
    return {"eager": _excess(eager, x, w), "compiled_equal": bool(torch.equal(compiled, eager)),
            "op_calls": calls, "rows17_is_f_linear": rows17, "small_weight_is_f_linear": small,
            "rows0_is_f_linear": list(linear(x0, w, workspace=workspace).shape) == [0, 70],
            "bias_is_f_linear": bool(torch.equal(linear(x, w, bias, workspace), F.linear(x, w, bias))),
            "counters": ws.counters.tolist()}


def _main() -> None:
    run_cases([(name, _run_case, args) for name, args in CASES.items()]
              + [("workspace-reuse", _workspace_reuse, ()), ("linear-op", _linear_op, ())])


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return interpreted_results(__file__)


@pytest.mark.needs_package("triton")
@pytest.mark.parametrize("name", list(CASES))
def test_interpreted_kernel_matches_fp32_product(interpreted: dict, name: str) -> None:
    result = interpreted[name]
    assert "error" not in result, result.get("error")
    assert result["max_ref"] > 0.5, result  # the check below is not vacuous
    assert result["bad"] == 0, result
    assert result["same_out"] and result["untouched"], "writes into the given out view, and only there"


@pytest.mark.needs_package("triton")
def test_interpreted_workspace_is_reused_without_a_memset(interpreted: dict) -> None:
    result = interpreted["workspace-reuse"]
    assert "error" not in result, result.get("error")
    assert result["first"]["bad"] == 0 and result["other"]["bad"] == 0, result
    assert set(result["counters_after_first"]) == {0} and set(result["counters_after_all"]) == {0}, result
    assert result["bit_equal"], "the same call through a reused workspace must give the same bits"


@pytest.mark.needs_package("triton")
def test_interpreted_linear_takes_few_rows_to_the_kernel_and_the_rest_to_f_linear(interpreted: dict) -> None:
    result = interpreted["linear-op"]
    assert "error" not in result, result.get("error")
    assert result["eager"]["bad"] == 0 and result["eager"]["max_ref"] > 0.5, result
    assert result["op_calls"] == [16], "16 rows of a large enough weight, and only they, run the custom op"
    assert result["compiled_equal"], "the custom op inside torch.compile must run the same kernel"
    assert result["rows17_is_f_linear"] and result["small_weight_is_f_linear"], result
    assert result["rows0_is_f_linear"] and result["bias_is_f_linear"], result
    assert set(result["counters"]) == {0}, result


# ---- in-process: configs and argument errors (nothing is launched) ------------------------------------------

@pytest.mark.needs_package("triton")
def test_default_config_splits_k_only_where_row_blocks_are_few() -> None:
    """The sweep's winners on an H200: wide row blocks unsplit where N gives the SMs enough of them, else
    64-row blocks with K split to two programs an SM."""
    from pulseio_engine.model.skinny_gemm import default_config

    tiles = {name: (c.block_n, c.block_k, c.split_k, c.num_warps, c.num_stages)
             for name, (n, k) in QWEN3_14B.items() for c in [default_config(8, n, k, 132)]}
    assert tiles == {"qkv": (32, 256, 1, 4, 3), "o": (64, 128, 4, 4, 3), "gate_up": (128, 64, 1, 8, 3),
                     "down": (64, 128, 4, 4, 3), "lm_head": (128, 128, 1, 8, 4)}
    assert default_config(1, 64, 64, 132).split_k == 1  # one K tile: nothing to split
    assert default_config(8, 5120, 5120, 132) is default_config(8, 5120, 5120, 132)


@pytest.mark.needs_package("triton")
def test_bad_arguments_name_the_value_and_the_fix() -> None:
    from pulseio_engine.model.skinny_gemm import SkinnyConfig, SkinnyWorkspace, skinny_linear

    x, w = _inputs(4, 32, 64, torch.bfloat16)
    with pytest.raises(ValueError, match=r"^x must be \[M, K\] with 1 <= M <= 32, got shape \[33, 64\]; "
                                         r"use F.linear for more rows$"):
        skinny_linear(torch.zeros((33, 64), dtype=torch.bfloat16), w)
    with pytest.raises(ValueError, match=r"^x must be \[M, K\] with 1 <= M <= 32, got shape \[0, 64\]"):
        skinny_linear(torch.zeros((0, 64), dtype=torch.bfloat16), w)
    with pytest.raises(TypeError, match=r"^x must be bfloat16 or float16, got torch.float32; cast it"):
        skinny_linear(x.float(), w.float())
    with pytest.raises(TypeError, match=r"^weight must have x's dtype torch.bfloat16, got torch.float16$"):
        skinny_linear(x, w.half())
    with pytest.raises(TypeError, match=r"^weight must be a torch.Tensor, got list$"):
        skinny_linear(x, [[1.0]])
    with pytest.raises(ValueError, match=r"^weight must be \[N, K\] with K = 64 \(x's\), got shape \[32, 63\]$"):
        skinny_linear(x, w[:, :63].contiguous())
    with pytest.raises(ValueError, match=r"^weight must be row-major \(stride 1 along K\), got strides \(1, 32\); "
                                         r"pass weight.contiguous\(\)$"):
        skinny_linear(x, w.T.contiguous().T)
    with pytest.raises(ValueError, match=r"^out must be \[4, 32\] torch.bfloat16 on cpu, got \[4, 31\]"):
        skinny_linear(x, w, out=torch.empty((4, 31), dtype=torch.bfloat16))
    small = SkinnyWorkspace.allocate(32, max_split_k=1, device="cpu")
    with pytest.raises(ValueError, match=r"^workspace too small or elsewhere: this call needs partials >= "
                                         r"\[2, 32, 32\] and >= 2 counters on cpu, got \[1, 32, 32\] and 2 on cpu; "
                                         r"use SkinnyWorkspace.allocate\(32, max_split_k=2, device=...\)$"):
        skinny_linear(x, w, config=SkinnyConfig(16, 32, 2, 4, 2), workspace=small)


@pytest.mark.needs_package("triton")
def test_config_and_workspace_reject_bad_values() -> None:
    from pulseio_engine.model.skinny_gemm import SkinnyConfig, SkinnyWorkspace

    with pytest.raises(ValueError, match=r"^block_n must be a power of two >= 16, got 24$"):
        SkinnyConfig(24, 64, 1, 4, 3)
    with pytest.raises(ValueError, match=r"^block_k must be a power of two >= 16, got 8$"):
        SkinnyConfig(16, 8, 1, 4, 3)
    with pytest.raises(ValueError, match=r"^split_k must be in \[1, 64\], got 0$"):
        SkinnyConfig(16, 64, 0, 4, 3)
    with pytest.raises(ValueError, match=r"^num_warps must be one of 1, 2, 4, 8, 16, got 3$"):
        SkinnyConfig(16, 64, 1, 3, 3)
    with pytest.raises(ValueError, match=r"^partials must be \[splits, 32, N\] float32 with unit last stride, "
                                         r"got \[2, 32, 8\] torch.bfloat16; use SkinnyWorkspace.allocate$"):
        SkinnyWorkspace(torch.zeros((2, 32, 8), dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^counters must be a contiguous \[n\] int32 tensor on cpu, got \[1\] "
                                         r"torch.int64 on cpu; use SkinnyWorkspace.allocate$"):
        SkinnyWorkspace(torch.zeros((2, 32, 8)), torch.zeros(1, dtype=torch.long))


@pytest.mark.needs_package("triton")
def test_the_bench_dry_run_times_and_checks_every_variant(tmp_path: Path) -> None:
    """benchmarks/bench_skinny_gemm.py --quick: the H200 sweep's bookkeeping on tiny shapes, interpreted."""
    out = tmp_path / "bench.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_skinny_gemm.py"), "--quick", "--json",
                           str(out)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["shape"], r["m"]) for r in result["summary"]] == [("down", 1), ("down", 8)]
    assert all(r["bad"] == 0 and r["failed"] == 0 and r["best_us"] > 0 for r in result["summary"]), result["summary"]
    tags = {r["tag"] for r in result["rows"]}
    assert tags == {"torch", "default", "tile", "split"}, tags
    assert any(r["config"] and r["config"]["split_k"] > 1 for r in result["rows"]), "the sweep must split K"
    assert "SUMMARY" in proc.stdout


def test_the_engine_takes_skinny_projections_only_where_they_run() -> None:
    """A workspace (so skinny_linear) on a GPU in bf16 / fp16 unless EngineConfig.skinny_gemm is off; never on a
    CPU or in fp32, where every projection is F.linear."""
    from pulseio_engine.engine import Engine
    from pulseio_engine.model.linear import decode_workspace
    from pulseio_engine.model.presets import preset_config

    config = preset_config("qwen3-14b")
    assert decode_workspace(config, torch.device("cpu"), torch.bfloat16) is None
    assert decode_workspace(config, torch.device("cuda"), torch.float32) is None
    assert Engine.from_model("tiny", device="cpu").model.workspace is None
    if torch.cuda.is_available():
        assert Engine.from_model("tiny", device="cuda").model.workspace is not None
        assert Engine.from_model("tiny", device="cuda", skinny_gemm=False).model.workspace is None


@pytest.mark.parametrize(("rows", "skinny"), [(1, {"qkv", "gate_up", "down", "lm_head"}),
                                               (16, {"qkv", "gate_up", "down", "lm_head"}),
                                               (17, {"gate_up", "down", "lm_head"}),
                                               (32, {"gate_up", "down", "lm_head"}), (0, set()), (33, set())])
def test_skinny_runs_the_projections_it_reads_faster_than_cublas(rows: int, skinny: set[str]) -> None:
    """qwen3-14b's projections: o_proj always on cuBLAS, qkv up to 16 rows, the larger weights up to MAX_ROWS."""
    from pulseio_engine.model.linear import runs_skinny

    assert {name for name, (n, k) in QWEN3_14B.items() if runs_skinny(rows, n, k)} == skinny


@pytest.mark.needs_package("triton")
def test_linear_routes_as_many_rows_as_the_kernel_takes() -> None:
    """linear.py keeps its own copy of the row limit so that CPU installs never import Triton."""
    from pulseio_engine.model import linear, skinny_gemm

    assert linear.MAX_ROWS == skinny_gemm.MAX_ROWS


@pytest.mark.needs_package("triton")
@pytest.mark.parametrize("preset", ["qwen3-8b", "qwen3-14b", "llama-3.1-8b", "tiny"])
def test_the_workspace_covers_every_projection_that_splits_k(preset: str) -> None:
    """o_proj and down share N but not K: each may split differently, and the workspace must hold the larger."""
    from pulseio_engine.model.linear import workspace_extent
    from pulseio_engine.model.presets import preset_config
    from pulseio_engine.model.skinny_gemm import default_config

    c = preset_config(preset)
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = [(q + 2 * kv, c.hidden_size), (c.hidden_size, q), (2 * c.intermediate_size, c.hidden_size),
              (c.hidden_size, c.intermediate_size), (c.vocab_size, c.hidden_size)]
    for sms in (66, 132):
        max_n, max_split = workspace_extent(c, sms)
        for n, k in shapes:
            split = default_config(8, n, k, sms).split_k
            assert split <= max_split and (split == 1 or n <= max_n), (preset, sms, n, k, split, max_n, max_split)


def test_a_gpu_without_triton_is_told_once_and_runs_on_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    from pulseio_engine.model.linear import decode_workspace
    from pulseio_engine.model.presets import preset_config

    monkeypatch.setitem(sys.modules, "triton", None)                           # import triton now fails
    monkeypatch.delitem(sys.modules, "pulseio_engine.model.skinny_gemm", raising=False)
    with pytest.warns(UserWarning, match=r"^skinny_linear needs Triton \(.*\); decode projections run on cuBLAS$"):
        assert decode_workspace(preset_config("tiny"), torch.device("cuda"), torch.bfloat16) is None


# ---- on a GPU ---------------------------------------------------------------------------------------------

QWEN3_14B = {"qkv": (7168, 5120), "o": (5120, 5120), "gate_up": (34816, 5120), "down": (5120, 17408),
             "lm_head": (151936, 5120)}  # name -> (N, K)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [8, 32])
@pytest.mark.parametrize("name", list(QWEN3_14B))
def test_gpu_matches_f_linear_at_qwen3_14b_shapes(name: str, rows: int) -> None:
    from pulseio_engine.model.skinny_gemm import skinny_linear

    n, k = QWEN3_14B[name]
    x, w = (t.cuda() for t in _inputs(rows, n, k, torch.bfloat16))
    got = skinny_linear(x, w)
    assert _excess(got, x, w)["bad"] == 0, _excess(got, x, w)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, w), rtol=2 * torch.finfo(x.dtype).eps, atol=ATOL)


@pytest.mark.gpu
def test_gpu_graph_replays_reuse_the_workspace() -> None:
    """o_proj's default config splits K; three replays of a captured call give the eager call's bits."""
    from pulseio_engine.model.skinny_gemm import SkinnyWorkspace, default_config, skinny_linear

    n, k = QWEN3_14B["o"]
    x, w = (t.cuda() for t in _inputs(8, n, k, torch.bfloat16))
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    assert default_config(8, n, k, sms).split_k > 1
    ws = SkinnyWorkspace.allocate(n, max_split_k=8, device=x.device)
    out = torch.empty((8, n), dtype=x.dtype, device=x.device)
    eager = skinny_linear(x, w, workspace=ws).clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        skinny_linear(x, w, out=out, workspace=ws)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    assert int(ws.counters.abs().sum()) == 0


if __name__ == "__main__":
    _main()
