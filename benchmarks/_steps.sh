# Sourced by the run_*_gpu.sh scripts: `step NAME TIMEOUT_S COMMAND...` runs one guarded step, its
# output to $OUT/NAME.log and one status line to $OUT/steps.txt; a failing step never stops the next.
step() {
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  printf '%-11s rc=%-4s %4ss  (%s)\n' "$name" "$rc" "$(( $(date +%s) - start ))" \
    "$([ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "TIMED OUT after ${limit}s" || echo "$OUT/$name.log")" \
    >> "$OUT/steps.txt"
  return 0
}
