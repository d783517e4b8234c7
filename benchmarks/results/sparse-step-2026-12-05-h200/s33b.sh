#!/usr/bin/env bash
# Next session, call 2 (after next32a's tests pass): the 8 and 16 x 32K offload rows (hot set 2) against their bounds
# on session 31's offload layer; the main thread's arming probed (wall against CPU time per arm, then its cProfile);
# Quest 8 x 32K again.
set -u
W=/tmp/next32b; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/next32b.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $1 $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
B="--model qwen3-14b --selection solohead --context-len 32768 --token-budget 2048 --steps 20 --warmup 3"
show() { python -c "import json; d=json.load(open('$W/$1.json')); print('  step', round(d['step_ms'],2), 'aog', d.get('all_on_gpu_step_ms'), 'bound', d.get('recall_bound_ms'), 'ratio', d.get('recall_bound_ratio'), 'vanilla', d.get('vanilla_ratio'), 'p2l', d.get('publish_to_landed_us'), 'host', round(d['host_ms_per_step'],3), 'arm', d.get('recall_host_ms_per_step'))" 2>&1 | tee -a $W/call.log; }
bench() {  # name limit args
  [ $(( $(date +%s) - T0 + $2 )) -gt 580 ] && { log "skip $1 (time)"; return; }
  timeout $2 python -m pulseio_engine.cli bench $B $3 --json $W/$1.json > $W/$1.log 2>&1
  log "$1 rc=$? $(tail -1 $W/$1.log | cut -c1-500)"; show $1
}
probe() {  # name limit profile args
  [ $(( $(date +%s) - T0 + $2 )) -gt 580 ] && { log "skip $1 (time)"; return; }
  PROBE_PROFILE=$3 timeout $2 python .devrun/arm_probe.py $W/$1.probe.json $B $4 --json $W/$1.json > $W/$1.log 2>&1
  log "$1 rc=$? $(grep 'arm probe' $W/$1.log | cut -c1-300)"; show $1
}
bench off8-h2 100 "--mode offload-doorbell --batch-size 8 --hot-cache 2 --compare-all-on-gpu"
probe off8-h2-probe 70 0 "--mode offload-doorbell --batch-size 8 --hot-cache 2"
probe off8-h2-cprofile 70 1 "--mode offload-doorbell --batch-size 8 --hot-cache 2"
bench off16-h2 130 "--mode offload-doorbell --batch-size 16 --hot-cache 2 --compare-all-on-gpu --compare-vanilla"
bench quest8 60 "--mode all-on-gpu --selection quest --batch-size 8 --compare-vanilla"
log done
