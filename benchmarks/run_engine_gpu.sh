#!/usr/bin/env bash
# Decode engine (issue 4) on one H200: environment, vanilla decode vs the HBM roofline (qwen3-14b at
# 64 x 4K and 16 x 32K, plus an eager run if time allows), then the engine's gpu-marked tests.
# Under 6 minutes in all: every step has its own timeout and a failing step never stops the later ones.
#   run from the repo root:  OUT=/some/dir PYTHONPATH=. bash benchmarks/run_engine_gpu.sh
# Raw output under $OUT: steps.txt, env.log, bench.log, decode/*.json|*.log|summary.md, pytest.log, pytest.xml.
# The last thing printed is the summary: env, pytest result, benchmark table, step table.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/engine_gpu_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
: > "$OUT/steps.txt"

source benchmarks/_steps.sh

step env 30 bash -c 'nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm,clocks.max.mem --format=csv;
  python -c "import sys, torch, triton, transformers; print(sys.version.split()[0], \"torch\", torch.__version__,
  \"triton\", triton.__version__, \"transformers\", transformers.__version__, torch.cuda.get_device_name(0))"'
# acceptance first; one subprocess per config; no new run starts after 200 s
step bench 215 python benchmarks/bench_decode.py --model qwen3-14b --configs 64x4096,16x32768 --steps 100 \
  --eager-too --timeout-s 150 --budget-s 200 --out "$OUT/decode"
step pytest 110 python -m pytest -v -rfE -p no:cacheprovider --durations=8 --junitxml="$OUT/pytest.xml" \
  tests/pulseio_engine/test_engine_gpu.py

echo "===== env"; tail -4 "$OUT/env.log" 2>/dev/null
echo "===== pytest (failures and summary; full log in $OUT/pytest.log)"
grep -E "^(FAILED|ERROR)|passed|failed|skipped|error" "$OUT/pytest.log" 2>/dev/null | tail -20
echo "===== bench errors, if any (per-run logs in $OUT/decode/)"
grep -hE "Error|error|TIMED OUT" "$OUT"/decode/*.log 2>/dev/null | grep -v "compile_error: None" | tail -12
echo "===== steps"; cat "$OUT/steps.txt"
echo "===== decode vs HBM roofline (acceptance: ratio <= 1.25 for both qwen3-14b rows)"
sed -n '/^SUMMARY/,$p' "$OUT/bench.log" 2>/dev/null
