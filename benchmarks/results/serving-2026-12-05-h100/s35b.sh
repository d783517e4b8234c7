#!/usr/bin/env bash
# Session 35, call 2: halves with padded riders (one pair per (first, second, rider rows), warmed before the clock).
# The GPU halves case again (the padding rows are new there), then the 40 s Mooncake window (budget 1024, threshold
# 2048, 64 GiB host, --max-offload 24) with --halves, then IRQ (the default) on the same machine.
set -u
W=/tmp/s35b; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/s35b.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1 $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
CASE_DUMP_AFTER_S=110 timeout 120 python tests/pulseio_engine/serving_gpu_case.py halves > $W/case-halves.out \
  2> $W/case-halves.err
ok=$?; log "case halves rc=$ok $(tail -c 300 $W/case-halves.out)"
rep() {  # name mode limit_s extra-env...
  local name=$1 mode=$2 limit=$3; shift 3
  [ $(( $(date +%s) - T0 + limit )) -gt ${CALL_S:-590} ] && { log "skip $name (time)"; return; }
  mkdir -p $W/$name
  env PARTS=replay MODES=$mode DURATION=40 TIME_SCALE=0.15 GPU_KV_GIB=6 BUDGET=1024 THRESHOLD=2048 HOST_KV_GIB=64 "$@" \
    REPLAY_TIMEOUT_S=$((limit - 10)) R=$W/$name-r OUT=$W/$name timeout $limit bash benchmarks/run_serving_gpu.sh \
    > $W/$name.out 2>&1
  log "$name rc=$? $(grep -h -E 'completed|tok/s' $W/$name-r/progress.log 2>/dev/null | tail -2 | tr '\n' ' ')"
  grep -h -E "roofline|decode tok/s|GPU busy|TPOT p50/p99 <8K|rounds as halves|step graphs|warm-up|host ms|publish->landed GB/s" \
    $W/$name-r/table.txt 2>/dev/null | tee -a $W/call.log
}
[ $ok -eq 0 ] && rep m40-halves pulseinfer 250 REPLAY_ARGS="--max-offload 24 --halves"
rep m40-irq pulseinfer 200 REPLAY_ARGS="--max-offload 24"
log done
