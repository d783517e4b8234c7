#!/usr/bin/env bash
# Recall locality at longer contexts than the first profiles (2K-4K), CPU: does the overlap the presets are steered
# to hold at the serving windows' 8K-16K prompts and the bench's 32K? Qwen2.5-Coder-0.5B, heads from 2026-11-30.
#   bash benchmarks/results/locality-long-2026-12-05-cpu/run.sh     # CONTEXTS, BUDGETS, MODES to narrow it
set -euo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=.
O=benchmarks/results/locality-long-2026-12-05-cpu
H=benchmarks/results/locality-2026-11-30-cpu/heads_qwen2.5-coder-0.5b.json
for mode in ${MODES:-solohead quest}; do
  for context in ${CONTEXTS:-4096 8192 16384 32000}; do
    for budget in ${BUDGETS:-1024 2048}; do
      out=$O/qwen2.5-coder-0.5b_${context}_${budget}_${mode}.json
      [ -s "$out" ] && continue
      /usr/bin/time -f "%e s" python -m pulseio_engine.cli locality --model qwen2.5-coder-0.5b --context-len $context \
        --token-budget $budget --mode $mode --heads $H --steps 64 --json "$out" >> $O/locality.log 2>&1
    done
  done
done
python benchmarks/results/locality-long-2026-12-05-cpu/join.py      # the shipped records: 2026-11-30 (2K-4K) and these
