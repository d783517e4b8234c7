"""The serving roofline of replay reports written before the replay measured it (schema < 8), from what they keep.

A report keeps every request's record (its class, prompt length and tokens) and how many rounds ran each batch
size. What a decode step reads (`pulseio_engine.step_bytes`) is the weights once per batch step plus each
request's own KV, digests and bookkeeping, so the KV part sums over the requests' steps (a request decoding token
i has input_len + i tokens) and the weights over the batch sizes' rounds: the same bytes the replay's
`RoundBytes` counts, but where a normal request that grew to the offload threshold moved later than at it (the
budget held it back; it is counted offloaded from the threshold on). The rates are not in those
reports; pass the ones measured on the same kind of machine (the sparse bench prints both:
`copy_bandwidth_gbps`, `link_peak_gbps`). Reports with a `roofline` section are printed as they measured it.

    python benchmarks/estimate_serving_roofline.py REPORT.json... --copy-gbps 4290 --link-gbps 55.2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pulseio_engine.config import SparseConfig, SparseMode
from pulseio_engine.model.checkpoint import open_model
from pulseio_engine.serving.roofline import RoundBytes, roofline
from pulseio_engine.step_bytes import StepShape, step_bytes

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def estimate(report: dict, *, copy_gbps: float, link_gbps: float) -> dict:
    """The report's `roofline` section as the replay would have written it, from its records."""
    config, summary = report["config"], report["summary"]
    model = open_model(report["model"]).config
    sparse = None if config["selection"] is None else SparseConfig(mode=SparseMode(config["selection"]),
                                                                   token_budget=config["token_budget"])
    shape = StepShape.for_model(model, dtype_bytes=DTYPE_BYTES[report["dtype"]], sparse=sparse)
    read = RoundBytes()
    threshold = config["offload_threshold"]
    for r in report["requests"]:
        moved_up = r["class"] == "normal" and r["moves"] == 1      # moved to offload as it grew to the threshold
        for i in range(r["tokens"]):                   # KV and the rest of each of the request's steps
            context = r["input_len"] + i
            offload = r["class"] == "offload" or (moved_up and context >= threshold)
            b = step_bytes(shape, [context], offload=offload)
            read.kv += b.total - b.weights
    normal_steps = summary.get("normal_steps_mean") or 1.0    # the normal batch's steps a round, on average
    for name, batches in report["batches"].items():
        for size, rounds in batches.items():
            if int(size) > 0:
                n = round(rounds * (normal_steps if name == "normal" else 1))
                read.weights += n * shape.weight_bytes(int(size))
                read.steps += n
    # older reports do not say how long the engine stood idle between arrivals: a throughput-bound window never does
    return roofline(read, summary["recalled_bytes"], summary["duration_s"], summary["output_tokens"],
                    copy_gbps=copy_gbps, link_gbps=link_gbps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--copy-gbps", type=float, required=True, help="device-to-device copy, GB/s (read+written)")
    parser.add_argument("--link-gbps", type=float, required=True, help="pinned host -> device copy, GB/s")
    args = parser.parse_args(argv)
    for path in args.reports:
        report = json.loads(path.read_text())
        measured = report.get("roofline")
        roof = measured or estimate(report, copy_gbps=args.copy_gbps, link_gbps=args.link_gbps)
        s = report["summary"]
        print(f"{path}: {report['mode']} ({'measured' if measured else 'estimated'}): "
              f"{s['decode_throughput_tok_s']:.1f} tok/s, bound {roof['bound_tok_s']:.1f} tok/s "
              f"({roof['ratio']:.2f}x): weights {roof['weights_bytes'] / 1e12:.2f} TB in {roof['batch_steps']} batch "
              f"steps, KV {roof['kv_bytes'] / 1e12:.2f} TB, {roof['hbm_s']:.2f} s at {roof['copy_gbps']:.0f} GB/s; "
              f"recalled {roof['recalled_bytes'] / 1e9:.1f} GB, "
              + ("-" if roof["link_s"] is None else f"{roof['link_s']:.2f} s at {roof['link_gbps']:.1f} GB/s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
