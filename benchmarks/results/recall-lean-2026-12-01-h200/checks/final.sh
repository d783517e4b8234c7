#!/usr/bin/env bash
set -u
export PULSEIO_GIT_SHA=efbdf67
mkdir -p /root/fout
R=/root/fr-tests OUT=/root/fout/tests PARTS=tests bash benchmarks/run_sparse_gpu.sh > /root/fout/tests.out 2>&1
echo "tests done" >> /root/fout/progress.log
OUT=/root/fout/never QUICK=1 PARTS="sanitize" bash benchmarks/run_never_hangs_gpu.sh > /root/fout/never.out 2>&1
echo "sanitize done" >> /root/fout/progress.log
R=/root/fr-bench OUT=/root/fout/bench PARTS=bench CONFIGS=8x32768 SPECS=offload-doorbell:solohead bash benchmarks/run_sparse_gpu.sh > /root/fout/bench.out 2>&1
echo "== end" >> /root/fout/progress.log
