#!/usr/bin/env bash
# The efficiency each configuration's rounds need for 3x vanilla and for the short requests' TPOT p99 within 1.1x
# vanilla's, on both windows the README quotes (CPU, ~2 min): forecast_serving.py --need 3 --need-tpot 1.1.
set -eu
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/forecast-tpot-2026-12-06-cpu
for hot in 1.5 2 3 4; do
  for window in "--duration 40 --time-scale 0.15" "--trace servegen-mix --start 600 --duration 60 --time-scale 0.05"; do
    echo "## hot sets of $hot budgets; $window"
    python benchmarks/forecast_serving.py $window --budget 1024 --threshold 2048 4096 8192 --host-kv-gib 64 \
      --hot-cache $hot --locality-context 8192 --modes vanilla "pulseinfer --ride --ahead" pulseinfer \
      --need 3 --need-tpot 1.1
    echo
  done
done > $OUT/forecast.txt 2>&1
