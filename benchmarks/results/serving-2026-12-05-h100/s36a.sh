#!/usr/bin/env bash
# Session 36: halves against IRQ on one H200, same machine, same tree. WINDOW=mooncake (40 s x0.15, 119 requests)
# or WINDOW=servegen (servegen-mix from 600 s, 60 s x0.05, 36 requests); both at budget 1024, threshold 2048,
# 64 GiB host, --max-offload 24, 6 GiB GPU KV. H200 vanilla on these windows: 235.9 (s33c), 299.0 (s34b).
set -u
WINDOW=${WINDOW:-mooncake}
W=/tmp/s36a-$WINDOW; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/s36a-$WINDOW.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1 $WINDOW $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
if [ $WINDOW = servegen ]; then win="TRACE=servegen-mix START=600 DURATION=60 TIME_SCALE=0.05"
else win="DURATION=40 TIME_SCALE=0.15"; fi
rep() {  # name mode limit_s extra-env...
  local name=$1 mode=$2 limit=$3; shift 3
  [ $(( $(date +%s) - T0 + limit )) -gt ${CALL_S:-590} ] && { log "skip $name (time)"; return; }
  mkdir -p $W/$name
  env PARTS=replay MODES=$mode $win GPU_KV_GIB=6 BUDGET=1024 THRESHOLD=2048 HOST_KV_GIB=64 "$@" \
    REPLAY_TIMEOUT_S=$((limit - 10)) R=$W/$name-r OUT=$W/$name timeout $limit bash benchmarks/run_serving_gpu.sh \
    > $W/$name.out 2>&1
  log "$name rc=$? $(grep -h -E 'completed|tok/s' $W/$name-r/progress.log 2>/dev/null | tail -2 | tr '\n' ' ')"
  grep -h -E "roofline|decode tok/s|GPU busy|TPOT p50/p99 <8K|rounds as halves|step graphs|warm-up|host ms|publish->landed GB/s" \
    $W/$name-r/table.txt $W/$name-r/*.log 2>/dev/null | sort -u | tee -a $W/call.log
}
rep halves pulseinfer ${HALVES_S:-260} REPLAY_ARGS="--max-offload 24 --halves"
rep irq pulseinfer ${IRQ_S:-230} REPLAY_ARGS="--max-offload 24"
log done
