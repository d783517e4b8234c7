#!/usr/bin/env bash
# Doorbell runtime (issue 3) on one H200: environment, the runtime's gpu-marked tests, the CPU tests of
# the runtime (sanity on that machine), the example, and benchmarks/bench_doorbell.py. < 4 minutes in all.
#   run from the repo root:  OUT=/some/dir PYTHONPATH=. bash benchmarks/run_runtime_gpu.sh
# Raw output under $OUT: steps.txt, env.log, pytest_gpu.log/.xml, pytest_cpu.log, example.log, bench.log,
# bench_doorbell.json (device name, date, git sha, every figure; errors per section). Every step has its
# own timeout and a failing step never stops the later ones. The last thing printed is the summary.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/runtime_gpu_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# device waits + a kernel first launched under lazy module loading deadlocked on the H200
: > "$OUT/steps.txt"

source benchmarks/_steps.sh

step env 30 bash -c 'nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm --format=csv; nproc;
  echo "git sha ${PULSEIO_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)}"; date -u; python -c "import sys, torch, numpy, numba, numba.cuda, cuda.bindings; print(sys.version.split()[0], \"torch\", torch.__version__, \"numpy\", numpy.__version__, \"numba\", numba.__version__, \"cuda.bindings\", cuda.bindings.__version__, torch.cuda.get_device_name(0))"'
step pytest_gpu 90 python -m pytest -v -rfE -p no:cacheprovider -o faulthandler_timeout=60 --durations=8 --junitxml="$OUT/pytest_gpu.xml" \
  tests/pulseio/test_runtime_gpu.py
step example 40 python examples/02_doorbell_recall.py
step bench 150 python benchmarks/bench_doorbell.py --out "$OUT/bench_doorbell.json"
if [ ! -s "$OUT/bench_doorbell.json" ]; then  # the full run died or timed out: try the short one
  step bench_quick 60 python benchmarks/bench_doorbell.py --quick --out "$OUT/bench_doorbell.json"
fi
step pytest_cpu 60 python -m pytest -q -p no:cacheprovider tests/pulseio/test_doorbell.py tests/pulseio/test_runtime.py

echo "===== env"; tail -4 "$OUT/env.log" 2>/dev/null
echo "===== gpu tests (failures and summary; full log in $OUT/pytest_gpu.log)"
grep -E "^(FAILED|ERROR)|PASSED|passed|failed|error" "$OUT/pytest_gpu.log" 2>/dev/null | tail -20
grep -E "^E " "$OUT/pytest_gpu.log" 2>/dev/null | head -30
echo "===== cpu tests on this machine"; tail -2 "$OUT/pytest_cpu.log" 2>/dev/null
echo "===== example"; tail -6 "$OUT/example.log" 2>/dev/null
echo "===== bench errors, if any (full log in $OUT/bench.log)"
grep -hE "Error|error|Traceback" "$OUT"/bench*.log 2>/dev/null | head -12
echo "===== steps"; cat "$OUT/steps.txt"
echo "===== bench summary (acceptance: publish->landed 64x8K p50 <= 30 us; doorbell/direct >= 0.9)"
sed -n '/^=== summary/,$p' "$OUT"/bench*.log 2>/dev/null | tail -16
