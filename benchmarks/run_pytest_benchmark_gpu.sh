#!/usr/bin/env bash
# The pytest-benchmark suite's GPU rows (tests/pulseio/test_transfer_benchmarks.py): every strategy,
# 64 / 512 / 4096 blocks of 8 and 64 KiB, one transfer at a time (submit -> wait), bytes checked.
# Raw output under $OUT: pytest_benchmark.txt (tables grouped by block size and count) and .json.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/pytest_benchmark_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{ nvidia-smi --query-gpu=name,driver_version --format=csv; date -u; echo "sha ${PULSEIO_GIT_SHA:-unknown}"; } > "$OUT/env.txt"
timeout -s ABRT 250 python -m pytest tests/pulseio/test_transfer_benchmarks.py -m gpu -p no:cacheprovider \
  --benchmark-enable --benchmark-group-by=param:block_bytes,param:count --benchmark-columns=min,median,mean,rounds \
  --benchmark-json="$OUT/pytest_benchmark.json" -q > "$OUT/pytest_benchmark.txt" 2>&1
echo "rc=$?"
grep -E "passed|failed|error" "$OUT/pytest_benchmark.txt" | tail -3
