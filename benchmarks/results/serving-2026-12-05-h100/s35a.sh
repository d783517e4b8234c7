#!/usr/bin/env bash
# Session 35, call 1: issue 29's halves on a GPU for the first time. Their GPU cases (tokens against each class
# alone with captured and late recalls, overlapped or not; steady rounds with no host sync), each in a child process
# with a hard timeout and a thread dump; then, if they hold, the 40 s Mooncake window (budget 1024, threshold 2048,
# 64 GiB host, --max-offload 24) with --halves, and vanilla on the same tree if time is left.
set -u
W=/tmp/s35a; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/s35a.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1 $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
case_() {  # name limit_s args...
  local name=$1 limit=$2; shift 2
  CASE_DUMP_AFTER_S=$((limit - 10)) timeout $limit python tests/pulseio_engine/serving_gpu_case.py "$@" \
    > $W/case-$name.out 2> $W/case-$name.err
  local rc=$?; log "case $name rc=$rc $(tail -c 600 $W/case-$name.out)"; return $rc
}
case_ halves 200 halves; ok=$?
case_ nosync-halves 90 nosync 16 halves
case_ nosync-halves-overlap 90 nosync 16 overlap halves
rep() {  # name mode limit_s extra-env...
  local name=$1 mode=$2 limit=$3; shift 3
  [ $(( $(date +%s) - T0 + limit )) -gt ${CALL_S:-590} ] && { log "skip $name (time)"; return; }
  mkdir -p $W/$name
  env PARTS=replay MODES=$mode DURATION=40 TIME_SCALE=0.15 GPU_KV_GIB=6 BUDGET=1024 THRESHOLD=2048 HOST_KV_GIB=64 "$@" \
    REPLAY_TIMEOUT_S=$((limit - 10)) R=$W/$name-r OUT=$W/$name timeout $limit bash benchmarks/run_serving_gpu.sh \
    > $W/$name.out 2>&1
  log "$name rc=$? $(grep -h -E 'completed|tok/s' $W/$name-r/progress.log 2>/dev/null | tail -2 | tr '\n' ' ')"
  grep -h -E "roofline|decode tok/s|GPU busy|TPOT p50/p99 <8K|rounds as halves|publish->landed GB/s" \
    $W/$name-r/table.txt 2>/dev/null | tee -a $W/call.log
}
[ $ok -eq 0 ] && rep m40-halves pulseinfer 250 REPLAY_ARGS="--max-offload 24 --halves"
rep m40-vanilla vanilla 240
log done
