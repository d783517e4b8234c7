#!/usr/bin/env bash
# Session 29 call B: issue 28's all-on-GPU rows again, and the 16 x 32K offload row at the 32K locality (+vanilla).
set -u
W=/tmp/s29b; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/s29b.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1"
row() {  # name config specs limit
  [ $(( $(date +%s) - T0 + $4 )) -gt 440 ] && { log "skip $1 (time)"; return; }
  R=$W/$1 PARTS=bench CONFIGS=$2 SPECS="$3" OUT=/tmp/discard timeout $4 bash benchmarks/run_sparse_gpu.sh \
    > $W/$1.out 2>&1
  log "$1 rc=$? $(grep -h -E 'step_ms|vanilla|tok' $W/$1/*.log 2>/dev/null | tail -4 | tr '\n' ' ' | cut -c1-400)"
}
row off16 16x32768 "offload-doorbell:solohead+vanilla" 180
row quest8 8x32768 "all-on-gpu:quest+vanilla" 130
row solo32 32x8192 "all-on-gpu:solohead" 100
log done
