#!/usr/bin/env bash
# Session 35 (2026-12-05, CPU): the halves rounds' own efficiency `e_h`, fitted to the H100's Mooncake 40 s replay
# with --halves (`serving-2026-12-05-h100/s35b/`), the other rounds at IRQ's `e` fitted to the IRQ replay beside it
# (rates: that run's copy, 0.8 of its link); then the H200's two windows at budget 1024 with that `e_h` and the H200's
# fitted `e` (1.47), halves in every round the engine runs them (a normal batch and two offload requests or more).
# Repository root: `bash <this file>`.
set -eu
D=${1:-benchmarks/results/forecast-halves-h100-2026-12-05-cpu}
F="python benchmarks/forecast_serving.py"
R=benchmarks/results/serving-2026-12-05-h100/s35b
MOON40="--duration 40 --time-scale 0.15"
SG="--trace servegen-mix --start 600 --duration 60 --time-scale 0.05"
COMMON="--budget 1024 --threshold 2048 --host-kv-gib 64 --need 3"
run() {  # file, then the forecast's options
  local out=$D/$1; shift
  { echo "\$ $F $*"; $F "$@"; } > "$out"
}
run fit-h100-irq.txt $MOON40 --copy-gbps 3014.5 --link-gbps 44.24 --fit $R/m40-irq-r/pulseinfer.json
E=$(sed -n 's/.*-> efficiency \([0-9.]*\)$/\1/p' $D/fit-h100-irq.txt)
run fit-h100-halves.txt $MOON40 --copy-gbps 3014.5 --link-gbps 44.24 --efficiency pulseinfer=$E \
  --fit $R/m40-halves-r/pulseinfer.json
{ echo "\$ $F $MOON40 $COMMON --modes vanilla pulseinfer 'pulseinfer --halves'"
  $F $MOON40 $COMMON --modes vanilla pulseinfer "pulseinfer --halves"; } > $D/h200-mooncake-40s.txt
{ echo "\$ $F $SG $COMMON --modes vanilla pulseinfer 'pulseinfer --halves'"
  $F $SG $COMMON --modes vanilla pulseinfer "pulseinfer --halves"; } > $D/h200-servegen.txt
