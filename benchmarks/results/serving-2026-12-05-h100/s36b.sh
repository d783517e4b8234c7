#!/usr/bin/env bash
# Session 36, call 2. On an H200: halves against IRQ on the 40 s Mooncake window (issue 29's question). On any other
# card: IRQ then halves on that window with their timelines, read on the device by `replay-gaps --kernels 30` (what a
# round's GPU time is spent on). Budget 1024, threshold 2048, 64 GiB host, --max-offload 24, 6 GiB GPU KV.
set -u
W=/tmp/s36b; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
finish() {
  for d in $W/*-r/timelines-*; do [ -d $d ] || continue   # one window kept (gzipped), the rest read above
    keep=$(ls $d | sort -t- -k2 -n | sed -n 5p); [ -n "$keep" ] && gzip -c $d/$keep > $d.$keep.gz; rm -rf $d; done
  rm -f $W/*/serving.tgz; tar czf $OUT/s36b.tgz -C $W .
}
trap finish EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
log "start $1 $GPU $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
rep() {  # name mode limit_s extra-env...
  local name=$1 mode=$2 limit=$3; shift 3
  [ $(( $(date +%s) - T0 + limit )) -gt ${CALL_S:-590} ] && { log "skip $name (time)"; return; }
  mkdir -p $W/$name
  env PARTS=replay MODES=$mode DURATION=40 TIME_SCALE=0.15 GPU_KV_GIB=6 BUDGET=1024 THRESHOLD=2048 HOST_KV_GIB=64 "$@" \
    REPLAY_TIMEOUT_S=$((limit - 15)) R=$W/$name-r OUT=$W/$name timeout $limit bash benchmarks/run_serving_gpu.sh \
    > $W/$name.out 2>&1
  log "$name rc=$? $(grep -h -E 'completed|tok/s' $W/$name-r/progress.log 2>/dev/null | tail -2 | tr '\n' ' ')"
  [ -d $W/$name-r/timelines-$mode ] && timeout 60 python -m pulseio_engine.cli replay-gaps $W/$name-r/timelines-$mode \
    --kernels 30 > $W/$name-r/gaps-kernels.txt 2>&1
  grep -h -E "roofline|decode tok/s|GPU busy|TPOT p50/p99 <8K|rounds as halves|step graphs|warm-up|host ms|publish->landed GB/s" \
    $W/$name-r/table.txt $W/$name-r/*.log 2>/dev/null | sort -u | tee -a $W/call.log
}
if [[ $GPU == *H200* ]]; then
  rep halves pulseinfer 300 REPLAY_ARGS="--max-offload 24 --halves"
  rep irq pulseinfer 240 REPLAY_ARGS="--max-offload 24"
else
  rep irq-tl pulseinfer 290 TIMELINES=1 REPLAY_ARGS="--max-offload 24"
  rep halves-tl pulseinfer 285 TIMELINES=1 REPLAY_ARGS="--max-offload 24 --halves"
fi
log done
