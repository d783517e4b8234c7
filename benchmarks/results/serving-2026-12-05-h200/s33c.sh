#!/usr/bin/env bash
# Next session, call 3: where pulseinfer's GPU stands idle on the 40 s Mooncake window (s29c: 644.4 tok/s, 2.77x,
# busy 70.9%, host 12 ms of work a round against a 28.4 ms round), on session 31's tree (block tables packed once,
# the captured publish beside the resident attention, the merged last attention part): the default run with its
# timelines read by replay-gaps, then the host further ahead (--gpu-ahead 32: the round boundary's host work, ~4 ms,
# against 8 pieces queued, ~2 ms), then vanilla on the same tree (s29c: 158 s, 227 s a run).
set -u
W=/tmp/next32c; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/next32c.tgz -C $W .' EXIT
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
rep m40-pi-tl pulseinfer 200 TIMELINES=1 REPLAY_ARGS="--max-offload 24"
rep m40-pi-a32 pulseinfer 180 REPLAY_ARGS="--max-offload 24 --gpu-ahead 32"
rep m40-vanilla vanilla 240     # the same tree: the busy meter's starts are off the clock since 3fc14ac
log done
