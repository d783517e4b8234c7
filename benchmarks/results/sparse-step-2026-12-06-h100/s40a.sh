#!/usr/bin/env bash
# Session 40 (PDL jobs; PDL=0|1 sets PULSEIO_ENGINE_PDL for the rest): jobs named on the command line, in order, on one machine: `bash s40a.sh SHA JOB[@LIMIT_S]...`.
# JOB: tests-pdl (GPU tests with PDL on), pdl-{quest,solo,b8,quest32} (a bench row with PDL off, on, on with
# Inductor's), tests-ahead | gpu-ride (the GPU tests of --ride and --ahead), b{8,16}[hot<budgets>][ahead] (offload
# bench rows, hot sets of 2 by default), or {mc,sg}-{irq,ride,ridehot,ahead,noirqhot,halves,vanilla}[-tl]  (mc: Mooncake 40 s x0.15; sg: ServeGen mix 600 s + 60 s x0.05; -tl: timelines,
# read on the device by replay-gaps --kernels 30). Budget 1024, threshold 2048, 64 GiB host, --max-offload 24, 6 GiB.
set -u
W=/tmp/s37; mkdir -p $W
T0=$(date +%s)
TAG=${TAG:-s39a}
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/$TAG.log >> $OUT/$TAG-live.log; }
finish() {
  for d in $W/*-r/timelines-*; do [ -d $d ] || continue
    keep=$(ls $d | sort -t- -k2 -n | sed -n 5p); [ -n "$keep" ] && gzip -c $d/$keep > $d.$keep.gz; rm -rf $d; done
  rm -f $W/*/serving.tgz; tar czf $OUT/$TAG.tgz -C $W .
}
trap finish EXIT
SHA=$1; shift
export PULSEIO_GIT_SHA=$SHA PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PULSEIO_ENGINE_PDL=${PDL:-1}
log "start $SHA $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) jobs: $*"
for spec in "$@"; do
  job=${spec%@*}; LIM=""; [ "$spec" != "$job" ] && LIM=${spec#*@}
  if [ "$job" = tests-ahead ]; then   # the new GPU cases, side by side: ahead tokens, no host sync, select kernel specs
    [ $(( $(date +%s) - T0 + 90 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    ( CASE_DUMP_AFTER_S=170 timeout 200 python tests/pulseio_engine/serving_gpu_case.py ahead > $W/case-ahead.out 2>&1; echo "rc=$?" >> $W/case-ahead.out ) &
    ( CASE_DUMP_AFTER_S=170 timeout 200 python tests/pulseio_engine/serving_gpu_case.py nosync 16 overlap ahead > $W/case-nosync-ahead.out 2>&1; echo "rc=$?" >> $W/case-nosync-ahead.out ) &
    ( timeout 200 python -m pytest -q -rA -p no:cacheprovider tests/pulseio_engine/test_fused_selection.py -m gpu -k ahead > $W/fused-ahead.out 2>&1; echo "rc=$?" >> $W/fused-ahead.out ) &
    ( CASE_DUMP_AFTER_S=170 timeout 200 python tests/pulseio_engine/serving_gpu_case.py ride > $W/case-ride.out 2>&1; echo "rc=$?" >> $W/case-ride.out ) &
    wait
    for f in case-ahead case-nosync-ahead fused-ahead case-ride; do log "$f $(grep -E '^\{' $W/$f.out | tail -1 | cut -c1-600) $(grep -E 'passed|failed' $W/$f.out | tail -2 | tr '\n' ' ') $(tail -1 $W/$f.out)"; done
    continue
  fi
  case $job in pdl-quest|pdl-solo|pdl-b8|pdl-quest32)   # bench rows with PDL off then on, same machine
    [ $(( $(date +%s) - T0 + 240 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    sel=quest; mode=all-on-gpu; cfgb=8; ctx=32768; extra="--compare-vanilla"
    case $job in pdl-solo) sel=solohead;; pdl-b8) sel=solohead; mode=offload-doorbell; extra="--compare-all-on-gpu --hot-cache 2";; pdl-quest32) cfgb=32; ctx=8192; extra="";; esac
    for v in 0 1 2; do   # 2: Inductor's kernels too (TORCHINDUCTOR_ENABLE_PDL)
      PULSEIO_ENGINE_PDL=$(( v > 0 )) TORCHINDUCTOR_ENABLE_PDL=$(( v > 1 )) timeout 130 python -m pulseio_engine.cli bench --model qwen3-14b --mode $mode --selection $sel \
        --batch-size $cfgb --context-len $ctx --token-budget 2048 --steps 20 --warmup 3 $extra --no-progress \
        --json $W/$job-pdl$v.json > $W/$job-pdl$v.log 2>&1
      log "$job PDL=$v rc=$? $(grep -E 'ms/step|vanilla' $W/$job-pdl$v.log | tail -2 | tr '\n' ' ' | cut -c1-500)"
    done; continue;;
  esac
  if [ "$job" = tests-pdl ]; then   # the GPU tests of the engine's kernels, the offload case and the ride tokens, PDL on
    [ $(( $(date +%s) - T0 + 180 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    ( PULSEIO_ENGINE_PDL=1 timeout 170 python -m pytest -q -rfE -p no:cacheprovider -m gpu \
      tests/pulseio_engine/test_dependent_launch.py tests/pulseio_engine/test_skinny_gemm.py \
      tests/pulseio_engine/test_fused_selection.py tests/pulseio_engine/test_token_store.py \
      tests/pulseio_engine/test_offload_gpu.py > $W/tests-pdl.out 2>&1; echo "rc=$?" >> $W/tests-pdl.out ) &
    ( PULSEIO_ENGINE_PDL=1 CASE_DUMP_AFTER_S=150 timeout 170 python tests/pulseio_engine/serving_gpu_case.py ride \
      > $W/case-ride-pdl.out 2>&1; echo "rc=$?" >> $W/case-ride-pdl.out ) &
    wait
    log "$job $(grep -E 'passed|failed|FAILED|Error' $W/tests-pdl.out | tail -5 | tr '\n' ' ' | cut -c1-600) $(tail -1 $W/tests-pdl.out)"
    log "case-ride-pdl $(grep -E '^\{' $W/case-ride-pdl.out | tail -1 | cut -c1-400) $(tail -1 $W/case-ride-pdl.out)"
    continue
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
