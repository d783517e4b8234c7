#!/usr/bin/env bash
# Next session, call 1: the GPU tests of everything session 31 changed on the GPU path, none run there yet:
# the publish's device half first (d3d9f0d), the merged last attention part (d3d9f0d), the eviction search's start
# (9ce1427), the captured publish as a branch beside the resident attention (ee4a989).
set -u
W=/tmp/next32a; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/next32a.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1 $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
t() {  # name limit files... [-k expr]
  local name=$1 limit=$2; shift 2
  timeout $limit python -m pytest -q -m gpu -p no:cacheprovider -rfE "$@" > $W/$name.log 2>&1
  log "$name rc=$? $(tail -1 $W/$name.log)"
}
t pulseio 170 tests/pulseio/test_recall_graph_gpu.py tests/pulseio/test_runtime_gpu.py \
  tests/pulseio/test_device_wait_patterns_gpu.py -k "not test_device_wait_pattern or cold-4 or interleaved"
t engine 200 tests/pulseio_engine/test_attention_gpu.py tests/pulseio_engine/test_fused_selection.py \
  tests/pulseio_engine/test_offload_gpu.py tests/pulseio_engine/test_engine_gpu.py
t serving 200 tests/pulseio_engine/test_serving_gpu.py -k "tokens or never_sync or graph"
log done
