#!/usr/bin/env bash
# Session 29 call A: serving GPU tests (IRQ tokens incl. two streams, no-sync), then budget 1024 on the Mooncake
# window at its own (8K) locality, with and without two streams.
set -u
W=/tmp/s29a; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/s29a.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1 $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
timeout 230 python -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/pulseio_engine/test_serving_gpu.py \
  -k "tokens or never_sync" > $W/test-serving.log 2>&1
log "serving gpu tests rc=$? $(tail -1 $W/test-serving.log)"
rep() {  # name limit_s extra-env...
  local name=$1 limit=$2; shift 2
  [ $(( $(date +%s) - T0 + limit )) -gt 585 ] && { log "skip $name (time)"; return; }
  mkdir -p $W/$name
  env PARTS=replay MODES=pulseinfer DURATION=20 TIME_SCALE=0.3 GPU_KV_GIB=6 "$@" \
    REPLAY_TIMEOUT_S=$((limit - 10)) R=$W/$name-r OUT=$W/$name timeout $limit bash benchmarks/run_serving_gpu.sh \
    > $W/$name.out 2>&1
  log "$name rc=$? $(grep -h -E 'completed|tok/s' $W/$name-r/progress.log 2>/dev/null | tail -2 | tr '\n' ' ')"
  grep -h -E "roofline|decode tok/s|GPU busy|TPOT p50/p99 <8K|steer" $W/$name-r/table.txt 2>/dev/null | tee -a $W/call.log
}
rep pi-b1024 190 BUDGET=1024 THRESHOLD=4096 HOST_KV_GIB=32 REPLAY_ARGS="--max-offload 24"
rep pi-b1024-2s 170 BUDGET=1024 THRESHOLD=4096 HOST_KV_GIB=32 REPLAY_ARGS="--max-offload 24 --two-streams"
log done
