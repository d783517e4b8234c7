#!/usr/bin/env bash
# Session 30 call B: the 8 x 32K offload row at the 32K locality with hot sets of 1 and 2 budgets, and the copier's CTAs
# at 24 and 32 against its bound (the default 16 landed the recall at 0.74 of the link with the smaller requests).
set -u
W=/tmp/s30b; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/s30b.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1 $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
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
row off8-h1 90 8x32768 "offload-doorbell:solohead+bound" ""
row off8-h2 90 8x32768 "offload-doorbell:solohead+bound" "--hot-cache 2"
row off8-h2-c24 90 8x32768 "offload-doorbell:solohead+bound" "--hot-cache 2 --copier-ctas 24"
row off8-h2-c32 90 8x32768 "offload-doorbell:solohead+bound" "--hot-cache 2 --copier-ctas 32"
row off16-h2-c24 130 16x32768 "offload-doorbell:solohead+bound+vanilla" "--hot-cache 2 --copier-ctas 24"
log done
