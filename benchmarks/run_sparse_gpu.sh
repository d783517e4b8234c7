#!/usr/bin/env bash
# The sparse decode step on one H200: the GPU tests of its kernels and recall path (fused selection, token store,
# row-table attention, captured recalls, the offload engine, pulseio's chained device waits), then `pulseio-engine
# bench` in the sparse modes (qwen3-14b preset, random weights, handed-in random KV, the real scoring and top-K
# steered to the shipped recall-locality model), each against its roofline; SPEC suffix "+vanilla" adds
# --compare-vanilla (the dense step of the same batch, same process), "+bound" (offload modes) --compare-all-on-gpu
# (the offload step against the all-on-GPU step + the recall at 0.8 of the link); both: "+bound+vanilla".
#   PULSEIO_GIT_SHA=$(git rev-parse HEAD) PARTS="tests bench" bash benchmarks/run_sparse_gpu.sh
# Env: PARTS, TESTS (pytest paths) and TESTS_TIMEOUT_S (420), STEPS (20), CONFIGS ("8x32768 24x8192"), SPECS (mode:selection ...), BUDGET (2048),
# BENCH_ARGS (more `bench` options for every run, say "--copier-idle-us 100"), PROFILE=1 (a torch.profiler
# table per run), R (the work folder, /tmp/sparse-results: one per concurrent run).
# PARTS=stall: the offload GPU case STALL_RUNS (5) times in fresh processes, one line each with its first-expiry
# report (doorbell slot, wait words); STALL_ENV (say CUDA_LAUNCH_BLOCKING=1) is set for those runs only.
# Results: $OUT/sparse.tgz.
set -u
R=${R:-/tmp/sparse-results}; rm -rf $R; mkdir -p $R
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PARTS=${PARTS:-"tests bench"}; STEPS=${STEPS:-20}; BUDGET=${BUDGET:-2048}
CONFIGS=${CONFIGS:-"8x32768 24x8192"}
SPECS=${SPECS:-"all-on-gpu:quest+vanilla all-on-gpu:solohead offload-doorbell:solohead offload-sync:solohead"}
{ date -u +%FT%TZ; echo "git ${PULSEIO_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)}"; hostname
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  free -g | head -2; echo "PARTS=$PARTS STEPS=$STEPS BUDGET=$BUDGET CONFIGS=$CONFIGS BENCH_ARGS=${BENCH_ARGS:-}"; } > $R/meta.txt 2>&1
finish() { mkdir -p ${OUT:-/tmp} && tar czf ${OUT:-/tmp}/sparse.tgz -C $R . ; }
trap finish EXIT

if [[ " $PARTS " == *" tests "* ]]; then
  echo "== gpu tests" | tee -a $R/progress.log
  TESTS=${TESTS:-"tests/pulseio_engine/test_fused_selection.py tests/pulseio_engine/test_token_store.py
    tests/pulseio_engine/test_attention_gpu.py tests/pulseio/test_recall_graph_gpu.py
    tests/pulseio_engine/test_offload_gpu.py tests/pulseio/test_cuda_transfer.py tests/pulseio/test_runtime_gpu.py
    tests/pulseio_engine/test_engine_gpu.py tests/pulseio/test_device_wait_patterns_gpu.py"}
  timeout ${TESTS_TIMEOUT_S:-420} python -m pytest -q -m gpu -p no:cacheprovider -rfE $TESTS \
    -k "not test_device_wait_pattern or cold-4 or interleaved" \
    > $R/tests.log 2>&1
  echo "tests rc=$?" | tee -a $R/progress.log; tail -3 $R/tests.log
fi

if [[ " $PARTS " == *" stall "* ]]; then
  echo "== offload case, ${STALL_RUNS:-5} runs ${STALL_ENV:-}" | tee -a $R/progress.log
  for i in $(seq 1 "${STALL_RUNS:-5}"); do
    env ${STALL_ENV:-} timeout 120 python -m pytest -q -x -m gpu -p no:cacheprovider \
      tests/pulseio_engine/test_offload_gpu.py > $R/stall-$i.log 2>&1
    echo "run $i rc=$? $(tail -1 $R/stall-$i.log | cut -c1-80) | $(grep -o 'doorbell slot of seq [0-9]*: [a-z ]*' \
      $R/stall-$i.log | head -1) $(grep -o 'wait words: [^\\]*' $R/stall-$i.log | head -1 | cut -c1-80)" | tee -a $R/progress.log
  done
fi

if [[ " $PARTS " == *" bench "* ]]; then
  for cfg in $CONFIGS; do
    b=${cfg%x*}; ctx=${cfg#*x}
    for spec in $SPECS; do
      extra=""; [[ $spec == *+bound* ]] && extra="--compare-all-on-gpu"; spec=${spec/+bound/}
      [[ $spec == *+vanilla ]] && extra="$extra --compare-vanilla"; spec=${spec%+vanilla}
      mode=${spec%:*}; sel=${spec#*:}; name=${mode}_${sel}_b${b}_ctx${ctx}
      echo "== $name $extra" | tee -a $R/progress.log
      timeout 300 python -m pulseio_engine.cli bench --model qwen3-14b --mode $mode --selection $sel \
        --batch-size $b --context-len $ctx --token-budget $BUDGET --steps $STEPS --warmup 3 $extra \
        --json $R/$name.json ${PROFILE:+--profile $R/$name.profile.txt} ${BENCH_ARGS:-} > $R/$name.log 2>&1
      echo "rc=$? $(tail -1 $R/$name.log)" | tee -a $R/progress.log
    done
  done
fi
