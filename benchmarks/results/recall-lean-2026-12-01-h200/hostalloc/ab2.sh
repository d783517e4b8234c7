#!/usr/bin/env bash
set -u
mkdir -p /root/ab2out
( cd /root/t2 && PYTHONPATH=/root/t2 timeout 120 python stage/pin_time.py main ) > /root/ab2out/pin-main.log 2>&1
T=/root/t2h; rm -rf $T; mkdir -p $T; tar cf - --exclude=./stage --exclude=./.git . | tar xf - -C $T; rm -rf $T/pulseio; cp -r stage/hostalloc/pulseio $T/; cp stage/pin_time.py $T/
( cd $T && PYTHONPATH=$T timeout 120 python pin_time.py hostalloc ) > /root/ab2out/pin-hostalloc.log 2>&1
echo "pin done" >> /root/ab2out/progress.log
PULSEIO_GIT_SHA=51d3793 VARIANTS=". stage/hostalloc stage/both" ROUNDS=1 ENGINE=1 ALONE=0 R=/root/ab2 OUT=/root/ab2out bash benchmarks/run_recall_ab_gpu.sh > /root/ab2out/ab.log 2>&1
echo "== end" >> /root/ab2out/progress.log
