#!/usr/bin/env bash
# Session 34, call 2: issue 29's ServeGen window (servegen-mix from 600 s, 60 s x0.05: 36 requests) at the Mooncake
# window's configuration (budget 1024, threshold 2048, 64 GiB host, --max-offload 24) against vanilla on the same
# tree; session 27 measured it only at budget 2048 (619.2 against 298.7, 2.07x). Then hot sets of 1.25 budgets if
# time is left. The reports give the whole run's recall rate (schema 10).
set -u
W=/tmp/next34b; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/next34b.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1 $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
rep() {  # name mode limit_s extra-env...
  local name=$1 mode=$2 limit=$3; shift 3
  [ $(( $(date +%s) - T0 + limit )) -gt ${CALL_S:-590} ] && { log "skip $name (time)"; return; }
  mkdir -p $W/$name
  env PARTS=replay MODES=$mode TRACE=servegen-mix START=600 DURATION=60 TIME_SCALE=0.05 GPU_KV_GIB=6 BUDGET=1024 \
    THRESHOLD=2048 HOST_KV_GIB=64 "$@" REPLAY_TIMEOUT_S=$((limit - 10)) R=$W/$name-r OUT=$W/$name \
    timeout $limit bash benchmarks/run_serving_gpu.sh > $W/$name.out 2>&1
  log "$name rc=$? $(grep -h -E 'completed|tok/s' $W/$name-r/progress.log 2>/dev/null | tail -2 | tr '\n' ' ')"
  grep -h -E "decode tok/s|GPU busy|TPOT p50/p99 <8K|publish->landed GB/s" $W/$name-r/table.txt 2>/dev/null | tee -a $W/call.log
}
rep sg-pi pulseinfer 170 REPLAY_ARGS="--max-offload 24"
rep sg-vanilla vanilla 220
rep sg-h125 pulseinfer 170 REPLAY_ARGS="--max-offload 24 --hot-cache 1.25"
log done
