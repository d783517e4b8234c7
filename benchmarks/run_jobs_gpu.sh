#!/usr/bin/env bash
# The device jobs of a session, in order on one machine:
#   CALL_S=<s> TAG=<tag> [KERNEL_CACHE=DIR] OUT=DIR bash benchmarks/run_jobs_gpu.sh SHA JOB[@LIMIT_S]...
# Each job runs under its limit and is skipped when the call's time (CALL_S, default 590) would not hold it;
# h200:JOB / h100:JOB runs only on that card. SHA is the tree's full commit (the reports record it). Output in
# $WORK (default /tmp/pulseio-jobs, kept while the machine stays warm) and $OUT/$TAG.tgz, a live log in
# $OUT/$TAG-live.log. JOB:
#   tests                the GPU serving cases the captured branches touch (tokens [ahead], halves ahead, ride ahead,
#                        steady rounds of IRQ and of ride recalling ahead, admissions and finishes of ride recalling
#                        ahead under the sync check), side by side (~2.5 min cold; 3-6 GiB each)
#   dw-chains            the device-wait chains and interleaved cases (44, ~90 s warm)
#   rows28               the sparse-step issue's all-on-GPU rows: Quest (+vanilla) and SoloHead at 8 x 32K and 32 x 8K
#                        (run_sparse_gpu.sh PARTS=bench; ~4 x 60-90 s)
#   rows28q              its first row alone: Quest (+vanilla) at 8 x 32K
#   offload-gpu          the offload / fused-selection / upload GPU tests (~2.5 min; ~58 GiB, so never beside the cases)
#   halves-quest         one Quest all-on-GPU layer's score -> select -> attention at 8 x 32K, whole and as two halves of
#                        the requests on two streams (bench_fused_selection.py --parts halves; ~40 s)
#   select-width         the select kernel per warps at a 32K table (2048 columns) and just past it (2050), paged and
#                        steered hot (bench_fused_selection.py --parts select at --context 32768 and 32800; ~1 min)
#   attn-gpu             the attention kernels' GPU tests (tests/pulseio_engine/test_attention_gpu.py; ~1 min)
#   pulseio-gpu          pulseio's GPU tests of the runtime, of recall graphs and of partly built routes (23, ~2 min)
#   dw-patterns          every device-wait pattern (374 cases, each in child processes; more than one call's time: a
#                        cut run names the cases that passed)
#   doorbell-busy        bench_doorbell.py --quick, resident only, --busy-host-us 1500 (the GIL's hold on the poller)
#   door-small           bench_doorbell.py --quick, resident only, 16 copy CTAs, one recall of 4, 12 and 32 blocks of
#                        64 KiB at a time on an idle GPU: publish -> copier's start, -> landed early, -> task landed
#                        (~40 s a size; DOOR_COUNTS=a,b,... other counts)
#   door-busy            door-small, and each size again while another stream copies DOOR_BUSY_GIB (4) GiB of device
#                        memory a step, back to back (bench_doorbell.py --busy-gpu-gib): the flight beside kernels on
#                        every SM
#   attn-quest           the sparse attention's configurations at 8 x 32K, Quest's per-head tables and SoloHead's shared
#                        one, each call on KV the L2 does not hold (--cold 3)
#   ncu-select           Nsight Compute (--set full, source pages as csv) of one launch each: the select of Quest's
#                        all-on-GPU rows and of the offload step's steered hot row, Quest's score and attention (~4 min)
#   copy-small           pulseio bench of recalls of 1-64 blocks of 64 KiB, resident and zero-copy, 16 copy CTAs (~1 min;
#                        COPY_COUNTS=a,b,... other counts)
#   gpu-ride             the GPU tests of --ride and --ahead
#   skinny               bench_skinny_gemm.py for qkv and o_proj at 24, 32 and 16 rows (SKINNY_MS=a,b,... other
#                        counts): which of cuBLAS and skinny_linear reads the weight faster on this card (~1.5 min)
#   b{8,16}[hot<X>][ahead[125|15]]   offload bench rows (hot sets of 2 by default; b16 adds --compare-vanilla;
#                        ahead125 / ahead15: --ahead-budget 1.25 / 1.5)
#   {mc,sg}-KIND[-tl]    replays: mc the Mooncake sample's first 40 s x0.15, sg the ServeGen mix from 600 s, 60 s x0.05;
#                        -tl with timelines, read on the device by replay-gaps --kernels 30. qwen3-14b, budget 1024,
#                        threshold 2048, 64 GiB host, --max-offload 24, 6 GiB of GPU KV. KIND: vanilla; irq, irqhot
#                        (IRQ, hot sets of 1.5 budgets); ride, ridehot; ahead, ahead125, ahead5ms, ahead3 (--ride
#                        --ahead; a prediction of 1.25 budgets; the interpreter's 5 ms GIL switch interval; hot sets of
#                        3 budgets, forecast-tpot-2026-12-06-cpu's configuration; ahead3nofreeze: the same with
#                        --no-freeze-heap; ahead3o125, ahead3o15: with a prediction of 1.25 / 1.5 budgets; ahead3c24, ahead3c32: with
#                        24 / 32 copy CTAs); noirqhot (--no-irq);
#                        halves; irqahead, irqahead125, irqahead3, irqahead2s, halvesahead (IRQ or halves recalling
#                        ahead; 3 normal steps a round; two streams). On a cold machine a replay's warm-up takes ~2 min
#                        more; vanilla needs ~240 s (sg) / ~360 s (mc) of limit on a warm one.
#   patch:NAME ... unpatch   the jobs between them run with $KERNEL_CACHE/NAME.patch applied (an experiment, kept
#                        out of the tree: commit it, revert it, and keep its diff there), writing in NAME/ of the output
# Compiled kernels kept across machines: KERNEL_CACHE/cache.txz.* (default .devrun, carried to the machine: an earlier
# call's $OUT/cache.txz.*, xz split in parts under the 16 MiB a returned file may hold) seeds the Triton and Inductor
# caches of a cold machine; each call hands the caches back the same way.
set -u
W0=${WORK:-/tmp/pulseio-jobs}; W=$W0; mkdir -p $W
PATCHED=""
C=/tmp/pulseio-kernel-cache
K=${KERNEL_CACHE:-.devrun}
if [ ! -d $C ] && ls $K/cache.txz.* > /dev/null 2>&1; then mkdir -p $C && cat $K/cache.txz.* | xz -d | tar xf - -C $C; fi
mkdir -p $C/triton $C/inductor
export TRITON_CACHE_DIR=$C/triton TORCHINDUCTOR_CACHE_DIR=$C/inductor
T0=$(date +%s)
TAG=${TAG:-jobs}
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $W/$TAG.log >> $OUT/$TAG-live.log; }
finish() {
  [ -n "$PATCHED" ] && patch -p1 -R -s < $K/$PATCHED.patch
  for d in $W0/*-r/timelines-* $W0/*/*-r/timelines-*; do [ -d $d ] || continue
    keep=$(ls $d | sort -t- -k2 -n | sed -n 5p); [ -n "$keep" ] && gzip -c $d/$keep > $d.$keep.gz; rm -rf $d; done
  rm -f $W0/*/serving.tgz $W0/*/*/serving.tgz; tar czf $OUT/$TAG.tgz -C $W0 .
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
  case $job in   # an experiment: the jobs between patch:NAME and unpatch run on the tree with $K/NAME.patch, in NAME/
    patch:*) [ -n "$PATCHED" ] && { log "skip $job ($PATCHED is applied)"; continue; }
      PATCHED=${job#patch:}; patch -p1 -s < $K/$PATCHED.patch || { log "$K/$PATCHED.patch does not apply"; exit 1; }
      W=$W0/$PATCHED; mkdir -p $W; log "applied $K/$PATCHED.patch: the jobs up to unpatch write in $PATCHED/"; continue;;
    unpatch) [ -n "$PATCHED" ] && patch -p1 -R -s < $K/$PATCHED.patch && log "reverted $PATCHED"
      PATCHED=""; W=$W0; continue;;
  esac
  if [ "$job" = tests ]; then   # the GPU cases the captured branches touch, side by side (a hang fails its case)
    [ $(( $(date +%s) - T0 + 260 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    for c in "tokens ahead" "halves ahead" ahead tokens "nosync 16 overlap ahead" "nosync 16 overlap ride ahead" \
        "nosync-admit ride ahead"; do f=case-${c// /-}
      ( CASE_DUMP_AFTER_S=220 timeout 250 python tests/pulseio_engine/serving_gpu_case.py $c > $W/$f.out 2>&1; echo "rc=$?" >> $W/$f.out ) &
    done
    wait
    for f in case-tokens-ahead case-halves-ahead case-ahead case-tokens case-nosync-16-overlap-ahead case-nosync-16-overlap-ride-ahead \
        case-nosync-admit-ride-ahead; do
      log "$f $(grep -E '^\{' $W/$f.out | tail -1 | cut -c1-300) $(tail -1 $W/$f.out)"; done
    continue
  fi
  if [ "$job" = offload-gpu ]; then
    [ $(( $(date +%s) - T0 + 200 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    timeout 200 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/pulseio_engine/test_offload_gpu.py \
      tests/pulseio_engine/test_fused_selection.py tests/pulseio_engine/test_upload.py > $W/offload-gpu.out 2>&1; echo "rc=$?" >> $W/offload-gpu.out
    log "offload-gpu $(grep -E 'passed|failed' $W/offload-gpu.out | tail -2 | tr '\n' ' ') $(tail -1 $W/offload-gpu.out)"
    continue
  fi
  if [ "$job" = halves-quest ]; then   # does a layer's chain over two staggered halves hide the select?
    timeout ${LIM:-90} python benchmarks/bench_fused_selection.py --parts halves --context 32800 > $W/halves-quest.log 2>&1
    log "$job rc=$? $(grep 'quest layer' $W/halves-quest.log | tr -s ' ' | tr '\n' ';')"; continue
  fi
  if [ "$job" = select-width ]; then   # the select at 2048 columns (a 32K table) and just past it (2050)
    for c in 32768 32800; do
      timeout ${LIM:-80} python benchmarks/bench_fused_selection.py --parts select --only "S=8 paged sum,S=1 hot sum steered" \
        --context $c > $W/select-$c.log 2>&1
      log "$job $c rc=$? $(grep '^select' $W/select-$c.log | tr -s ' ' | tr '\n' ';')"; done
    continue
  fi
  if [ "$job" = attn-gpu ]; then   # the attention kernels against naive attention
    timeout ${LIM:-120} python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/pulseio_engine/test_attention_gpu.py \
      > $W/attn-gpu.out 2>&1
    log "$job rc=$? $(tail -1 $W/attn-gpu.out)"; continue
  fi
  if [ "$job" = pulseio-gpu ] || [ "$job" = dw-patterns ]; then
    files="tests/pulseio/test_runtime_gpu.py tests/pulseio/test_recall_graph_gpu.py tests/pulseio/test_cuda_partial_init.py"
    [ $job = dw-patterns ] && files=tests/pulseio/test_device_wait_patterns_gpu.py
    L=${LIM:-230}; [ $(( $(date +%s) - T0 + L + 10 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    timeout $L python -m pytest -v -rfE -p no:cacheprovider -m gpu $files > $W/$job.out 2>&1
    echo "rc=$?" >> $W/$job.out
    log "$job $(grep -c ' PASSED' $W/$job.out) PASSED $(grep -c ' FAILED' $W/$job.out) FAILED;" \
      "$(grep -E '[0-9]+ (passed|failed)' $W/$job.out | tail -1) $(tail -1 $W/$job.out)"
    continue
  fi
  if [ "$job" = dw-chains ]; then   # the device-wait chains (the watchdog's short timeout) and the engine's shape
    [ $(( $(date +%s) - T0 + 200 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    DEVICE_WAIT_RESULTS=$W/dw-chains.jsonl timeout 190 python -m pytest -q -rfE -p no:cacheprovider -m gpu \
      tests/pulseio/test_device_wait_patterns_gpu.py -k "cold-4 or interleaved" > $W/dw-chains.out 2>&1
    log "$job rc=$? $(tail -1 $W/dw-chains.out)"; continue
  fi
  if [ "$job" = rows28 ] || [ "$job" = rows28q ]; then
    [ $(( $(date +%s) - T0 + ${LIM:-360} )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    d=$job; rm -rf $W/$d
    configs="8x32768 32x8192"; specs="all-on-gpu:quest+vanilla all-on-gpu:solohead"
    [ $job = rows28q ] && { configs=8x32768; specs=all-on-gpu:quest+vanilla; }
    PARTS=bench CONFIGS="$configs" SPECS="$specs" R=$W/$d OUT=$W/$d-out \
      timeout ${LIM:-360} bash benchmarks/run_sparse_gpu.sh > $W/$d.out 2>&1
    log "$d rc=$? $(grep -h -E 'ms/step' $W/$d/*.log 2>/dev/null | cut -c1-260 | tr '\n' ' ')"; continue
  fi
  if [ "$job" = door-small ] || [ "$job" = door-busy ]; then   # small recalls' flight, the early landing a captured
    busy=""; [ $job = door-busy ] && busy="--busy-gpu-gib ${DOOR_BUSY_GIB:-4}"   # wait sees; door-busy: also beside
    for n in $(echo ${DOOR_COUNTS:-4,12,32} | tr ',' ' '); do                   # a device copy on every SM
      timeout 120 python benchmarks/bench_doorbell.py --quick --strategies resident --ctas 16 --recall ${n}x65536 \
        $busy --out $W/$job-$n.json > $W/$job-$n.log 2>&1
      log "$job $n rc=$? $(grep -E "copier's start" $W/$job-$n.log | tr -s ' ' | tr '\n' ' ')"
    done; continue
  fi
  if [ "$job" = doorbell-busy ]; then
    [ $(( $(date +%s) - T0 + 130 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    timeout 120 python benchmarks/bench_doorbell.py --quick --strategies resident --busy-host-us 1500 \
      --out $W/doorbell-busy.json > $W/doorbell-busy.log 2>&1
    log "$job rc=$? $(grep -E '^busy host|resident:' $W/doorbell-busy.log | tr '\n' ' ')"; continue
  fi
  if [ "$job" = attn-quest ]; then   # the sparse attention at 8 x 32K: tiles and splits against the heuristic
    [ $(( $(date +%s) - T0 + 160 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    mkdir -p $W/attn; timeout 160 python benchmarks/bench_attention.py --budget-s 130 --shapes "quest b8 k128 rows,sparse b8 k128" \
      --cold 3 --out $W/attn > $W/attn/log.txt 2>&1
    log "$job rc=$? $(grep -A4 SUMMARY $W/attn/log.txt | tail -3)"; continue
  fi
  if [ "$job" = ncu-select ]; then   # hardware counters (Nsight Compute) of the step's sparse kernels, one launch each
    [ $(( $(date +%s) - T0 + 300 )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    mkdir -p $W/ncu
    prof() {   # NAME KERNEL_REGEX COMMAND...: the report, its details page and its per-SASS-line source page (csv)
      local name=$1 kernel=$2; shift 2
      timeout 150 ncu --clock-control none -k regex:$kernel --launch-count 1 --set full --import-source yes -f \
        -o $W/ncu/$name "$@" > $W/ncu/$name.run.log 2>&1
      ncu -i $W/ncu/$name.ncu-rep --page details > $W/ncu/$name.details.txt 2>&1
      ncu -i $W/ncu/$name.ncu-rep --page source --csv --print-source sass > $W/ncu/$name.sass.csv 2>&1
      ncu -i $W/ncu/$name.ncu-rep --page source --csv --print-source cuda > $W/ncu/$name.src.csv 2>&1
      log "ncu $name $(grep -E '^ +Duration' $W/ncu/$name.details.txt | head -1)"
    }
    prof select-quest _select_kernel python benchmarks/bench_fused_selection.py --context 32800 --parts select --only "S=8 paged sum"
    prof select-hot _select_kernel python benchmarks/bench_fused_selection.py --context 32800 --parts select --only "S=1 hot sum steered"
    prof score-quest _score_kernel python benchmarks/bench_fused_selection.py --context 32800 --parts score
    prof attn-quest _paged_decode_split_kernel python benchmarks/bench_attention.py --budget-s 5 --shapes "quest b8 k128 rows" --out $W/ncu
    continue
  fi
  if [ "$job" = copy-small ]; then   # pulseio bench: recalls of 1-64 blocks of 64 KiB over the engine's 16 copy CTAs
    timeout 110 python -m pulseio.cli bench --block-sizes 65536 --counts ${COPY_COUNTS:-1,4,16,64} --strategies resident,zero_copy \
      --directions h2d --zero-copy-ctas 16 --no-load --no-progress --verbose --json $W/copy-small.json \
      --plot $W/copy-small.png > $W/copy-small.log 2>&1
    log "$job rc=$? $(grep -E "^recall (resident|zero_copy) " $W/copy-small.log | sed -E 's/ load=False//; s/ slow=.*//' \
      | awk '{printf "%s %s %s %s; ", $2, $5, $6, substr($8, 1, 9)}')"; continue
  fi
  if [ "$job" = skinny ]; then   # the projections a ridden round runs past 16 rows: cuBLAS or skinny_linear
    L=${LIM:-100}; [ $(( $(date +%s) - T0 + L )) -gt ${CALL_S:-590} ] && { log "skip $job (time)"; continue; }
    timeout $L python benchmarks/bench_skinny_gemm.py --shapes qkv,o --ms ${SKINNY_MS:-24,32,16} --budget-s $((L - 25)) \
      --json $W/skinny.json > $W/skinny.log 2>&1
    log "$job rc=$? $(grep -A12 SUMMARY $W/skinny.log | grep -E '^(qkv|o) ' | tr -s ' ' | tr '\n' ';')"; continue
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
    bsz=8; case $job in b16*) bsz=16;; esac; extra=""
    case $job in *ahead) extra="--ahead";; *ahead125) extra="--ahead --ahead-budget 1.25";; *ahead15) extra="--ahead --ahead-budget 1.5";; esac
    hot=2; case $job in *hot*) hot=${job#*hot}; hot=${hot%ahead*};; esac
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
    irqhot) EXTRA="--max-offload 24 --hot-cache 1.5"; limit=260;;
    vanilla) EXTRA=""; limit=280;;
    ride) EXTRA="--max-offload 24 --ride";;
    ridehot) EXTRA="--max-offload 24 --ride --hot-cache 1.5";;
    ahead) EXTRA="--max-offload 24 --ride --ahead --hot-cache 1.5";;
    ahead125) EXTRA="--max-offload 24 --ride --ahead --hot-cache 1.5 --ahead-budget 1.25";;
    ahead3) EXTRA="--max-offload 24 --ride --ahead --hot-cache 3";;
    ahead3nofreeze) EXTRA="--max-offload 24 --ride --ahead --hot-cache 3 --no-freeze-heap";;
    ahead3o125) EXTRA="--max-offload 24 --ride --ahead --hot-cache 3 --ahead-budget 1.25";;
    ahead3o15) EXTRA="--max-offload 24 --ride --ahead --hot-cache 3 --ahead-budget 1.5";;
    ahead3c24) EXTRA="--max-offload 24 --ride --ahead --hot-cache 3 --copier-ctas 24";;
    ahead3c32) EXTRA="--max-offload 24 --ride --ahead --hot-cache 3 --copier-ctas 32";;
    ahead5ms) EXTRA="--max-offload 24 --ride --ahead --hot-cache 1.5 --gil-switch-us 0";;
    noirqhot) EXTRA="--max-offload 24 --no-irq --hot-cache 1.5";;
    halves) EXTRA="--max-offload 24 --halves";;
    irqahead) EXTRA="--max-offload 24 --ahead --hot-cache 1.5"; limit=260;;
    irqahead125) EXTRA="--max-offload 24 --ahead --hot-cache 1.5 --ahead-budget 1.25"; limit=260;;
    irqahead3) EXTRA="--max-offload 24 --ahead --hot-cache 1.5 --normal-steps 3"; limit=260;;
    irqahead2s) EXTRA="--max-offload 24 --ahead --hot-cache 1.5 --two-streams"; limit=260;;
    halvesahead) EXTRA="--max-offload 24 --halves --ahead --hot-cache 1.5"; limit=260;;
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
  grep -h -E "roofline|decode tok/s|GPU busy|TPOT p50/p99 <8K|rounds ridden|step graphs|warm-up|host ms|publish->landed GB/s|recall copy|GC |longest gap|landed early|own recall|ahead recall" \
    $W/$job-r/table.txt $W/$job-r/*.log 2>/dev/null | sort -u | tee -a $W/$TAG.log
done
log done
