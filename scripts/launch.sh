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
# Like `pstrain run`: checkpoints go to run/launch/checkpoints (the chief and
# every PS must share it: on several hosts pass a shared --checkpoint-dir
# after --), the report to run/launch/report.json, logs to
# run/launch/<task>.log; the chief's progress and summary go to the
# terminal. PSTRAIN_BIN (bin/pstrain) and LAUNCH_DIR (run/launch) change
# the binary and that directory. --ps and --workers come from the cluster
# file, and so do the hot standbys: a "standby" list (one address per ps,
# or none) starts standby/N beside every ps/N (--ps-replicas 1 follows from
# it; PS_REPLICAS=0 or 1 states it, checked against the file). Every task gets the run's secret, run/launch/auth-token (made if
# missing; PSTRAIN_AUTH_TOKEN_FILE names another): on several hosts, copy
# the same file to each. Ctrl-C (or SIGTERM) stops the run cleanly: the
# chief stops the workers, writes a final checkpoint and the report, and
# the script exits 130 (143); a second Ctrl-C kills every task at once.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,24p' "$0"; exit 2; }
cluster="$1"; shift
only=()
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "launch.sh: unexpected $1 (training flags go after --)" >&2; exit 2 ;;
  esac
done
bin="${PSTRAIN_BIN:-bin/pstrain}"
dir="${LAUNCH_DIR:-run/launch}"
[ -x "$bin" ] || make build
# Count the tasks (python-free: jq may be absent).
nps=$(grep -o '"ps"[^]]*]' "$cluster" | grep -o '"[^"]*:[0-9]*"' | wc -l)
nw=$(grep -o '"worker"[^]]*]' "$cluster" | grep -o '"[^"]*:[0-9]*"' | wc -l)
nsb=$(grep -o '"standby"[^]]*]' "$cluster" | grep -o '"[^"]*:[0-9]*"' | wc -l || true)
replicas=0
[ "$nsb" -eq 0 ] || replicas=1
if [ -n "${PS_REPLICAS:-}" ] && [ "$PS_REPLICAS" != "$replicas" ]; then
  echo "launch.sh: PS_REPLICAS=$PS_REPLICAS but $cluster lists $nsb standby addresses (want one per ps for 1, none for 0)" >&2
  exit 2
fi
tasks=(chief)
for ((i = 0; i < nps; i++)); do tasks+=("ps/$i"); done
for ((i = 0; i < nsb; i++)); do tasks+=("standby/$i"); done
for ((i = 0; i < nw; i++)); do tasks+=("worker/$i"); done
mkdir -p "$dir"
token="${PSTRAIN_AUTH_TOKEN_FILE:-$dir/auth-token}"
[ -f "$token" ] || "$bin" token "$token" >&2
pids=()
chief_pid=""
status=0
# Each task runs in its own session (setsid), so a Ctrl-C at the terminal
# reaches only this script, which asks the chief to stop the run in order.
on_signal() {
  status=$1
  if [ -z "$chief_pid" ]; then
    # No chief on this host (--only): stop the local tasks.
    [ ${#pids[@]} -eq 0 ] || kill -TERM "${pids[@]}" 2>/dev/null || true
    exit "$status"
  fi
  if [ -n "${stopping:-}" ]; then
    echo "launch.sh: stopping at once" >&2
    kill -KILL "${pids[@]}" 2>/dev/null || true
    exit "$status"
  fi
  stopping=1
  echo "launch.sh: stopping the run cleanly (Ctrl-C again to stop at once)" >&2
  kill -TERM "$chief_pid" 2>/dev/null || true
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
# As `pstrain run` does (launcher/env.go): the tasks started on this host
# share its cores, one Go thread each unless GOMAXPROCS says otherwise.
if [ -z "${GOMAXPROCS:-}" ]; then
  n=${#tasks[@]}
  [ ${#only[@]} -gt 0 ] && n=${#only[@]}
  procs=$(( $(nproc) / n ))
  export GOMAXPROCS=$(( procs > 0 ? procs : 1 ))
fi
# And with 1 ms of timer slack (`pstrain run --timer-slack`): Linux keeps
# it for the processes this shell starts. Where it cannot be set, the
# kernel's default stays.
echo 1000000 2>/dev/null >/proc/self/timerslack_ns || true
for t in "${tasks[@]}"; do
  if [ ${#only[@]} -gt 0 ] && [[ ! " ${only[*]} " == *" $t "* ]]; then continue; fi
  role="${t%%/*}"
  args=("$role" --cluster "$cluster" --auth-token-file "$token")
  case "$role" in
    chief) args+=(--progress --report "$dir/report.json" --checkpoint-dir "$dir/checkpoints") ;;
    ps | standby) args+=(--index "${t#*/}" --checkpoint-dir "$dir/checkpoints") ;;
    *) args+=(--index "${t#*/}") ;;
  esac
  log="$dir/${t//\//-}.log"
  if [ "$role" = chief ]; then
    setsid "$bin" "${args[@]}" "$@" 2> "$log" &
    chief_pid=$!
  else
    setsid "$bin" "${args[@]}" "$@" > "$log" 2>&1 &
  fi
  pids+=($!)
  echo "started $t (pid $!), log $log" >&2
done
if [ -n "$chief_pid" ]; then
  # wait returns early when a trapped signal arrives: wait again until the
  # chief has really exited.
  code=0
  wait "$chief_pid" || code=$?
  while kill -0 "$chief_pid" 2>/dev/null; do code=0; wait "$chief_pid" || code=$?; done
  [ "$status" != 0 ] || status=$code
  echo "chief done (exit $code); report: $dir/report.json" >&2
fi
wait || true
exit "$status"
