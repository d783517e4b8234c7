#!/usr/bin/env bash
# Session 29 call C: the larger Mooncake window (40 s x0.15, 119 requests) at its own locality: pulseinfer at budget
# 1024 / threshold 2048 / 64 GiB host (forecast 2.80x), then vanilla.
set -u
W=/tmp/s29c; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/s29c.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1"
rep() {  # name mode limit_s extra-env...
  local name=$1 mode=$2 limit=$3; shift 3
  mkdir -p $W/$name
  env PARTS=replay MODES=$mode DURATION=40 TIME_SCALE=0.15 GPU_KV_GIB=6 "$@" \
    REPLAY_TIMEOUT_S=$((limit - 10)) R=$W/$name-r OUT=$W/$name timeout $limit bash benchmarks/run_serving_gpu.sh \
    > $W/$name.out 2>&1
  log "$name rc=$? $(grep -h -E 'completed|tok/s' $W/$name-r/progress.log 2>/dev/null | tail -2 | tr '\n' ' ')"
  grep -h -E "roofline|decode tok/s|GPU busy|TPOT p50/p99 <8K" $W/$name-r/table.txt 2>/dev/null | tee -a $W/call.log
}
rep m40-pi-b1024 pulseinfer 200 BUDGET=1024 THRESHOLD=2048 HOST_KV_GIB=64 REPLAY_ARGS="--max-offload 24"
rep m40-vanilla vanilla 330
log done
