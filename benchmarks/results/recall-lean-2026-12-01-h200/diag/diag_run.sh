#!/usr/bin/env bash
# diag: per-CTA early-copy stamps, engine 8x32K and one recall alone; SM clock / power while the engine runs
set -u
T=/root/tdiag; rm -rf $T; mkdir -p $T/out; tar cf - --exclude=./stage --exclude=./.git . | tar xf - -C $T
rm -rf $T/pulseio; cp -r stage/diag/pulseio $T/pulseio; cd $T
export PYTHONPATH=$T PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 200 > out/smi-engine.csv &
SMI=$!
PULSEIO_DIAG=$T/out/engine timeout 300 python -m pulseio_engine.cli bench --model qwen3-14b --mode offload-doorbell \
  --selection solohead --batch-size 8 --context-len 32768 --token-budget 2048 --steps 20 --warmup 3 --json out/engine.json > out/engine.log 2>&1
echo "engine rc=$?" >> out/progress.log
kill $SMI
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw --format=csv -lms 200 > out/smi-alone.csv &
SMI=$!
PULSEIO_DIAG=$T/out/alone timeout 240 python benchmarks/bench_doorbell.py --quick --strategies resident --recall 104x65536 --out out/alone.json > out/alone.log 2>&1
echo "alone rc=$?" >> out/progress.log
kill $SMI
echo "== end" >> out/progress.log
