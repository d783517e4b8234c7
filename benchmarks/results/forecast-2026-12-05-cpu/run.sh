#!/usr/bin/env bash
# The serving forecasts of session 29 (2026-12-05, CPU, no GPU): repository root, `bash <this file> <folder>`.
set -eu
D=${1:-benchmarks/results/forecast-2026-12-05-cpu}
R=benchmarks/results
F="python benchmarks/forecast_serving.py"
MOON="--duration 20 --time-scale 0.3"                          # session 27's Mooncake window
SG="--trace servegen-mix --start 600 --duration 60 --time-scale 0.05"   # its ServeGen window
{ echo "\$ $F $MOON --fit ..."; $F $MOON --fit $R/serving-2026-12-03-h200/defaults-406dfe3/vanilla/vanilla.json \
    $R/serving-2026-12-04-h200/mooncake-eafcb09/pulseinfer/pulseinfer.json \
    $R/serving-2026-12-04-h200/mooncake-eafcb09/pulseinfer-noirq/pulseinfer-noirq.json; } > $D/fit-mooncake.txt
{ echo "\$ $F $SG --fit ..."; $F $SG --fit $R/serving-2026-12-04-h200/servegen-eafcb09/vanilla/vanilla.json \
    $R/serving-2026-12-04-h200/servegen-eafcb09/pulseinfer/pulseinfer.json; } > $D/fit-servegen.txt
{ echo "\$ $F $MOON --need 3"; $F $MOON --need 3; } > $D/mooncake.txt
{ echo "\$ $F $SG --need 3"; $F $SG --need 3; } > $D/servegen.txt
SWEEP="--modes vanilla pulseinfer --budget 1024 2048 --threshold 2048 4096 8192 --host-kv-gib 32 64 --normal-steps 1 2 3 --need 3"
{ echo "\$ $F $MOON $SWEEP"; $F $MOON $SWEEP; } > $D/sweep-mooncake.txt
{ echo "\$ $F $SG $SWEEP"; $F $SG $SWEEP; } > $D/sweep-servegen.txt
MOON40="--duration 40 --time-scale 0.15"                     # a larger Mooncake window: 119 requests in 5.8 s
{ echo "\$ $F $MOON40 --modes vanilla pulseinfer --budget 1024 2048 --threshold 2048 4096 --host-kv-gib 32 64 --need 3"
  $F $MOON40 --modes vanilla pulseinfer --budget 1024 2048 --threshold 2048 4096 --host-kv-gib 32 64 --need 3; } \
  > $D/mooncake-40s.txt
{ echo "\$ $F $MOON --modes vanilla pulseinfer --budget 1024 --threshold 8192 --normal-steps 3 4 6 8"
  $F $MOON --modes vanilla pulseinfer --budget 1024 --threshold 8192 --normal-steps 3 4 6 8; } > $D/tpot-mooncake.txt
