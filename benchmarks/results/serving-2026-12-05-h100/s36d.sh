#!/usr/bin/env bash
# Session 36, call 3 (what the device time left allows): the ride case on the GPU, tokens against each class alone,
# captured and late recalls, overlapped or not.
set -u
W=/tmp/s36d; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/s36d.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1 $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
CASE_DUMP_AFTER_S=110 timeout 120 python tests/pulseio_engine/serving_gpu_case.py ride > $W/case-ride.out \
  2> $W/case-ride.err
log "case ride rc=$? $(python -c "import json; d=json.load(open('$W/case-ride.out')); print(d['ok'], d['differ'], {k: (v['ridden_rounds'], v['rounds'], v['runtime']) for k, v in d.items() if isinstance(v, dict)})" 2>&1 | tail -c 900)"
log done
