#!/usr/bin/env bash
# Session 43: `CALL_S=<s> TAG=<tag> bash s43a.sh SHA JOB[@LIMIT_S]...`, the jobs in order on one machine, each under
# its limit and skipped when the call's time (CALL_S) would not hold it; h200:JOB / h100:JOB only on that card. Output in /tmp/s37 (kept while the machine
# stays warm) and $OUT/$TAG.tgz, a live log in $OUT/$TAG-live.log. JOB:
#   tests                the GPU cases the captured branches touch (ahead, ride, halves, tokens, nosync ahead), side
#                        by side (~2.5 min cold; each takes 3-6 GiB)
#   offload-gpu          the offload / fused-selection GPU tests (~2.5 min; ~58 GiB, so never beside the cases)
#   pulseio-gpu          pulseio's GPU tests (runtime, recall graphs, device-wait patterns: the watchdog's new look)
#   doorbell-busy        bench_doorbell.py --quick, resident only, --busy-host-us 1500 (the GIL's hold on the poller)
#   attn-quest           Quest's per-head attention configurations at 8 x 32K
#   gpu-ride             the GPU tests of --ride and --ahead
#   b{8,16}[hot<X>][ahead]   offload bench rows (hot sets of 2 by default; b16 adds --compare-vanilla)
#   {mc,sg}-{irq,ride,ridehot,ahead,ahead5ms,noirqhot,halves,vanilla}[-tl]   replays (mc: Mooncake 40 s x0.15; sg: ServeGen
#                        600 s + 60 s x0.05; -tl: timelines, read on the device by replay-gaps --kernels 30). Budget 1024,
#                        threshold 2048, 64 GiB host, --max-offload 24, 6 GiB. On a cold machine a replay's warm-up takes
#                        ~2 min more; vanilla needs ~240 s (sg) / ~360 s (mc) of limit on a warm one. ahead5ms: ahead at
#                        the interpreter's 5 ms GIL switch interval (--gil-switch-us 0), against ahead's 100 us.
# Carry .devrun (and with it .devrun/cache.txz.*, the compiled-kernel caches a call handed back, if kept there).
set -u
W=/tmp/s37; mkdir -p $W
# compiled kernels kept across machines: .devrun/cache.txz.* (carried, from an earlier call's $OUT/cache.txz.*: xz,
# split in parts under the 16 MiB a returned file may hold) seeds the Triton and Inductor caches of a cold machine
C=/tmp/s42cache
if [ ! -d $C ] && ls .devrun/cache.txz.* > /dev/null 2>&1; then mkdir -p $C && cat .devrun/cache.txz.* | xz -d | tar xf - -C $C; fi
mkdir -p $C/triton $C/inductor
export TRITON_CACHE_DIR=$C/triton TORCHINDUCTOR_CACHE_DIR=$C/inductor
T0=$(date +%s)
TAG=${TAG:-s43a}
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/$TAG.log >> $OUT/$TAG-live.log; }
finish() {
  for d in $W/*-r/timelines-*; do [ -d $d ] || continue
    keep=$(ls $d | sort -t- -k2 -n | sed -n 5p); [ -n "$keep" ] && gzip -c $d/$keep > $d.$keep.gz; rm -rf $d; done
  rm -f $W/*/serving.tgz; tar czf $OUT/$TAG.tgz -C $W .
  tar cf - -C $C . | xz -T0 -6 > /tmp/cache.txz && [ $(stat -c %s /tmp/cache.txz) -lt 45000000 ] && \
    split -b 15000000 -d /tmp/cache.txz $OUT/cache.txz.
  echo "cache $(du -sh $C | cut -f1), packed $(stat -c %s /tmp/cache.txz) bytes" >> $OUT/$TAG-live.log
}
trap finish EXIT
SHA=$1; shift
export PULSEIO_GIT_SHA=$SHA PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log "start $SHA $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) jobs: $*"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
for spec in "$@"; do
  case $spec in   # h200:JOB runs only on an H200, h100:JOB only on an H100
    h200:*) spec=${spec#h200:}; case $GPU in *H200*) ;; *) log "skip $spec (not an H200)"; continue;; esac;;
    h100:*) spec=${spec#h100:}; case $GPU in *H100*) ;; *) log "skip $spec (not an H100)"; continue;; esac;;
  esac
  job=${spec%@*}; LIM=""; [ "$spec" != "$job" ] && LIM=${spec#*@}
  if [ "$job" = tests ]; then   # the GPU cases the captured branches touch, side by side (a hang fails its case)
    [ $(( $(date +%s) - T0 + 260 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    for c in ahead ride halves tokens "nosync 16 overlap ahead"; do f=case-${c// /-}
      ( CASE_DUMP_AFTER_S=220 timeout 250 python tests/pulseio_engine/serving_gpu_case.py $c > $W/$f.out 2>&1; echo "rc=$?" >> $W/$f.out ) &
    done
    wait
    for f in case-ahead case-ride case-halves case-tokens case-nosync-16-overlap-ahead; do
      log "$f $(grep -E '^\{' $W/$f.out | tail -1 | cut -c1-300) $(tail -1 $W/$f.out)"; done
    continue
  fi
  if [ "$job" = offload-gpu ]; then
    [ $(( $(date +%s) - T0 + 200 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    timeout 200 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/pulseio_engine/test_offload_gpu.py \
      tests/pulseio_engine/test_fused_selection.py > $W/offload-gpu.out 2>&1; echo "rc=$?" >> $W/offload-gpu.out
    log "offload-gpu $(grep -E 'passed|failed' $W/offload-gpu.out | tail -2 | tr '\n' ' ') $(tail -1 $W/offload-gpu.out)"
    continue
  fi
  if [ "$job" = pulseio-gpu ]; then
    [ $(( $(date +%s) - T0 + 240 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    timeout 230 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/pulseio/test_runtime_gpu.py \
      tests/pulseio/test_recall_graph_gpu.py tests/pulseio/test_device_wait_patterns_gpu.py > $W/pulseio-gpu.out 2>&1
    echo "rc=$?" >> $W/pulseio-gpu.out
    log "pulseio-gpu $(grep -E 'passed|failed' $W/pulseio-gpu.out | tail -2 | tr '\n' ' ') $(tail -1 $W/pulseio-gpu.out)"
    continue
  fi
  if [ "$job" = doorbell-busy ]; then
    [ $(( $(date +%s) - T0 + 130 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    timeout 120 python benchmarks/bench_doorbell.py --quick --strategies resident --busy-host-us 1500 \
      --out $W/doorbell-busy.json > $W/doorbell-busy.log 2>&1
    log "$job rc=$? $(grep -E '^busy host|resident:' $W/doorbell-busy.log | tr '\n' ' ')"; continue
  fi
  if [ "$job" = attn-quest ]; then   # Quest's per-head attention at 8 x 32K: tiles and splits against the heuristic
    [ $(( $(date +%s) - T0 + 100 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    mkdir -p $W/attn; timeout 100 python benchmarks/bench_attention.py --budget-s 70 --shapes "quest b8 k128 rows" --out $W/attn > $W/attn/log.txt 2>&1
    log "$job rc=$? $(grep -A4 SUMMARY $W/attn/log.txt | tail -3)"; continue
  fi
  if [ "$job" = gpu-ride ]; then   # the GPU tests of --ride and --ahead: tokens, steady rounds never sync the host
    [ $(( $(date +%s) - T0 + 330 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    timeout 320 python -m pytest -q -rA -p no:cacheprovider tests/pulseio_engine/test_serving_gpu.py -k "ride or ahead" \
      tests/pulseio_engine/test_fused_selection.py -m gpu \
      > $W/gpu-ride.out 2>&1
    log "$job rc=$? $(grep -E "passed|failed|PASSED|FAILED" $W/gpu-ride.out | tail -6 | tr '\n' ' ')"; continue
  fi
  case $job in b8*|b16*)   # the sparse-step issue's offload rows: b{8,16}[hot<budgets>][ahead], hot sets of 2 by default
    [ $(( $(date +%s) - T0 + 120 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    bsz=8; case $job in b16*) bsz=16;; esac; extra=""; case $job in *ahead) extra="--ahead";; esac
    hot=2; case $job in *hot*) hot=${job#*hot}; hot=${hot%ahead};; esac
    van=""; [ $bsz = 16 ] && van="--compare-vanilla"
    timeout 120 python -m pulseio_engine.cli bench --model qwen3-14b --mode offload-doorbell --batch-size $bsz \
      --context-len 32768 --steps 20 --warmup 3 --compare-all-on-gpu $van --hot-cache $hot $extra --no-progress \
      --json $W/$job.json > $W/$job.log 2>&1
    log "$job rc=$? $(tail -c 900 $W/$job.log | tr '\n' ' ')"; continue;;
  esac
  base=${job%-tl}; win=${base%%-*}; kind=${base#*-}; limit=300; TL=""; [ "$job" != "$base" ] && TL="TIMELINES=1"
  case $win in
    mc) WENV="DURATION=40 TIME_SCALE=0.15";;
    sg) WENV="TRACE=servegen-mix START=600 DURATION=60 TIME_SCALE=0.05";;
  esac
  case $kind in
    irq) EXTRA="--max-offload 24"; limit=260;;
    vanilla) EXTRA=""; limit=280;;
    ride) EXTRA="--max-offload 24 --ride";;
    ridehot) EXTRA="--max-offload 24 --ride --hot-cache 1.5";;
    ahead) EXTRA="--max-offload 24 --ride --ahead --hot-cache 1.5";;
    ahead5ms) EXTRA="--max-offload 24 --ride --ahead --hot-cache 1.5 --gil-switch-us 0";;
    noirqhot) EXTRA="--max-offload 24 --no-irq --hot-cache 1.5";;
    halves) EXTRA="--max-offload 24 --halves";;
  esac
  [ -n "$LIM" ] && limit=$LIM
  [ $(( $(date +%s) - T0 + limit )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
  rm -rf $W/$job $W/$job-r; mkdir -p $W/$job
  mode=pulseinfer; [ $kind = vanilla ] && mode=vanilla
  env PARTS=replay MODES=$mode $WENV GPU_KV_GIB=6 BUDGET=1024 THRESHOLD=2048 HOST_KV_GIB=64 $TL \
    REPLAY_ARGS="$EXTRA" REPLAY_TIMEOUT_S=$((limit - 15)) R=$W/$job-r OUT=$W/$job \
    timeout $limit bash benchmarks/run_serving_gpu.sh > $W/$job.out 2>&1
  log "$job rc=$? $(grep -h -E 'completed|tok/s' $W/$job-r/progress.log 2>/dev/null | tail -2 | tr '\n' ' ')"
  [ -d $W/$job-r/timelines-$mode ] && timeout 60 python -m pulseio_engine.cli replay-gaps \
    $W/$job-r/timelines-$mode --kernels 30 > $W/$job-r/gaps-kernels.txt 2>&1
  grep -h -E "roofline|decode tok/s|GPU busy|TPOT p50/p99 <8K|rounds ridden|step graphs|warm-up|host ms|publish->landed GB/s" \
    $W/$job-r/table.txt $W/$job-r/*.log 2>/dev/null | sort -u | tee -a $W/$TAG.log
done
log done
