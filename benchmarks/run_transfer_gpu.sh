#!/usr/bin/env bash
# The transfer core on one GPU: its gpu tests, then `pulseio bench` (JSON + plot + table).
# Run from the repo root; raw output goes under $OUT. The device copy of the tree has no .git: pass
# PULSEIO_GIT_SHA=<commit> so records carry it.
set -u
OUT=${OUT:-benchmarks/results/latest}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv
  python3 -c "import torch, numba, numpy; print('torch', torch.__version__, 'numba', numba.__version__, 'numpy', numpy.__version__)"
  echo "git sha ${PULSEIO_GIT_SHA:-unknown}"; date -u; } | tee "$OUT/transfer_env.txt"
timeout -s ABRT 150 python3 -X faulthandler -m pytest -q -o faulthandler_timeout=60 -m gpu \
  tests/pulseio/test_cuda_transfer.py tests/pulseio/test_kernels_sim.py tests/pulseio/test_cuda_buffer_ring.py -x 2>&1 \
  | tail -40 | tee "$OUT/transfer_gpu_tests.txt"
timeout -s ABRT 300 python3 -X faulthandler -m pulseio.cli bench --no-progress --verbose ${BENCH_ARGS:-} \
  --json "$OUT/bench_transfer.json" --plot "$OUT/bench_transfer.png" 2>&1 | tee "$OUT/bench_transfer.txt"
