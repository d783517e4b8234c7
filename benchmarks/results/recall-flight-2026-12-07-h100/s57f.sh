#!/usr/bin/env bash
# small recalls from a 48 GiB pinned pool of 4 KiB pages and of transparent huge pages (thp.patch, PULSEIO_THP=1),
set -u
patch -p1 -s < .devrun/thp.patch
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PULSEIO_GIT_SHA=$1
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; cat /sys/kernel/mm/transparent_hugepage/enabled \
  /sys/kernel/mm/transparent_hugepage/defrag) > $OUT/meta.txt
for v in 0 1; do
  (sleep 30; grep -E "AnonHugePages|MemFree" /proc/meminfo > $OUT/meminfo-thp$v.txt) &
  PULSEIO_THP=$v timeout 120 python -m pulseio.cli bench --block-sizes 65536 --counts 4,12,32,2048 --strategies resident \
    --directions h2d --zero-copy-ctas 16 --no-load --no-progress --verbose --host-pool-bytes 51539607552 \
    --json $OUT/bench-thp$v.json --plot /tmp/p$v.png > $OUT/bench-thp$v.log 2>&1
  echo "thp=$v rc=$? $(grep -E '^recall resident' $OUT/bench-thp$v.log | tr -s ' ' | tr '\n' ';')"
  wait
done
patch -p1 -R -s < .devrun/thp.patch
