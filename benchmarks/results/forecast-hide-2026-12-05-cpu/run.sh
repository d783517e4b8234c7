#!/usr/bin/env bash
# Session 34 (2026-12-05, CPU): the forecast with IRQ's hiding normal pieces timed at vanilla's efficiency (`h`,
# `--hide-efficiency`, default 1.21), refitted to the two H200 replays at budget 1024 (Mooncake 40 s, session 33;
# ServeGen 60 s, session 34), then IRQ and the halves what-if on both windows with the refitted `e` (1.47).
# Repository root: `bash <this file>`.
set -eu
D=${1:-benchmarks/results/forecast-hide-2026-12-05-cpu}
F="python benchmarks/forecast_serving.py"
R=benchmarks/results/serving-2026-12-05-h200
MOON40="--duration 40 --time-scale 0.15"
SG="--trace servegen-mix --start 600 --duration 60 --time-scale 0.05"
COMMON="--budget 1024 --threshold 2048 --host-kv-gib 64 --need 3"
run() {  # file, then the forecast's options
  local out=$D/$1; shift
  { echo "\$ $F $*"; $F "$@"; } > "$out"
}
run fit-mooncake-40s.txt $MOON40 --fit $R/s33c/m40-pi-tl-r/pulseinfer.json $R/s33c/m40-vanilla-r/vanilla.json
run fit-servegen.txt $SG --fit $R/s34b/sg-pi-r/pulseinfer.json $R/s34b/sg-vanilla-r/vanilla.json
for hc in 1 1.25; do
  { echo "\$ $F $MOON40 $COMMON --hot-cache $hc --modes vanilla pulseinfer 'pulseinfer --halves'"
    $F $MOON40 $COMMON --hot-cache $hc --modes vanilla pulseinfer "pulseinfer --halves"; } > $D/mooncake-40s-hot-$hc.txt
  { echo "\$ $F $SG $COMMON --hot-cache $hc --modes vanilla pulseinfer 'pulseinfer --halves'"
    $F $SG $COMMON --hot-cache $hc --modes vanilla pulseinfer "pulseinfer --halves"; } > $D/servegen-hot-$hc.txt
done
