#!/usr/bin/env bash
# The transfer core on one GPU: its gpu tests, then `pulseio bench` (JSON + plot) and a CTA sweep
# of the zero-copy kernel, then the per-stage diagnostics. Run from the repo root; raw output goes under
# $OUT. The device copy of the tree has no .git: pass PULSEIO_GIT_SHA=<commit> so records carry it.
set -u
OUT=${OUT:-benchmarks/results/latest}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv | tee "$OUT/transfer_env.txt"
python3 -c "import torch, numba, numpy; print('torch', torch.__version__, 'numba', numba.__version__, 'numpy', numpy.__version__)" | tee -a "$OUT/transfer_env.txt"
timeout -s ABRT 150 python3 -X faulthandler -m pytest -q -m gpu tests/pulseio/test_cuda_transfer.py tests/pulseio/test_kernels_sim.py -x 2>&1 | tail -40 | tee "$OUT/transfer_gpu_tests.txt"
timeout -s ABRT 240 python3 -X faulthandler -m pulseio.cli bench --no-progress --verbose --json "$OUT/bench_transfer.json" --plot "$OUT/bench_transfer.png" 2>&1 | tee "$OUT/bench_transfer.txt"
for ctas in 132; do
  echo "== zero-copy CTA budget $ctas"
  timeout -s ABRT 45 python3 -X faulthandler -m pulseio.cli bench --no-progress --no-load --strategies zero_copy --directions h2d \
    --block-sizes 8192 --counts 64,512,4096 --peak-max-bytes 268435456 --zero-copy-ctas $ctas 2>&1 | grep -A6 "H2D 8 KiB"
done 2>&1 | tee "$OUT/bench_ctas.txt"
timeout -s ABRT 90 python3 -X faulthandler benchmarks/diag_transfer.py --json "$OUT/diag_transfer.json" 2>&1 \
  | grep -v "pinning" | tee "$OUT/diag_transfer.txt"
