#!/usr/bin/env bash
# bench_doorbell latency of small recalls (64 KiB blocks, 16 copy CTAs, resident), tree then with unroll8.patch
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PULSEIO_GIT_SHA=$1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/meta.txt; date -u >> $OUT/meta.txt
for v in tree unroll8; do
  [ $v = unroll8 ] && patch -p1 -s < .devrun/unroll8.patch
  for n in 4 12 32; do
    timeout 120 python benchmarks/bench_doorbell.py --quick --strategies resident --ctas 16 --recall ${n}x65536 \
      --out $OUT/door-$v-$n.json > $OUT/door-$v-$n.log 2>&1
    echo "$v $n rc=$? $(grep -E "publish->" $OUT/door-$v-$n.log | tr -s ' ' | tr '\n' ' ')"
  done
done
patch -p1 -R -s < .devrun/unroll8.patch
