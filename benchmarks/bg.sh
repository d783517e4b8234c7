#!/usr/bin/env bash
# Background jobs on the device machine, so that one call can start work that later calls (staging a model,
# say) go on beside: each job runs in its own process session (which outlives the call that started it,
# while the machine stays warm), from a snapshot of the tree taken at `start` (later calls may carry
# another tree), with its output in $BG/NAME.log and its exit status in $BG/NAME.rc.
#   bash benchmarks/bg.sh start NAME [after=NAME1,NAME2] -- COMMAND...   (after: start once those ended)
#   bash benchmarks/bg.sh status     one line per job: running / rc, seconds, its last line
#   bash benchmarks/bg.sh wait NAME LIMIT_S    wait for a job (exit 0 if it ended with rc 0)
set -u
BG=${BG:-/root/bg}
mkdir -p "$BG"
case ${1:-} in
  start)
    name=$2; shift 2
    after=""
    if [[ ${1:-} == after=* ]]; then after=${1#after=}; shift; fi
    [ "${1:-}" = "--" ] && shift
    snap=$BG/$name.tree; rm -rf "$snap"; mkdir -p "$snap"
    tar cf - --exclude=./stage --exclude=./.whl --exclude=./.git . | tar xf - -C "$snap"
    printf '%q ' "$@" > "$BG/$name.cmd"
    rm -f "$BG/$name.rc"; date +%s > "$BG/$name.start"
    setsid bash -c '
      name=$1 after=$2 snap=$3 BG=$4; shift 4
      for dep in ${after//,/ }; do while [ ! -e "$BG/$dep.rc" ]; do sleep 1; done; done
      date +%s > "$BG/$name.start"
      cd "$snap" && "$@" > "$BG/$name.log" 2>&1; echo $? > "$BG/$name.rc"
    ' _ "$name" "$after" "$snap" "$BG" "$@" < /dev/null > /dev/null 2>&1 &
    echo "started $name${after:+ (after $after)}: $*"
    ;;
  status)
    now=$(date +%s)
    for cmd in "$BG"/*.cmd; do
      [ -e "$cmd" ] || continue
      name=$(basename "$cmd" .cmd); start=$(cat "$BG/$name.start" 2>/dev/null || echo "$now")
      state=$([ -e "$BG/$name.rc" ] && echo "rc=$(cat "$BG/$name.rc")" || echo running)
      last=""; [ -e "$BG/$name.log" ] && last=$(tr '\r' '\n' < "$BG/$name.log" | grep -v '^\s*$' | tail -1 | cut -c1-150)
      printf '%-14s %-8s %5ss  %s\n' "$name" "$state" "$(( now - start ))" "$last"
    done
    ;;
  wait)
    name=$2; limit=$3; t=0
    while [ ! -e "$BG/$name.rc" ] && [ "$t" -lt "$limit" ]; do sleep 1; t=$((t + 1)); done
    [ -e "$BG/$name.rc" ] && [ "$(cat "$BG/$name.rc")" = 0 ]
    ;;
  *) sed -n 2,9p "$0"; exit 2 ;;
esac
