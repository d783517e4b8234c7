#!/usr/bin/env bash
# Next session, call 1 (session 30's lost call C, plus a main-thread probe): the serving GPU tests after the hot-set
# change, issue 28's all-on-GPU rows on the current select kernel, and the 8 x 32K offload row (hot set 2) with
# Python's GIL switch interval at 50 us against the default 5 ms: does the main thread lose its time to the poller?
set -u
W=/tmp/next31; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/next31.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1 $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
timeout 300 python -m pytest -q -m gpu -p no:cacheprovider -rfE tests/pulseio_engine/test_fused_selection.py tests/pulseio_engine/test_serving_gpu.py -k "tokens or never_sync or fused or gpu_kernels or steered or graph" > $W/test-serving.log 2>&1
log "serving gpu tests rc=$? $(tail -1 $W/test-serving.log)"
row() {  # name limit_s config specs bench-args
  local name=$1 limit=$2
  [ $(( $(date +%s) - T0 + limit )) -gt 585 ] && { log "skip $name (time)"; return; }
  R=$W/$name PARTS=bench CONFIGS=$3 SPECS="$4" BENCH_ARGS="$5" OUT=/tmp/discard timeout $limit \
    bash benchmarks/run_sparse_gpu.sh > $W/$name.out 2>&1
  log "$name rc=$? $(grep -h 'rc=' $W/$name/progress.log | tr '\n' ' ' | cut -c1-300)"
  python -c "import json,glob
for f in glob.glob('$W/$name/*.json'):
    d = json.load(open(f)); g = lambda k: d.get(k)
    print('  ', f.split('/')[-1], 'step', round(g('step_ms'), 2), 'bound', g('recall_bound_ms'), 'ratio', g('recall_bound_ratio'),
          'host', round(g('host_ms_per_step'), 3), 'recall_host', round(g('recall_host_ms_per_step'), 3),
          'MiB', round(g('recalled_mib_per_step'), 1), 'vanilla_ratio', g('vanilla_ratio'))" 2>&1 | tee -a $W/call.log
}
row quest8 110 8x32768 "all-on-gpu:quest+vanilla" ""
row solo32 80 32x8192 "all-on-gpu:solohead" ""
gil() {  # name limit_s switch_interval_s
  [ $(( $(date +%s) - T0 + $2 )) -gt 585 ] && { log "skip $1 (time)"; return; }
  timeout $2 python -c "import sys; sys.setswitchinterval($3); from pulseio_engine.cli import main; sys.exit(main())" \
    bench --model qwen3-14b --mode offload-doorbell --selection solohead --batch-size 8 --context-len 32768 \
    --token-budget 2048 --steps 20 --warmup 3 --hot-cache 2 --json $W/$1.json > $W/$1.log 2>&1
  log "$1 rc=$? $(tail -1 $W/$1.log | cut -c1-400)"
}
gil off8-gil5ms 70 0.005
gil off8-gil50us 70 0.00005
log done
