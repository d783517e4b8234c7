#!/usr/bin/env bash
# Session 34, call 1. Trees staged by the host under .devrun/ (pulseio and pulseio_engine of each):
#   base: 9ef19ed^ (copy spans of whole blocks); new: this tree (spans cut in 16 KiB parts, 9ef19ed);
#   u8: new with 8 loads in flight a thread; hm: the paged cache head-major underneath (0673d79, in history as 4e91585, reverted).
# 1. pulseio's GPU tests of the parts (runtime, recall graph, device-wait patterns cold and interleaved, transfers);
# 2. `pulseio bench` 64 KiB blocks, resident and zero-copy, 16 / 81 / 256 blocks, base / new / u8;
# 3. issue 28's 8 x 32K offload row (hot set 2) base / new alternating;
# 4. Quest all-on-GPU 8 x 32K against vanilla, new / hm alternating, and SoloHead all-on-GPU 32 x 8K on hm;
# 5. the engine's GPU tests on hm; 6. bench_attention's per-head and head-major shapes.
set -u
W=/tmp/next34a; rm -rf $W; mkdir -p $W
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/call.log; }
trap 'tar czf $OUT/next34a.tgz -C $W .' EXIT
export PULSEIO_GIT_SHA=$1 PYTHONUNBUFFERED=1
ROOT=$PWD
log "start $1 $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
tree() { case $1 in new) echo $ROOT ;; *) echo $ROOT/.devrun/$1 ;; esac; }
t() {  # tree name limit files... [-k expr]
  local tr=$1 name=$2 limit=$3; shift 3
  [ $(( $(date +%s) - T0 + limit )) -gt 590 ] && { log "skip $name (time)"; return; }
  ( cd $(tree $tr) && PYTHONPATH=$PWD timeout $limit python -m pytest -q -m gpu -p no:cacheprovider -rfE \
      --rootdir $ROOT -c $ROOT/pyproject.toml "$@" > $W/$name.log 2>&1 )
  log "$name rc=$? $(tail -1 $W/$name.log)"
}
pb() {  # tree name
  ( cd $(tree $1) && PYTHONPATH=$PWD timeout 60 python -m pulseio.cli bench \
      --block-sizes 65536 --counts 16,81,256 --strategies resident,zero_copy --directions h2d --zero-copy-ctas 16 \
      --no-save --no-progress --json $W/$2.json > $W/$2.log 2>&1 )
  log "$2 rc=$? $(grep -E 'resident|zero_copy' $W/$2.log | tr -s ' ' | head -8 | tr '\n' '|')"
}
B="--model qwen3-14b --context-len 32768 --token-budget 2048 --steps 20 --warmup 3"
show() { python -c "import json; d=json.load(open('$W/$1.json')); print('  step', round(d['step_ms'],2), 'aog', d.get('all_on_gpu_step_ms'), 'bound', d.get('recall_bound_ms'), 'ratio', d.get('recall_bound_ratio'), 'vanilla', d.get('vanilla_ratio'), 'roofline', d.get('roofline_ratio'), 'p2l', d.get('publish_to_landed_us'), 'host', round(d['host_ms_per_step'],3))" 2>&1 | tee -a $W/call.log; }
bench() {  # tree name limit args
  [ $(( $(date +%s) - T0 + $3 )) -gt 590 ] && { log "skip $2 (time)"; return; }
  ( cd $(tree $1) && PYTHONPATH=$PWD timeout $3 python -m pulseio_engine.cli \
      bench $B $4 --json $W/$2.json > $W/$2.log 2>&1 )
  log "$2 rc=$? $(tail -1 $W/$2.log | cut -c1-300)"; show $2
}
t new pulseio 150 tests/pulseio/test_runtime_gpu.py tests/pulseio/test_recall_graph_gpu.py \
  tests/pulseio/test_device_wait_patterns_gpu.py tests/pulseio/test_transfer_benchmarks.py \
  -k "not test_device_wait_pattern or cold-4 or interleaved"
pb base pb-base; pb new pb-new; pb u8 pb-u8
O="--mode offload-doorbell --selection solohead --batch-size 8 --hot-cache 2"
bench base off8-base 90 "$O --compare-all-on-gpu"
bench new off8-new 90 "$O --compare-all-on-gpu"
Q="--mode all-on-gpu --selection quest --batch-size 8 --compare-vanilla"
bench new quest8-new 70 "$Q"
bench hm quest8-hm 70 "$Q"
bench base off8-base2 60 "$O"
bench new off8-new2 60 "$O"
bench new quest8-new2 50 "$Q"
bench hm quest8-hm2 50 "$Q"
t hm engine-hm 120 $ROOT/tests/pulseio_engine/test_engine_gpu.py $ROOT/tests/pulseio_engine/test_offload_gpu.py
left=$(( 585 - $(date +%s) + T0 ))
[ $left -gt 40 ] && PYTHONPATH=$ROOT timeout $left python benchmarks/bench_attention.py --budget-s $((left - 25)) \
  --shapes "quest b8,k128 head-major,dense b8x32k" --out $W/attn > $W/attn.out 2>&1
log "attn rc=$? $(grep -A8 SUMMARY $W/attn/bench_attention.log 2>/dev/null | tr -s ' ' | tr '\n' '|')"
log done
