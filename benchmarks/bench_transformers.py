"""transformers `generate()` at long context with each KV cache: tokens/s and GPU memory.

A Qwen3-8B-shaped model (Qwen3Config: 36 layers, hidden 4096, 32 q / 8 kv heads, head_dim 128, intermediate
12288, vocab 151936, bf16) built by transformers from its config with random weights on the GPU; one
request of --context random token ids, prefilled at once; then --new-tokens greedy tokens, each step timed
(a logits processor that synchronizes the device and stamps the clock). Modes, one generate() each, in one
process on one prompt:

    default          transformers' DynamicCache (all KV on the GPU)
    hf-offloaded     cache_implementation="offloaded" (transformers' own: each layer copied to the CPU after
                     its update and the next layer back on a side stream)
    pulseio-layer    pulseio.integrations.transformers.LayerOffloadCache (whole layers, prefetched)
    pulseio-sparse   SparseOffloadCache with SoloHead (one fixed KV head per layer selects) and with Quest
                     (every KV head selects), --budget tokens a layer; each layer's decode work replays from
                     CUDA graphs from the second decode step on; "-eager" runs SoloHead without them (its
                     tokens must equal the graphed run's: a check, and what the graphs buy)

    python benchmarks/bench_transformers.py --json out/bench.json     # H200: ~4 minutes, see run_transformers_gpu.sh
    python benchmarks/bench_transformers.py --smoke                    # CPU, a tiny config, seconds (CI)

Random weights: the selection's top-k jumps from step to step far more than on a real model (~10% of the
budget recalled a step at budget 2048, measured on SmolLM2 and Qwen2.5), so the sparse rows recall more
than a real model would; the output says how much they recalled. Nothing is skipped or faked: every mode
runs its real path (scoring, selection, recall, attention).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's pulseio, not an installed one

MODES = ("default", "hf-offloaded", "pulseio-layer", "pulseio-sparse-solohead", "pulseio-sparse-quest",
         "pulseio-sparse-solohead-eager")
QWEN3_8B = dict(num_hidden_layers=36, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                intermediate_size=12288, vocab_size=151936, max_position_embeddings=40960, rope_theta=1e6,
                tie_word_embeddings=False)
TINY = dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=512, max_position_embeddings=4096, rope_theta=1e6,
            tie_word_embeddings=False)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class ModeResult:
    mode: str
    ms_per_token: float | None = None  # mean decode step after the first
    tokens_per_s: float | None = None
    first_steps_ms: list[float] = field(default_factory=list)  # the first two decode steps, left out of
    # ms_per_token: the sparse hot sets fill on the first, its CUDA graphs are captured on the second
    prefill_s: float | None = None
    peak_gib: float | None = None  # torch.cuda.max_memory_allocated over the whole generate()
    decode_peak_gib: float | None = None  # ... over the decode steps only
    steady_gib: float | None = None  # torch.cuda.memory_allocated during decode
    cache_claimed_gib: float | None = None  # the pulseio cache's memory_footprint().device_bytes
    cache_host_gib: float | None = None
    recalled_mib_per_step: float | None = None
    recall_gbps: float | None = None  # recalled bytes / decode time (the link's share the cache used)
    same_tokens_as_default: bool | None = None
    graphed_halves: int | None = None  # sparse: decode halves replaying CUDA graphs (2 a layer once captured)
    graph_failure: str | None = None
    tokens: list[int] = field(default_factory=list)
    error: str | None = None


class StepClock:
    """A logits processor: called once per generated token, after the step's forward. Synchronizes the device
    (so a stamp is the step's end) and records time and memory; at the first call (the prefill's end) it
    takes the prefill's memory peak and the cache's statistics."""

    def __init__(self, device: torch.device, cache: Any) -> None:
        self.device, self.cache = device, cache
        self.stamps: list[float] = []
        self.allocated: list[int] = []
        self.prefill_peak = 0
        self.first_stats: Any = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.allocated.append(torch.cuda.memory_allocated(self.device))
            if not self.stamps:
                self.prefill_peak = torch.cuda.max_memory_allocated(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)  # from here on: the decode steps' peak
        if not self.stamps and self.cache is not None:
            self.first_stats = self.cache.statistics()
        self.stamps.append(time.perf_counter())
        return scores


def build_model(args: argparse.Namespace) -> Any:
    import transformers

    import pulseio.integrations.transformers as pulse_hf

    shape = TINY if args.smoke else QWEN3_8B
    config = transformers.Qwen3Config(**shape, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(args.device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                              attn_implementation=pulse_hf.SPARSE_ATTENTION)
    return model.eval()


def make_cache(mode: str, model: Any, args: argparse.Namespace, max_len: int) -> Any:
    from pulseio.integrations.transformers import LayerOffloadCache, SparseOffloadCache

    if mode == "pulseio-layer":
        import pulseio

        dma = pulseio.DmaConfig(inline_issue=True) if args.layer_issue == "inline" else None
        return LayerOffloadCache(model, max_cache_len=max_len, prefetch_layers=args.prefetch_layers, dma=dma)
    if mode.startswith("pulseio-sparse"):
        layers, kv = model.config.num_hidden_layers, model.config.num_key_value_heads
        heads = None if "quest" in mode else [layer % kv for layer in range(layers)]
        return SparseOffloadCache(model, max_cache_len=max_len, budget_tokens=args.budget, heads=heads,
                                  cuda_graphs=not mode.endswith("-eager"))
    return None


def generate(model: Any, mode: str, prompt: torch.Tensor, new_tokens: int, cache: Any, clock: StepClock | None
             ) -> torch.Tensor:
    from pulseio.integrations.transformers import cache_kwargs

    kwargs: dict[str, Any] = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    if mode == "hf-offloaded":
        kwargs["cache_implementation"] = "offloaded"
    if cache is not None:
        kwargs.update(cache_kwargs(model, cache))
    if clock is not None:
        kwargs["logits_processor"] = [clock]
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs)[0, prompt.shape[1]:]


def run_mode(mode: str, model: Any, prompt: torch.Tensor, args: argparse.Namespace) -> ModeResult:
    from pulseio.integrations.transformers import SPARSE_ATTENTION

    result, dev = ModeResult(mode), torch.device(args.device)
    model.set_attn_implementation(SPARSE_ATTENTION if mode.startswith("pulseio-sparse") else "sdpa")
    # the warm-up is the timed run itself by default (--warmup-context): the same shapes step by step, so
    # what is built once per shape (cuDNN attention plans, kernel variants) is built before the clock runs;
    # a shorter one left it to whichever mode ran first (seen on the H200: that mode 2-3x slower)
    warm = prompt[:, :args.warmup_context]
    new = args.new_tokens if warm.shape[1] == prompt.shape[1] else 2
    with _closing(make_cache(mode, model, args, warm.shape[1] + new)) as cache:
        generate(model, mode, warm, new, cache, None)  # first launches, the runtime's threads, allocator growth
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    start = time.perf_counter()
    with _closing(make_cache(mode, model, args, prompt.shape[1] + args.new_tokens)) as cache:
        built = time.perf_counter()
        log(f"{mode}: cache built in {built - start:.1f} s; generating")
        clock = StepClock(dev, cache)
        tokens = generate(model, mode, prompt, args.new_tokens, cache, clock)
        _fill(result, clock, built, dev, tokens)
        if cache is not None:
            _fill_cache(result, cache, clock)
    return result


def _fill(result: ModeResult, clock: StepClock, start: float, dev: torch.device, tokens: torch.Tensor) -> None:
    steps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]  # decode steps (the first stamp ends prefill)
    result.prefill_s = clock.stamps[0] - start
    result.first_steps_ms = [round(x * 1e3, 2) for x in steps[:2]]
    later = steps[2:] or steps
    result.ms_per_token = sum(later) / len(later) * 1e3
    result.tokens_per_s = 1e3 / result.ms_per_token
    result.tokens = tokens.tolist()
    if dev.type == "cuda":
        result.decode_peak_gib = torch.cuda.max_memory_allocated(dev) / 2**30
        result.steady_gib = max(clock.allocated[1:] or clock.allocated) / 2**30
        result.peak_gib = max(result.decode_peak_gib, clock.prefill_peak / 2**30)


def _fill_cache(result: ModeResult, cache: Any, clock: StepClock) -> None:
    footprint, after = cache.memory_footprint(), cache.statistics()
    result.cache_claimed_gib = footprint.device_bytes / 2**30
    result.cache_host_gib = footprint.host_bytes / 2**30
    moved = after.bytes_recalled - clock.first_stats.bytes_recalled  # landed during the decode steps
    if hasattr(after, "graphed_halves"):
        result.graphed_halves, result.graph_failure = after.graphed_halves, after.graph_failure
    decode_s = clock.stamps[-1] - clock.stamps[0]
    steps = max(len(clock.stamps) - 1, 1)
    result.recalled_mib_per_step = moved / steps / 2**20
    result.recall_gbps = moved / decode_s / 1e9 if decode_s > 0 else None


class _closing:
    """`with _closing(cache)`: closes a pulseio cache (None passes through)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def __enter__(self) -> Any:
        return self.cache

    def __exit__(self, *exc: object) -> None:
        if self.cache is not None:
            self.cache.close()


def link_peak_gbps(device: torch.device) -> float | None:
    """One 1 GiB pinned host -> device copy, best of three (the PCIe link's peak in this process)."""
    if device.type != "cuda":
        return None
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty_like(host, device=device)
    best = 0.0
    for _ in range(3):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
        best = max(best, (1 << 30) / (time.perf_counter() - start) / 1e9)
    del host, dev
    return best


def ratios(results: dict[str, ModeResult]) -> dict[str, float | None]:
    """The acceptance's ratios of tokens/s (None where a mode failed)."""
    def tps(mode: str) -> float | None:
        r = results.get(mode)
        return None if r is None or r.tokens_per_s is None else r.tokens_per_s

    def ratio(a: str, b: str) -> float | None:
        x, y = tps(a), tps(b)
        return None if x is None or y is None else x / y

    return {"layer_over_hf_offloaded": ratio("pulseio-layer", "hf-offloaded"),
            "sparse_solohead_over_layer": ratio("pulseio-sparse-solohead", "pulseio-layer"),
            "sparse_quest_over_layer": ratio("pulseio-sparse-quest", "pulseio-layer"),
            "layer_over_default": ratio("pulseio-layer", "default"),
            "sparse_graphs_over_eager": ratio("pulseio-sparse-solohead", "pulseio-sparse-solohead-eager")}


def checks(results: dict[str, ModeResult]) -> dict[str, bool | None]:
    """Token agreements that must hold (None where a mode is missing): whole-layer offload attends to the same
    KV as the default cache; a graphed sparse step computes what the eager one does."""
    def same(a: str, b: str) -> bool | None:
        x, y = results.get(a), results.get(b)
        return None if x is None or y is None or not x.tokens or not y.tokens else x.tokens == y.tokens

    return {"layer_tokens_equal_default": same("pulseio-layer", "default"),
            "sparse_graphed_tokens_equal_eager": same("pulseio-sparse-solohead", "pulseio-sparse-solohead-eager")}


def table(results: dict[str, ModeResult]) -> str:
    def f(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    rows = ["| mode | ms/token | tokens/s | first 2 steps ms | prefill s | GPU GiB steady | GPU GiB peak (decode) "
            "| cache GiB claimed (host) | recalled MiB/step | recall GB/s | graphed halves | tokens = default |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results.values():
        if r.error:
            rows.append(f"| {r.mode} | failed: {r.error[:80]} |")
            continue
        rows.append(f"| {r.mode} | {f(r.ms_per_token, '.1f')} | {f(r.tokens_per_s, '.2f')} | "
                    f"{'/'.join(f'{x:.0f}' for x in r.first_steps_ms) or '-'} | {f(r.prefill_s, '.1f')} | "
                    f"{f(r.steady_gib, '.2f')} | "
                    f"{f(r.peak_gib, '.2f')} ({f(r.decode_peak_gib, '.2f')}) | {f(r.cache_claimed_gib, '.3f')} "
                    f"({f(r.cache_host_gib, '.2f')}) | {f(r.recalled_mib_per_step, '.1f')} | "
                    f"{f(r.recall_gbps, '.1f')} | {'-' if r.graphed_halves is None else r.graphed_halves} | "
                    f"{r.same_tokens_as_default} |")
    return "\n".join(rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny config on the CPU, a few tokens (CI)")
    parser.add_argument("--device", default=None, help="default: cuda, or cpu with --smoke")
    parser.add_argument("--context", type=int, default=None, help="prompt tokens (default 32768; smoke 300)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens generated per mode (default 16; smoke 5)")
    parser.add_argument("--budget", type=int, default=None, help="sparse modes: tokens attended per layer "
                        "(default 2048; smoke 64, so the small context still recalls)")
    parser.add_argument("--prefetch-layers", type=int, default=1, help="pulseio-layer: layers recalled ahead")
    parser.add_argument("--layer-issue", choices=("worker", "inline"), default="worker",
                        help="pulseio-layer: issue the recalls on pulseio's worker thread (the cache's default) or "
                             "on the model's thread")
    parser.add_argument("--warmup-context", type=int, default=None,
                        help="prompt of each mode's warm-up generate() (default: the whole prompt, the timed run "
                             "once untimed; a shorter one decodes 2 tokens)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--json", type=Path, default=None, help="write every result and the run's facts here")
    args = parser.parse_args(argv)
    args.device = args.device or ("cpu" if args.smoke else "cuda")
    args.context = args.context or (300 if args.smoke else 32768)
    args.new_tokens = args.new_tokens or (5 if args.smoke else 16)
    args.budget = args.budget or (64 if args.smoke else 2048)
    args.warmup_context = min(args.warmup_context or args.context, args.context)
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    if args.new_tokens < 4:
        parser.error("--new-tokens must be >= 4 (the first two decode steps are reported apart)")
    return args


def facts(args: argparse.Namespace, model: Any, peak: float | None) -> dict[str, Any]:
    import transformers

    dev = torch.device(args.device)
    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
            "model": "tiny Qwen3 (smoke)" if args.smoke else "Qwen3-8B shape, random bf16 weights",
            "weights_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
            "context": args.context, "new_tokens": args.new_tokens, "batch": 1, "budget_tokens": args.budget,
            "prefetch_layers": args.prefetch_layers, "layer_issue": args.layer_issue, "link_peak_gbps": peak,
            "note": "random weights: the sparse top-k jumps from step to step far more than on a real model, so the "
                    "sparse modes recall more than they would there (real models: ~10% of the budget a step at "
                    "budget 2048); every mode runs its real path"}


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dev = torch.device(args.device)
    log(f"building the model ({'tiny, smoke' if args.smoke else 'Qwen3-8B shape'}) on {dev}")
    model = build_model(args)
    peak = link_peak_gbps(dev)
    log(f"model built; link peak {_round(peak, 1)} GB/s; prompt {args.context} tokens, "
        f"{args.new_tokens} new tokens per mode")
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.context), generator=generator).to(dev)
    results: dict[str, ModeResult] = {}
    for mode in args.modes:
        if mode == "hf-offloaded" and dev.type != "cuda":
            results[mode] = ModeResult(mode, error="transformers' offloaded cache needs a GPU")
            continue
        try:
            results[mode] = run_mode(mode, model, prompt, args)
        except Exception as exc:  # one failing mode must not lose the others' numbers
            results[mode] = ModeResult(mode, error=f"{type(exc).__name__}: {exc}")
            log(f"{mode} failed: {results[mode].error}")
        r = results[mode]
        if "default" in results and r.tokens and results["default"].tokens:
            r.same_tokens_as_default = r.tokens == results["default"].tokens
        log(f"{mode}: {_round(r.ms_per_token, 1)} ms/token, steady {_round(r.steady_gib, 2)} GiB, "
            f"recalled {_round(r.recalled_mib_per_step, 1)} MiB/step")
    summary = {"facts": facts(args, model, peak), "ratios": ratios(results), "checks": checks(results),
               "results": {m: asdict(r) for m, r in results.items()}}
    print(table(results))
    print(json.dumps(summary["ratios"]))
    print(json.dumps(summary["checks"]))
    print(summary["facts"]["note"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if all(r.error is None or r.mode == "hf-offloaded" and dev.type != "cuda" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
