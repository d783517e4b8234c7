#!/usr/bin/env bash
# Paged decode attention on one GPU: environment, correctness tests, benchmark sweep (< 3 min in all).
#   run from the repo root:  OUT=/some/dir bash benchmarks/run_attention_gpu.sh
# Raw output under $OUT: steps.txt, env.log, pytest.log, pytest.xml, bench.log, bench_attention.log,
# bench_attention.jsonl (one JSON row per config). Every step has its own timeout; a failing step never
# stops the later ones. The last thing printed is the step table and the benchmark summary.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/attention_gpu_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
: > "$OUT/steps.txt"

source benchmarks/_steps.sh

step env 20 bash -c 'nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv;
  python -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__,
  torch.cuda.get_device_name(0))"'
step pytest 75 python -m pytest -v -rfE -p no:cacheprovider --durations=8 --junitxml="$OUT/pytest.xml" \
  tests/pulseio_engine/test_attention_gpu.py tests/pulseio_engine/test_attention_reference.py \
  tests/pulseio_engine/test_attention_config.py tests/pulseio_engine/test_attention_triton_interpret.py
step bench 95 python benchmarks/bench_attention.py --budget-s 72 --out "$OUT"

echo "===== env"; cat "$OUT/env.log" 2>/dev/null | tail -4
echo "===== pytest (failures and summary; full log in $OUT/pytest.log)"
grep -E "^(FAILED|ERROR)|passed|failed|error" "$OUT/pytest.log" 2>/dev/null | tail -30
echo "===== bench (every config; full log in $OUT/bench.log)"
sed -n '/^SUMMARY/q;p' "$OUT/bench.log" 2>/dev/null | tail -150
echo "===== steps"; cat "$OUT/steps.txt"
sed -n '/^SUMMARY/,$p' "$OUT/bench.log" 2>/dev/null
