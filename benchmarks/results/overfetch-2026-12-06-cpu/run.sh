#!/usr/bin/env bash
# Session 42 (2026-12-06, CPU): a layer's prediction made at more than the budget (over-fetch), on the real model the
# presets' locality was measured on: how much of a step's recall is left for after its own query, for how much
# traffic. Repository root: `bash <this file>` (about 2 minutes on 2 cores).
set -euo pipefail
D=${1:-benchmarks/results/overfetch-2026-12-06-cpu}
H=benchmarks/results/locality-2026-11-30-cpu/heads_qwen2.5-coder-0.5b.json
python benchmarks/speculative_selection.py --steps 16 --samples 2 --heads $H --context-len 8192 --token-budget 1024 \
  --ahead 1 --overfetch 1 1.25 1.5 2 --json $D/qwen-8k-b1024-overfetch.json > $D/qwen-8k-b1024-overfetch.log 2>&1
