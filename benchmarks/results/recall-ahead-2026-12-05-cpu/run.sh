#!/usr/bin/env bash
# Session 37 (2026-12-05, CPU): the engine's recall ahead (`OffloadConfig.ahead`, `replay --ahead`) on the real
# models the presets' locality was measured on: an offload request's recall after each layer's own query, with and
# without it, and the prefetch's traffic (`benchmarks/recall_ahead.py`). Repository root: `bash <this file>`
# (about 25 minutes on 2 cores).
set -euo pipefail
D=${1:-benchmarks/results/recall-ahead-2026-12-05-cpu}
H=benchmarks/results/locality-2026-11-30-cpu/heads_qwen2.5-coder-0.5b.json
HS=benchmarks/results/accuracy-2026-11-30-cpu/heads_smollm2.json
R="python benchmarks/recall_ahead.py --steps 16 --token-budget 1024"
run() {  # name, then its options
  local name=$1; shift
  [ -s $D/$name.json ] || $R "$@" --json $D/$name.json > $D/$name.log 2>&1
}
run qwen-8k-solohead --heads $H --context-len 8192
run qwen-8k-quest --context-len 8192
run smollm2-4k-solohead --model smollm2 --heads $HS --context-len 4096
