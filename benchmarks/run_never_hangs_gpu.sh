#!/usr/bin/env bash
# Issue 11 on one H200: the runtime's GPU tests, every device-wait pattern x strategy x k x cold/warm in fresh
# processes (tests/pulseio/test_device_wait_patterns_gpu.py), the soak, compute-sanitizer on the kernels,
# and bench_doorbell (what the fix costs). Run from the repo root:  OUT=/some/dir bash benchmarks/run_never_hangs_gpu.sh
# QUICK=1: a reduced matrix (PATTERNS_K, a pytest -k; default the k=2048 cold cases) and a 20 s soak
# (SOAK_S, SOAK_N override the soak's seconds and posts). PARTS (default "tests patterns sanitize soak bench") picks steps
# (one device call is 10 minutes at most: the full set takes two). Every step has its own timeout; the
# summary is printed last.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/never_hangs_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
: > "$OUT/steps.txt"
source benchmarks/_steps.sh
QUICK=${QUICK:-0}
SOAK_S=${SOAK_S:-$([ "$QUICK" = 1 ] && echo 20 || echo 130)}
SOAK_N=${SOAK_N:-$([ "$QUICK" = 1 ] && echo 500 || echo 10000)}

step env 30 bash -c 'nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; nproc;
  echo "git sha ${PULSEIO_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)}"; date -u; echo "CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-<unset>}";
  python -c "import torch, numba, cuda.bindings, triton; print(\"torch\", torch.__version__, \"numba\", numba.__version__, \"triton\", triton.__version__, torch.cuda.get_device_name(0))"'
PARTS=${PARTS:-tests patterns sanitize soak bench}
has() { [[ " $PARTS " == *" $1 "* ]]; }
has tests && step pytest_runtime_gpu 240 python -m pytest -q -rfE -p no:cacheprovider -o faulthandler_timeout=100 \
  tests/pulseio/test_runtime_gpu.py tests/pulseio/test_cuda_transfer.py
if ! has patterns; then :
elif [ "$QUICK" = 1 ]; then
  step patterns 200 python -m pytest -q -rfE -p no:cacheprovider -k "${PATTERNS_K:-2048-cold}" \
    tests/pulseio/test_device_wait_patterns_gpu.py
else
  DEVICE_WAIT_JOBS=${DEVICE_WAIT_JOBS:-14} DEVICE_WAIT_RESULTS="$OUT/patterns.jsonl" step patterns 420 python -m pytest -q -rfE -p no:cacheprovider \
    tests/pulseio/test_device_wait_patterns_gpu.py
fi
has soak && step soak $((SOAK_S + 200)) python benchmarks/soak_runtime.py --seconds "$SOAK_S" --min-posts "$SOAK_N" --out "$OUT/soak.json"
has sanitize && step memcheck 180 compute-sanitizer --tool memcheck --report-api-errors no --print-limit 20 python benchmarks/sanitize_kernels.py
has sanitize && step racecheck 180 compute-sanitizer --tool racecheck --print-limit 20 python benchmarks/sanitize_kernels.py
has bench && step bench 200 python benchmarks/bench_doorbell.py $([ "$QUICK" = 1 ] && echo --quick) --out "$OUT/bench_doorbell.json"

echo "===== env"; tail -5 "$OUT/env.log" 2>/dev/null
for t in pytest_runtime_gpu patterns; do
  echo "===== $t"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/$t.log" 2>/dev/null | tail -25
done
echo "===== soak"; grep -E '"(seconds|posts|wrong|failed|direct|direct_wrong|statistics_add_up|ok)"' "$OUT/soak.json" 2>/dev/null
tail -3 "$OUT/soak.log"
echo "===== sanitizer"; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|wrong recalls|Error" "$OUT/memcheck.log" "$OUT/racecheck.log" 2>/dev/null | head
echo "===== steps"; cat "$OUT/steps.txt"
echo "===== bench"; sed -n '/^=== summary/,$p' "$OUT/bench.log" 2>/dev/null | tail -14
