#!/usr/bin/env bash
# The serving loop on one H200: its GPU tests (IRQ tokens against each batch alone with captured and late recalls,
# sync-free steady rounds, a normal batch in per-layer pieces against one graph, a replay losing nothing; captured
# publish-only recalls), then `pulseio-engine replay` of a Mooncake window in every mode at the same GPU KV cap
# (qwen3-14b preset: random weights, handed-in random KV, selection steered to the shipped locality), and the table.
#   PULSEIO_GIT_SHA=$(git rev-parse HEAD) PARTS="tests replay" bash benchmarks/run_serving_gpu.sh
# Env: PARTS ("tests replay"), TESTS_TIMEOUT_S (540); MODEL (qwen3-14b), TRACE (mooncake-sample; servegen-mix for
# ServeGen's long-prompt clients), START (0), DURATION (10 s of the trace), TIME_SCALE (1), MAX_INPUT (32000),
# MAX_OUTPUT (1024), GPU_KV_GIB (6: vanilla memory-bound), HOST_KV_GIB (32), THRESHOLD (4096), BUDGET (2048),
# MODES ("vanilla quest offload-sync pulseinfer pulseinfer-noirq"),
# REPLAY_TIMEOUT_S (540 a mode), REPLAY_ARGS (more `replay` options for every run), TIMELINES=1 (each mode's
# sampled rounds as Chrome traces in $R/timelines-<mode>/, read by `replay-gaps` into $R/gaps-<mode>.txt), DEVICE (cuda; cpu: a dry run of the script with
# MODEL=tiny), R (/tmp/serving-results).
# The throughput-bound windows of the results: Mooncake DURATION=20 TIME_SCALE=0.3 (65 requests in 5.4 s); ServeGen
# TRACE=servegen-mix START=600 DURATION=60 TIME_SCALE=0.05 (36 requests in 3 s, 23 of them 4K tokens or longer).
# A 10-minute loss check: PARTS=replay MODES=pulseinfer DURATION=150 TIME_SCALE=4.3 REPLAY_TIMEOUT_S=1500 DETACH=1 (the
# shipped sample's 400 requests, their arrivals stretched over 606 s; longer than one command may run on the lent
# machines): DETACH=1 starts the run in its own session and returns; a later command on
# the same machine, `PARTS=collect WAIT_S=560 bash benchmarks/run_serving_gpu.sh`, waits up to WAIT_S for it to
# finish and copies its results (or, still running, its progress so far) to $OUT. Results: $OUT/serving.tgz.
set -u
R=${R:-/tmp/serving-results}
DETACHED=/tmp/serving-detached                  # the detached run's results and its done marker
if [[ "${PARTS:-}" == collect ]]; then
  for _ in $(seq 1 "${WAIT_S:-560}"); do [ -e $DETACHED/done ] && break; sleep 1; done
  mkdir -p ${OUT:-/tmp}
  if [ -e $DETACHED/done ]; then cp $DETACHED/serving.tgz ${OUT:-/tmp}/; echo "collected: $(cat $DETACHED/done)"
  else tail -3 $R/progress.log $R/*.log 2>/dev/null | tail -20; echo "still running; collect again"; fi
  exit 0
fi
if [[ "${DETACH:-0}" == 1 ]]; then
  rm -rf $DETACHED; mkdir -p $DETACHED
  DETACH=0 OUT=$DETACHED setsid nohup bash -c "bash '$0'; echo \"rc=\$? \$(date -u +%FT%TZ)\" > $DETACHED/done" \
    > $DETACHED/script.log 2>&1 < /dev/null &
  echo "detached (pid $!): collect with PARTS=collect bash $0"
  exit 0
fi
rm -rf $R; mkdir -p $R
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PULSEIO_NO_PROGRESS=1
PARTS=${PARTS:-"tests replay"}; MODEL=${MODEL:-qwen3-14b}
TRACE=${TRACE:-mooncake-sample}   # the shipped 400-request head (141 s); the whole trace must be carried to the device
MODES=${MODES:-"vanilla quest offload-sync pulseinfer pulseinfer-noirq"}
{ date -u +%FT%TZ; echo "git ${PULSEIO_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)}"; hostname
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  free -g | head -2; echo "PARTS=$PARTS MODEL=$MODEL TRACE=$TRACE MODES=$MODES"; } > $R/meta.txt 2>&1
finish() { mkdir -p ${OUT:-/tmp} && tar czf ${OUT:-/tmp}/serving.tgz -C $R . ; }
trap finish EXIT

if [[ " $PARTS " == *" tests "* ]]; then
  echo "== gpu tests" | tee -a $R/progress.log
  timeout ${TESTS_TIMEOUT_S:-540} python -m pytest -q -m gpu -p no:cacheprovider -rfE -s \
    tests/pulseio/test_recall_graph_gpu.py tests/pulseio_engine/test_serving_gpu.py > $R/tests.log 2>&1
  echo "tests rc=$?" | tee -a $R/progress.log; tail -3 $R/tests.log
fi

if [[ " $PARTS " == *" replay "* ]]; then
  common="--trace $TRACE --start ${START:-0} --duration ${DURATION:-10} --time-scale ${TIME_SCALE:-1}
    --max-input ${MAX_INPUT:-32000} --max-output ${MAX_OUTPUT:-1024} --model $MODEL --gpu-kv-gib ${GPU_KV_GIB:-6}
    --token-budget ${BUDGET:-2048} --device ${DEVICE:-cuda} ${REPLAY_ARGS:-}"
  offload="--host-kv-gib ${HOST_KV_GIB:-32} --offload-threshold ${THRESHOLD:-4096}"
  for m in $MODES; do
    case $m in
      vanilla|quest) args="--mode $m" ;;
      pulseinfer-noirq) args="--mode pulseinfer --no-irq $offload" ;;
      *) args="--mode $m $offload" ;;
    esac
    echo "== $m" | tee -a $R/progress.log
    timeout -k 10 ${REPLAY_TIMEOUT_S:-540} python -m pulseio_engine.cli replay $common $args \
      ${TIMELINES:+--timeline-dir $R/timelines-$m} --json $R/$m.json --plot $R/$m.png > $R/$m.log 2>&1
    echo "rc=$? $(grep -E 'decode tok/s|completed' $R/$m.log | tr -s ' ' | tr '\n' ' ')" | tee -a $R/progress.log
    [ -n "${TIMELINES:-}" ] && [ -d $R/timelines-$m ] && python -m pulseio_engine.cli replay-gaps $R/timelines-$m \
      > $R/gaps-$m.txt 2>&1
  done
  python -m pulseio_engine.cli replay-table $R/*.json --plot $R/compare.png > $R/table.txt 2>&1
  cat $R/table.txt
fi
