#!/usr/bin/env bash
# transformers generate() with each KV cache on one GPU: a Qwen3-8B-shaped model (random bf16 weights), one
# request of 32K tokens, 16 new tokens per mode (default DynamicCache, cache_implementation="offloaded",
# pulseio LayerOffloadCache, pulseio SparseOffloadCache with SoloHead and with Quest, budget 2048).
#   OUT=/tmp/out bash benchmarks/run_transformers_gpu.sh      # ~4 minutes on an H200; results in $OUT
# Env: LIMIT (hard timeout of the bench, s; 420), BENCH_ARGS (more options, e.g. "--new-tokens 16").
# $OUT/bench.log is the printed output (progress lines, the table), $OUT/bench.json every number.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/transformers-bench}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ date -u +%FT%TZ; echo "git ${PULSEIO_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)}"; hostname
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
    --format=csv,noheader
  python -c "import torch, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'transformers', transformers.__version__)"
  free -g | head -2; echo "BENCH_ARGS=${BENCH_ARGS:-}"; } > "$OUT/meta.txt" 2>&1
cat "$OUT/meta.txt"
timeout -k 10 "${LIMIT:-420}" python benchmarks/bench_transformers.py --json "$OUT/bench.json" ${BENCH_ARGS:-} \
  2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}
echo "bench rc=$rc$([ "$rc" = 124 ] || [ "$rc" = 137 ] && echo " (TIMED OUT after ${LIMIT:-420} s)")" | tee -a "$OUT/bench.log"
exit "$rc"
