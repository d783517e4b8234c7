#!/usr/bin/env bash
# Session 33's what-if (2026-12-05, CPU): IRQ with the offload batch in two halves (`pulseinfer --halves`, a design
# not built), beside today's IRQ and vanilla, on both of issue 29's windows at the configuration the H200 ran last
# (budget 1024, threshold 2048, 64 GiB host), hot sets of 1 and 1.25 budgets. Repository root: `bash <this file>`.
set -eu
D=${1:-benchmarks/results/forecast-halves-2026-12-05-cpu}
F="python benchmarks/forecast_serving.py"
MOON40="--duration 40 --time-scale 0.15"
SG="--trace servegen-mix --start 600 --duration 60 --time-scale 0.05"
COMMON="--budget 1024 --threshold 2048 --host-kv-gib 64 --need 3"
run() {  # file, then the forecast's options (the modes added here: one of them has a space in its name)
  local out=$D/$1; shift
  { echo "\$ $F $* --modes vanilla pulseinfer 'pulseinfer --halves'"
    $F "$@" --modes vanilla pulseinfer "pulseinfer --halves"; } > "$out"
}
for hc in 1 1.25; do
  run mooncake-40s-hot-$hc.txt $MOON40 $COMMON --hot-cache $hc
  run servegen-hot-$hc.txt $SG $COMMON --hot-cache $hc
done
# against the coupled batches (issue 29's 1.5x --no-irq), on the Mooncake window at one budget
out=$D/no-irq-mooncake-40s.txt
{ echo "\$ $F $MOON40 --budget 1024 --threshold 2048 --host-kv-gib 64 --modes pulseinfer 'pulseinfer --no-irq' 'pulseinfer --halves'"
  $F $MOON40 --budget 1024 --threshold 2048 --host-kv-gib 64 --modes pulseinfer "pulseinfer --no-irq" "pulseinfer --halves"; } > "$out"
