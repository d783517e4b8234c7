#!/usr/bin/env bash
# A/B of pulseio variants on one GPU, in rounds (variants alternate, so the link's drift hits them alike):
# one layer's recall alone (`bench_doorbell.py --recall`, resident route), then, with ENGINE=1, the sparse
# engine bench. A variant is a folder holding a `pulseio/` package (carried from a branch, say
# `git archive BRANCH pulseio | tar x -C stage/NAME`), or "." for this tree.
#   VARIANTS=". stage/mirror stage/pieces" ROUNDS=2 [CTAS="64 52"] [ENGINE=1] bash benchmarks/run_recall_ab_gpu.sh
# Env: RECALL (104x65536: a 32K layer of qwen3-14b at budget 2048), CTAS (the copy CTA budgets to try, default
# 64), ALONE (0: skip the recall alone), CONFIGS (engine: 8x32768), R (work folder). Results: $OUT/recall-ab.tgz and a table on stdout.
set -u
R=${R:-/tmp/recall-ab}; rm -rf "$R"; mkdir -p "$R"
VARIANTS=${VARIANTS:-.}; ROUNDS=${ROUNDS:-2}; RECALL=${RECALL:-104x65536}; CTAS=${CTAS:-64}
CONFIGS=${CONFIGS:-8x32768}; ENGINE=${ENGINE:-0}; ALONE=${ALONE:-1}
export PYTHONUNBUFFERED=1
{ date -u +%FT%TZ; echo "git ${PULSEIO_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)}"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "VARIANTS=$VARIANTS ROUNDS=$ROUNDS RECALL=$RECALL CTAS=$CTAS ALONE=$ALONE ENGINE=$ENGINE CONFIGS=$CONFIGS"; } > "$R/meta.txt" 2>&1
finish() { mkdir -p "${OUT:-/tmp}" && tar czf "${OUT:-/tmp}/recall-ab.tgz" --exclude='./tree*' -C "$R" . ; }
trap finish EXIT

i=0
for v in $VARIANTS; do  # each variant: a copy of this tree with its pulseio/
  i=$((i + 1)); tree=$R/tree$i; mkdir -p "$tree"
  tar cf - --exclude=./stage --exclude=./.git --exclude=./.whl . | tar xf - -C "$tree"
  if [ "$v" != . ]; then rm -rf "$tree/pulseio"; cp -r "$v/pulseio" "$tree/pulseio"; fi
  echo "tree$i = $v" >> "$R/meta.txt"
done

for round in $(seq 1 "$ROUNDS"); do
  i=0
  for v in $VARIANTS; do
    i=$((i + 1))
    for ctas in $([ "$ALONE" = 1 ] && echo "$CTAS"); do
      name=v$i-ctas$ctas-r$round
      (cd "$R/tree$i" && PYTHONPATH=$PWD timeout 240 python benchmarks/bench_doorbell.py --quick --strategies resident \
         --recall "$RECALL" --ctas "$ctas" --out "$R/$name.json") > "$R/$name.log" 2>&1
      echo "$name ($v) rc=$?" | tee -a "$R/progress.log"
    done
    if [ "$ENGINE" = 1 ]; then
      for cfg in $CONFIGS; do
        b=${cfg%x*}; ctx=${cfg#*x}; name=v$i-engine-$cfg-r$round
        (cd "$R/tree$i" && PYTHONPATH=$PWD timeout 300 python -m pulseio_engine.cli bench --model qwen3-14b \
           --mode offload-doorbell --selection solohead --batch-size "$b" --context-len "$ctx" --token-budget 2048 \
           --steps 20 --warmup 3 --json "$R/$name.json") > "$R/$name.log" 2>&1
        echo "$name ($v) rc=$? $(tail -1 "$R/$name.log" | cut -c1-300)" | tee -a "$R/progress.log"
      done
    fi
  done
done

python - "$R" <<'EOF'
import glob, json, os, sys
r = sys.argv[1]
print(f"{'run':<24} {'pickup p50 us':>14} {'copy GB/s p50':>14} {'publish->landed GB/s p50':>25}")
for path in sorted(glob.glob(os.path.join(r, "v*-ctas*.json"))):
    lat = json.load(open(path)).get("latency_resident", {})
    if "copy_gbps" not in lat:
        print(f"{os.path.basename(path)[:-5]:<24} no resident stamps ({str(lat.get('error', ''))[-80:]})")
        continue
    print(f"{os.path.basename(path)[:-5]:<24} {lat['publish_to_task_taken_us']['p50']:>14.1f} "
          f"{lat['copy_gbps']['p50']:>14.1f} {lat['publish_to_task_landed_gbps']['p50']:>25.1f}")
for path in sorted(glob.glob(os.path.join(r, "v*-engine-*.json"))):
    d = json.load(open(path))
    print(f"{os.path.basename(path)[:-5]:<24} publish->landed {d['publish_fraction_of_peak']:.3f} of "
          f"{d['link_peak_gbps']:.1f} GB/s, {d['publish_to_landed_us']:.0f} us a request, pickup p50 "
          f"{d['publish_to_taken_us_p50']:.1f} us, copy {d['copy_fraction_of_peak']:.3f}")
EOF
