#!/usr/bin/env bash
# Per-layer selection probe on qwen2.5-coder-0.5b, CPU fp32, context 8192, samples 0 1 (run from the repo root).
set -euo pipefail
D=benchmarks/results/accuracy-2026-12-01-h200/qwen2.5-selection-per-layer
H=benchmarks/results/accuracy-qwen2.5-2026-11-30-h200/heads_qwen2.5-coder-0.5b.json
probe() {  # name, then the probe's arguments
    local name=$1; shift
    PYTHONPATH=. python benchmarks/probe_selection.py --model qwen2.5-coder-0.5b --mode solohead \
        --context-len 8192 --samples 0 1 --heads "$H" --json "$D/$name.json" "$@" 2>&1 | tee "$D/$name.log"
}
probe common-words_512 --task common-words --token-budget 512
probe niah-single_512 --task niah-single --token-budget 512
probe common-words_2048 --task common-words --token-budget 2048
probe variable-tracking_512 --task variable-tracking --token-budget 512
probe common-words_512_steps16 --task common-words --token-budget 512 --answer-steps 16
