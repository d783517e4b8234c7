#!/usr/bin/env bash
# Session 43 (2026-12-06, CPU): the engine's recall ahead with a prediction larger than the budget
# (`OffloadConfig.ahead_budget`, `replay --ahead --ahead-budget F`) on the model the presets' locality was measured on:
# an offload request's recall after each layer's own query without `ahead` and with it at 1.25 and 1.5 budgets, and the
# prefetch's traffic (`benchmarks/recall_ahead.py`). Repository root: `bash <this file>` (about 6 minutes on 2 cores).
set -euo pipefail
D=${1:-benchmarks/results/recall-ahead-overfetch-2026-12-06-cpu}
H=benchmarks/results/locality-2026-11-30-cpu/heads_qwen2.5-coder-0.5b.json
python benchmarks/recall_ahead.py --steps 16 --token-budget 1024 --heads $H --context-len 8192 \
    --ahead-budget 1.25 1.5 --json $D/qwen-8k-solohead-overfetch.json > $D/qwen-8k-solohead-overfetch.log 2>&1
