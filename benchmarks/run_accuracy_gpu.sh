#!/usr/bin/env bash
# Accuracy table (issue 14) on the device machine: one model, its contexts, every task x mode x budget.
#   1. put the staged model into the cache (benchmarks/stage_model.py; carry its sets first, one per call)
#   2. calibrate the retrieval heads, unless HEADS names a heads file
#   3. `pulseio-engine eval-table` (model loaded once, one engine per context x mode x budget, every task's
#      samples batched together), progress on the terminal, resumable: run it again and it continues
#   4. header.txt (device, date, git sha, settings), then everything tarred into $OUT/accuracy.tgz
#      (+ $OUT/table.md to read at once): the device brings back at most 8 files, so the work folder
#      ($WORK, default /root/accuracy-$MODEL, kept while the machine stays warm) lies outside $OUT.
#
#   The device image has no `gguf` package: carry its wheel too (here: python3 -m pip download --no-deps
#   --only-binary=:all: -d .whl gguf==0.19.0, with .whl in .git/info/exclude) and start the command with
#   `python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site;`.
#   A call's carry replaces the last call's carried paths there: `put` keeps each set's chunks outside the
#   tree (/root/stage), so carry one set per call, back to back, while the machine stays warm (30 s).
#
#   OUT=/some/dir MODEL=smollm2 CONTEXTS=2048,4096,8192 bash benchmarks/run_accuracy_gpu.sh
#   OUT=/some/dir MODEL=qwen2.5-coder-0.5b CONTEXTS=8192,16384 bash benchmarks/run_accuracy_gpu.sh
# A smoke slice first, in its own work folder (table.md shows every record of its folder):
#   WORK=/root/smoke CONTEXTS=2048 TASKS=niah-single SAMPLES=4 BUDGETS=512 OUT=... bash benchmarks/run_accuracy_gpu.sh
# CPU fallback (a small slice, here): DEVICE=cpu CONTEXTS=1024 TASKS=niah-single SAMPLES=4 BUDGETS=256 \
#   MODES=vanilla,quest OUT=/tmp/acc bash benchmarks/run_accuracy_gpu.sh
#
# Settings (environment): MODEL (smollm2), CONTEXTS (2048,4096,8192), TASKS (all five), MODES (all four),
# BUDGETS (512,1024,2048), GROUP_SCORE (the sparse modes' group rule; default: the engine's), SAMPLES (20),
# BATCH (default: every request of an engine, as memory allows),
# HEADS (a heads.json; default: calibrate), DEVICE (cuda), STAGE (folder of carried sets, default stage),
# TABLE_LIMIT_S (the eval-table run's limit; default: what is left of 540 s, so the tarball is written inside
# a 10-minute call),
# CAL_LIMIT_S (180), WORK (the work folder), PULSEIO_GIT_SHA (else `git rev-parse HEAD`), SHARDS (1: one eval-table
# process; N: N processes, process i on GPU i with --shard i/N, all into $WORK: the cells run N at a time),
# SHARD_LIST (which of those shards this run starts, default all: "1" runs shard 1/N alone, so another run
# can take shard 0 later), SHARD_GPUS (the GPU of each of SHARD_LIST, default the shard's own index).
# Several processes split the host's available memory between them (PULSEIO_MEMORY_LIMIT, unless it is set);
# another run started beside them sees only what they left.
set -u
cd "$(dirname "$0")/.." || exit 1
MODEL=${MODEL:-smollm2}
CONTEXTS=${CONTEXTS:-2048,4096,8192}
TASKS=${TASKS:-niah-single,niah-multikey,variable-tracking,common-words,perplexity}
MODES=${MODES:-vanilla,quest,solohead,solohead-reversed}
BUDGETS=${BUDGETS:-512,1024,2048}
SAMPLES=${SAMPLES:-20}
DEVICE=${DEVICE:-cuda}
STAGE=${STAGE:-stage}
OUT=${OUT:-$PWD/accuracy_out}
WORK=${WORK:-/root/accuracy-$MODEL}
[ -w "$(dirname "$WORK")" ] || WORK=${TMPDIR:-/tmp}/accuracy-$MODEL
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
START=$(date +%s)
say() { printf '[%4ss] %s\n' "$(( $(date +%s) - START ))" "$*" | tee -a "$WORK/progress.log"; }
pack() {
  cp "$WORK/table.md" "$OUT/table.md" 2>/dev/null
  tar czf "$OUT/accuracy.tgz" -C "$(dirname "$WORK")" "$(basename "$WORK")" && say "wrote $OUT/accuracy.tgz"
}
trap pack EXIT

{
  echo "date:    $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "git:     ${PULSEIO_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  if [ "$DEVICE" = cpu ]; then
    echo "device:  cpu, $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  else
    echo "device:  $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
  fi
  python -c "import sys, torch; print('python: ', sys.version.split()[0], ' torch', torch.__version__)" 2>&1
  echo "model:   $MODEL  contexts $CONTEXTS  samples $SAMPLES  batch ${BATCH:-all}"
  echo "tasks:   $TASKS"
  echo "modes:   $MODES  budgets $BUDGETS  group score ${GROUP_SCORE:-default}  heads ${HEADS:-calibrated here}"
} > "$WORK/header.txt"
cat "$WORK/header.txt"

say "stage: put $MODEL from $STAGE/$MODEL into the cache"
python benchmarks/stage_model.py put "$MODEL" "$STAGE" 2>&1 | tee -a "$WORK/stage.log"
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then
  say "the model is not in the cache yet (stage_model.py put: exit $rc); carry the missing sets, then run again"
  exit 1
fi

if [ -z "${HEADS:-}" ]; then
  HEADS=$WORK/heads_$MODEL.json
  if [ -s "$HEADS" ]; then
    say "heads: $HEADS from an earlier run"
  else
    say "heads: calibrating $MODEL (8 prompts of 512 tokens of the calibration text, not eval data)"
    timeout -k 5 "${CAL_LIMIT_S:-180}" python -m pulseio_engine.cli calibrate --model "$MODEL" --out "$HEADS" --prompts 8 \
      --prompt-len 512 --device "$DEVICE" > "$WORK/calibrate.log" 2>&1
    rc=$?
    tail -3 "$WORK/calibrate.log"
    [ "$rc" = 0 ] || { say "calibration failed (exit $rc); see calibrate.log"; exit 1; }
  fi
else
  cp "$HEADS" "$WORK/" && HEADS=$WORK/$(basename "$HEADS")
fi

TABLE_LIMIT_S=${TABLE_LIMIT_S:-$(( 540 - ($(date +%s) - START) ))}   # the whole call within 9 minutes
SHARDS=${SHARDS:-1}
say "eval-table: $MODEL at $CONTEXTS on $DEVICE, $SHARDS shard(s) (limit ${TABLE_LIMIT_S}s; records in $WORK)"
table() {  # $1: shard index, $2: its GPU; one eval-table process, on GPU $2 when sharded
  ${SHARDED:+env CUDA_VISIBLE_DEVICES=$2} timeout -k 10 "$TABLE_LIMIT_S" python -m pulseio_engine.cli eval-table \
    --model "$MODEL" --context-len "$CONTEXTS" --task "$TASKS" --mode "$MODES" --token-budget "$BUDGETS" \
    --samples "$SAMPLES" --heads "$HEADS" --device "$DEVICE" --out "$WORK" --resume --shard "$1/$SHARDS" \
    ${BATCH:+--batch "$BATCH"} ${GROUP_SCORE:+--group-score "$GROUP_SCORE"} > "$WORK/eval_table.$START.$1.log" 2>&1
}
[ "$SHARDS" -gt 1 ] && SHARDED=1
SHARD_LIST=${SHARD_LIST:-$(seq -s ' ' 0 $((SHARDS - 1)))}
shards=(${SHARD_LIST//,/ }); gpus=(${SHARD_GPUS:-${SHARD_LIST}}); gpus=(${gpus[@]//,/ })
if [ "${#shards[@]}" -gt 1 ] && [ -z "${PULSEIO_MEMORY_LIMIT:-}" ]; then
  # each process sizes its batch from the memory it sees free (half of it): started together, they would
  # all see the same free memory and ask for more than the machine has (seen: a shard killed by the kernel)
  export PULSEIO_MEMORY_LIMIT=$(( $(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) / ${#shards[@]} ))K
  say "${#shards[@]} processes share this machine: each sizes its batch within PULSEIO_MEMORY_LIMIT=$PULSEIO_MEMORY_LIMIT"
fi
pids=()
for k in "${!shards[@]}"; do table "${shards[$k]}" "${gpus[$k]}" & pids+=($!); done
rc=0
for k in "${!pids[@]}"; do
  wait "${pids[$k]}"; r=$?
  tr '\r' '\n' < "$WORK/eval_table.$START.${shards[$k]}.log" | grep -E '^\[' | tail -n 40
  [ "$r" -gt "$rc" ] && rc=$r
done
case $rc in
  0) say "eval-table done" ;;
  124|137) say "eval-table stopped at ${TABLE_LIMIT_S}s: the finished cells are kept; run again to continue" ;;
  *) say "eval-table failed (exit $rc); see eval_table.$START.*.log" ;;
esac
[ -s "$WORK/table.md" ] && cat "$WORK/table.md"
exit "$rc"
