#!/usr/bin/env bash
# Launches the tasks of a cluster file by hand, one process per task, the
# way you would on several hosts. Every task gets the same training flags.
#
#   scripts/launch.sh CLUSTER.json [--only TASK]... [-- TRAINING FLAGS...]
#
#   scripts/launch.sh scripts/cluster.example.json -- --mode async --epochs 2
#   # on host B of a real cluster, only its own tasks:
#   scripts/launch.sh cluster.json --only ps/1 --only worker/1 -- --mode sync
#
# Logs go to run/launch/<task>.log; the chief's progress and summary go to
# the terminal. The script waits for the chief and stops the rest on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,14p' "$0"; exit 2; }
cluster="$1"; shift
only=()
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "launch.sh: unexpected $1 (training flags go after --)" >&2; exit 2 ;;
  esac
done
bin=bin/pstrain
[ -x "$bin" ] || make build
# Count the tasks with the binary's own parser (python-free): jq may be absent.
nps=$(grep -o '"ps"[^]]*]' "$cluster" | grep -o '"[^"]*:[0-9]*"' | wc -l)
nw=$(grep -o '"worker"[^]]*]' "$cluster" | grep -o '"[^"]*:[0-9]*"' | wc -l)
tasks=(chief)
for ((i = 0; i < nps; i++)); do tasks+=("ps/$i"); done
for ((i = 0; i < nw; i++)); do tasks+=("worker/$i"); done
mkdir -p run/launch
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' INT TERM EXIT
chief_pid=""
for t in "${tasks[@]}"; do
  if [ ${#only[@]} -gt 0 ] && [[ ! " ${only[*]} " == *" $t "* ]]; then continue; fi
  role="${t%%/*}"
  args=("$role" --cluster "$cluster" --ps "$nps" --workers "$nw")
  [ "$role" = chief ] && args+=(--progress --report run/launch/report.json) || args+=(--index "${t#*/}")
  log="run/launch/${t//\//-}.log"
  if [ "$role" = chief ]; then
    "$bin" "${args[@]}" "$@" 2> "$log" &
    chief_pid=$!
  else
    "$bin" "${args[@]}" "$@" > "$log" 2>&1 &
  fi
  pids+=($!)
  echo "started $t (pid $!), log $log" >&2
done
if [ -n "$chief_pid" ]; then
  wait "$chief_pid"
  echo "chief done; report: run/launch/report.json" >&2
fi
wait
