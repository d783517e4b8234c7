#!/usr/bin/env bash
# Recall locality of quest and solohead on real models, CPU: `pulseio-engine locality` per (model, context,
# budget, mode), 64 decode steps of Shakespeare text each; then the records are joined into the file the
# package ships (pulseio_engine/data/locality.json). Run from anywhere; MODELS picks the models.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=.
O=benchmarks/results/locality-2026-11-30-cpu
MODELS=${MODELS:-"smollm2 qwen2.5-coder-0.5b"}
STEPS=64
run() {   # model context budget mode heads
  local out=$O/$1_$2_$3_$4.json
  [ -s "$out" ] && return 0
  python -m pulseio_engine.cli locality --model "$1" --context-len "$2" --token-budget "$3" --mode "$4" \
    --heads "$5" --steps $STEPS --json "$out" >> $O/locality.log 2>&1
}
for model in $MODELS; do
  case $model in
    smollm2) heads=benchmarks/results/accuracy-2026-11-30-cpu/heads_smollm2.json; contexts="2048 4096" ;;
    *) heads=$O/heads_$model.json; contexts="2048 4096"
       [ -s "$heads" ] || python -m pulseio_engine.cli calibrate --model "$model" --out "$heads" --prompts 8 \
         --prompt-len 512 > $O/calibrate_$model.log 2>&1 ;;
  esac
  for context in $contexts; do
    budgets="512 1024"; [ "$context" -ge 4096 ] && budgets="512 1024 2048"
    for budget in $budgets; do
      for mode in quest solohead; do run "$model" "$context" "$budget" "$mode" "$heads"; done
    done
  done
done
python - "$O" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
records = [json.loads(p.read_text()) for p in sorted(out.glob("*_*_*_*.json"))]
records.sort(key=lambda r: (r["model"], r["mode"], r["context_len"], r["token_budget"]))
data = {"about": "Step-to-step overlap of the middle blocks each offloaded layer selects, and the fraction of the "
                 "budget recalled per step, measured on real models decoding Shakespeare text on CPU "
                 "(see pulseio_engine/evaluation/locality.py for the definitions)",
        "command": "bash benchmarks/results/locality-2026-11-30-cpu/run.sh", "records": records}
Path("pulseio_engine/data/locality.json").write_text(json.dumps(data, indent=1) + "\n")
print(f"{len(records)} records -> pulseio_engine/data/locality.json")
PY
