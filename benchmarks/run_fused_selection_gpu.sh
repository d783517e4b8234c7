#!/usr/bin/env bash
# The fused selection kernels on one GPU: environment, correctness tests, memcheck, benchmark (< 6 min in all).
#   run from the repo root:  OUT=/some/dir bash benchmarks/run_fused_selection_gpu.sh
# Raw output under $OUT: steps.txt and one log per step. Every step has its own timeout; a failing step
# never stops the later ones. The last thing printed is the step table.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/fused_selection_gpu_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
: > "$OUT/steps.txt"

source benchmarks/_steps.sh

step env 20 bash -c 'nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv;
  python -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__,
  torch.cuda.get_device_name(0))"'
step pytest 150 python -m pytest -v -rfE -p no:cacheprovider --durations=8 -m gpu \
  tests/pulseio_engine/test_fused_selection.py
step memcheck 150 bash -c 'command -v compute-sanitizer >/dev/null || { echo "no compute-sanitizer"; exit 0; };
  compute-sanitizer --tool memcheck --error-exitcode 3 python -m pytest -q -p no:cacheprovider -m gpu \
    tests/pulseio_engine/test_fused_selection.py -k "kernels_match and not qwen3"'
step bench 120 python benchmarks/bench_fused_selection.py

echo "===== env"; tail -4 "$OUT/env.log" 2>/dev/null
echo "===== pytest (failures and summary; full log in $OUT/pytest.log)"
grep -E "^(FAILED|ERROR)|passed|failed|error" "$OUT/pytest.log" 2>/dev/null | tail -30
echo "===== memcheck"; grep -E "ERROR SUMMARY|passed|failed|no compute-sanitizer" "$OUT/memcheck.log" 2>/dev/null | tail -5
echo "===== bench"; cat "$OUT/bench.log" 2>/dev/null | tail -80
echo "===== steps"; cat "$OUT/steps.txt"
