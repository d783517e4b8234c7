#!/usr/bin/env bash
# The serving forecasts of session 29 (2026-12-05, CPU, no GPU): repository root, `bash <this file> <folder>`.
# The replays below steer to the locality measured nearest the trace's median prompt (8K for both windows) unless a
# line passes --locality-context 4096 (what every H200 replay so far was steered to).
set -eu
D=${1:-benchmarks/results/forecast-2026-12-05-cpu}
R=benchmarks/results
F="python benchmarks/forecast_serving.py"
MOON="--duration 20 --time-scale 0.3"                          # session 27's Mooncake window
SG="--trace servegen-mix --start 600 --duration 60 --time-scale 0.05"   # its ServeGen window
MOON40="--duration 40 --time-scale 0.15"                     # a larger Mooncake window: 119 requests in 5.8 s
run() {  # file, then the forecast's options
  local out=$D/$1; shift
  { echo "\$ $F $*"; $F "$@"; } > "$out"
}
run fit-mooncake.txt $MOON --fit $R/serving-2026-12-03-h200/defaults-406dfe3/vanilla/vanilla.json \
  $R/serving-2026-12-04-h200/mooncake-eafcb09/pulseinfer/pulseinfer.json \
  $R/serving-2026-12-04-h200/mooncake-eafcb09/pulseinfer-noirq/pulseinfer-noirq.json
run fit-servegen.txt $SG --fit $R/serving-2026-12-04-h200/servegen-eafcb09/vanilla/vanilla.json \
  $R/serving-2026-12-04-h200/servegen-eafcb09/pulseinfer/pulseinfer.json
run mooncake-4k.txt $MOON --locality-context 4096 --need 3          # as session 27 ran it
run servegen-4k.txt $SG --locality-context 4096 --need 3
run mooncake.txt $MOON --need 3                                     # at the window's own locality
run servegen.txt $SG --need 3
SWEEP="--modes vanilla pulseinfer --budget 1024 2048 --threshold 2048 4096 8192 --host-kv-gib 32 64 --normal-steps 1 2 3 --need 3"
run sweep-mooncake-4k.txt $MOON $SWEEP --locality-context 4096
run sweep-mooncake.txt $MOON $SWEEP
run sweep-servegen.txt $SG $SWEEP
HOT="--modes vanilla pulseinfer --budget 1024 2048 --threshold 2048 4096 --host-kv-gib 64 --need 3"
for hc in 1 1.5 2; do
  run hot-$hc-mooncake.txt $MOON $HOT --hot-cache $hc
  run hot-$hc-mooncake-40s.txt $MOON40 $HOT --hot-cache $hc
done
run tpot-mooncake.txt $MOON --modes vanilla pulseinfer --budget 1024 --threshold 8192 --normal-steps 3 4 6 8
