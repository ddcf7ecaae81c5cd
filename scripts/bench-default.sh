#!/usr/bin/env bash
# Runs the default `make run` cluster N times in a row (default 3), with
# any extra `pstrain run` flags, and prints the BENCHMARKS.md table from
# the run reports: time to the held target, the handed-back model's step
# and accuracy, the last three evaluations, the chief's CPU against the
# workers', and each process's peak RSS and CPU seconds.
#
#   scripts/bench-default.sh 10              # the default run
#   scripts/bench-default.sh 10 --lr 0.1     # the same at lr 0.1
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-3}"
shift || true
make -s build data >/dev/null
out=run/bench
rm -rf "$out"; mkdir -p "$out"
for i in $(seq 1 "$n"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  start=$(date +%s.%N)
  bin/pstrain run --report "$out/default-$i.json" --run-dir "$out/run" --sd-dir "" "$@" >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$start $end $load" > "$out/default-$i.wall"
done
go run ./lab/benchtable "$out" "$n"
