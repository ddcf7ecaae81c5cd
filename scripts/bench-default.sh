#!/usr/bin/env bash
# Runs the default `make run` cluster N times (default 3) and prints, per
# run: time to 97.5% (first step to the first evaluation at or above it),
# whole-run wall time, samples/s, and each process's peak RSS and CPU
# seconds, from the run reports. Used for BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-3}"
make -s build data >/dev/null
mkdir -p run/bench
for i in $(seq 1 "$n"); do
  start=$(date +%s.%N)
  bin/pstrain run --report "run/bench/default-$i.json" --run-dir run/bench/run --sd-dir "" >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$start $end" > "run/bench/default-$i.wall"
done
go run ./scripts/benchtable run/bench "$n"
