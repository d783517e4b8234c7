#!/usr/bin/env bash
# Next session, call 4 (after next32a-c, if device time is left): the forecast's pick for the 40 s Mooncake
# window, hot sets of 1.5 budgets (session 30's forecast: 2.83x vanilla against 2.80 with one, short TPOT p99 22.9 ms
# against 31.3), alone and with the host further ahead (--gpu-ahead 32). Compare with next32c's vanilla (same tree).
set -u
W=/tmp/next32d; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/next32d.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1"
rep() {  # name mode limit_s extra-env...
  local name=$1 mode=$2 limit=$3; shift 3
  [ $(( $(date +%s) - T0 + limit )) -gt 590 ] && { log "skip $name (time)"; return; }
  mkdir -p $W/$name
  env PARTS=replay MODES=$mode DURATION=40 TIME_SCALE=0.15 GPU_KV_GIB=6 BUDGET=1024 THRESHOLD=2048 HOST_KV_GIB=64 "$@" \
    REPLAY_TIMEOUT_S=$((limit - 10)) R=$W/$name-r OUT=$W/$name timeout $limit bash benchmarks/run_serving_gpu.sh \
    > $W/$name.out 2>&1
  log "$name rc=$? $(grep -h -E 'completed|tok/s' $W/$name-r/progress.log 2>/dev/null | tail -2 | tr '\n' ' ')"
  grep -h -E "roofline|decode tok/s|GPU busy|TPOT p50/p99 <8K" $W/$name-r/table.txt 2>/dev/null | tee -a $W/call.log
  python -c "import json,glob; d=json.load(open(glob.glob('$W/$name-r/*.json')[0])); print('  host ms/round', {k: round(v, 2) for k, v in d['host_ms_per_round'].items()})" 2>&1 | tee -a $W/call.log
}
rep m40-pi-h15 pulseinfer 200 REPLAY_ARGS="--max-offload 24 --hot-cache 1.5"
rep m40-pi-h125 pulseinfer 200 REPLAY_ARGS="--max-offload 24 --hot-cache 1.25"
log done
