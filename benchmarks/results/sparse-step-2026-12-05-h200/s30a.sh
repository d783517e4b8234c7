#!/usr/bin/env bash
# Session 30 call A: GPU tests of the LRU hot set (fused selection, offload engine tokens), then issue 28's offload
# rows at the 32K locality with hot sets of 2 (and 1.5) budgets, each against its bound and vanilla.
set -u
W=/tmp/s30a; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/s30a.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1 $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider -rfE tests/pulseio_engine/test_fused_selection.py \
  tests/pulseio_engine/test_offload_gpu.py tests/pulseio_engine/test_engine_gpu.py > $W/tests.log 2>&1
log "gpu tests rc=$? $(tail -1 $W/tests.log)"
row() {  # name limit_s config specs bench-args
  local name=$1 limit=$2
  [ $(( $(date +%s) - T0 + limit )) -gt 585 ] && { log "skip $name (time)"; return; }
  R=$W/$name PARTS=bench CONFIGS=$3 SPECS="$4" BENCH_ARGS="$5" OUT=/tmp/discard timeout $limit \
    bash benchmarks/run_sparse_gpu.sh > $W/$name.out 2>&1
  log "$name rc=$? $(grep -h 'rc=' $W/$name/progress.log | tr '\n' ' ' | cut -c1-400)"
}
row off16-h2 150 16x32768 "offload-doorbell:solohead+bound+vanilla" "--hot-cache 2"
row off8-h2 110 8x32768 "offload-doorbell:solohead+bound" "--hot-cache 2"
row off16-h15 80 16x32768 "offload-doorbell:solohead" "--hot-cache 1.5"
log done
