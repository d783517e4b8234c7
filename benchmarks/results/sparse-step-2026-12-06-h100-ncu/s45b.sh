# As run in session 45 (call s45b) on tree 35b4f29 with the select and attention changes in the working tree;
# ab/select.patch was the change of 60b1fb4 to select_kernels.py, ab/attn.patch the one of 92979fd to attention/_kernel.py.
# A/B of the working tree's select and attention changes against the tree without them (ab/*.patch), one process
# each, on one machine: bench_fused_selection's select lines and bench_attention's sweep of the sparse shapes.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/meta.txt
SEL="S=8 paged sum,S=1 hot sum steered,S=1 paged sum,S=1 hot max-norm steered"
for side in new old; do
  if [ $side = old ]; then patch -p1 -R < ab/select.patch && patch -p1 -R < ab/attn.patch || { echo "patch failed"; exit 1; }; fi
  timeout 90 python benchmarks/bench_fused_selection.py --context 32800 --parts select --only "$SEL" > $OUT/select-$side.log 2>&1
  mkdir -p $OUT/attn-$side
  timeout 90 python benchmarks/bench_attention.py --budget-s 60 --shapes "quest b8 k128 rows" \
    --out $OUT/attn-$side > $OUT/attn-$side/log.txt 2>&1
  echo "== $side"; grep -E "warps auto" $OUT/select-$side.log
  python - $OUT/attn-$side/bench_attention.jsonl <<'PY'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if "shape" in d and d.get("ok") and (d["prefetch"] or d["tag"] == "heuristic" or d["us"] < 30):
        print(f"{d['shape'][10:34]:24s} {d['tag']:9s} {d['block_n']}/{d['num_warps']}w/{d['num_stages']}st/{d['num_splits']}sp"
              f"{'/pf' if d['prefetch'] else ''} {d['us']:6.1f} us")
PY
  if [ $side = new ]; then   # the changed kernels' GPU tests, on the new code
    timeout 170 python -m pytest -q -rfE -p no:cacheprovider -m gpu tests/pulseio_engine/test_fused_selection.py \
      tests/pulseio_engine/test_attention_gpu.py > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc=$? $(tail -1 $OUT/gpu-tests.log)"
  fi
done
