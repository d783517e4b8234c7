#!/usr/bin/env bash
# Session 36 (2026-12-05, CPU): how much of a decode step's recall a selection made one layer early (and two) would
# have fetched in time, on the real models the presets' locality was measured on (SoloHead with the heads of
# `../locality-2026-11-30-cpu/`, Quest per KV head for comparison); then the serving forecast of one forward a round
# (`--ride`, built) and of that forward with the recall prefetched a layer early (`--ahead`; built in session 37 as
# `--ride --ahead`, the forecast's mode renamed then: the files here keep the name they were written with), at
# the H200's rates and at the H100's. Repository root: `bash <this file>` (about 40 minutes on 2 cores).
set -euo pipefail
D=${1:-benchmarks/results/speculative-2026-12-05-cpu}
H=benchmarks/results/locality-2026-11-30-cpu/heads_qwen2.5-coder-0.5b.json
HS=benchmarks/results/accuracy-2026-11-30-cpu/heads_smollm2.json
S="python benchmarks/speculative_selection.py --steps 16 --samples 2"
spec() {  # name, then its options
  local name=$1; shift
  [ -s $D/$name.json ] || $S "$@" --json $D/$name.json > $D/$name.log 2>&1
}
spec qwen-8k-b1024 --heads $H --context-len 8192 --token-budget 1024 --ahead 1 2
spec qwen-16k-b1024 --heads $H --context-len 16384 --token-budget 1024 --ahead 1 2
spec qwen-8k-b2048 --heads $H --context-len 8192 --token-budget 2048 --ahead 1
spec smollm2-4k-b1024 --model smollm2 --heads $HS --context-len 4096 --token-budget 1024 --ahead 1
spec qwen-8k-b1024-quest --context-len 8192 --token-budget 1024 --ahead 1
spec qwen-32k-b1024 --heads $H --context-len 32000 --token-budget 1024 --ahead 1 --steps 8 --samples 1
spec qwen-8k-b1024-previous-layer --heads $H --context-len 8192 --token-budget 1024 --ahead 1 --previous-layer
F="python benchmarks/forecast_serving.py"
MOON40="--duration 40 --time-scale 0.15"
SG="--trace servegen-mix --start 600 --duration 60 --time-scale 0.05"
COMMON="--budget 1024 --threshold 2048 --host-kv-gib 64 --need 3"
H100="--copy-gbps 3014.5 --link-gbps 44.24 --efficiency pulseinfer=1.478"
MODES=(vanilla pulseinfer "pulseinfer --halves" "pulseinfer --ride" "pulseinfer --ride --ahead")
fc() {  # file, then the forecast's options
  local out=$D/$1; shift
  { echo "\$ $F $*"; $F "$@"; } > "$out"
}
fc h200-mooncake-40s.txt $MOON40 $COMMON --modes "${MODES[@]}"
fc h200-servegen.txt $SG $COMMON --modes "${MODES[@]}"
fc h100-mooncake-40s.txt $MOON40 $COMMON $H100 --modes "${MODES[@]}"
HOT=(pulseinfer "pulseinfer --ride" "pulseinfer --ride --ahead")
for h in 1.5 2; do
  fc h200-mooncake-40s-hot$h.txt $MOON40 $COMMON --hot-cache $h --modes vanilla "${HOT[@]}"
  fc h200-servegen-hot$h.txt $SG $COMMON --hot-cache $h --modes vanilla "${HOT[@]}"
done
