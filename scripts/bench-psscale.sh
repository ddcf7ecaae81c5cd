#!/usr/bin/env bash
# The pauses of live PS count changes (docs/elastic.md, "Parameter
# servers"), two binaries alternated: N pairs (default 3) of
# `BIN run --max-ps 3 --target-accuracy 0 FLAGS`, each asked for 3
# parameter servers 6 s after its first progress line and for 1 seven
# seconds later; prints each run's pauses and steps lost from its
# report's membership_changes. The run must last past the second change
# (the MLP: --epochs 10; --model ctr: --epochs 3 --patience 0, after
# `pstrain data synth-ctr --out DATA/synth-ctr` and with --data-dir DATA;
# both binaries get the same flags, so both must know --patience).
#
#   scripts/bench-psscale.sh 3 /tmp/old-pstrain bin/pstrain --model ctr --epochs 3 --patience 0 --data-dir /tmp/ctrdata
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:?pairs}"; a="${2:?binary A}"; b="${3:?binary B}"
shift 3
out=run/bench-psscale
rm -rf "$out"; mkdir -p "$out"
printf "%-4s %-30s %-5s %s\n" pair binary load "pauses (s), steps lost"
for i in $(seq 1 "$n"); do
  for bin in "$a" "$b"; do
    dir="$out/$i-$(basename "$bin")-$RANDOM"
    load=$(cut -d' ' -f1 /proc/loadavg)
    "$bin" run --run-dir "$dir" --sd-dir "" --report "$dir/report.json" --max-ps 3 --target-accuracy 0 "$@" >"$dir.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q '^step ' "$dir.log" 2>/dev/null && break; sleep 0.1; done
    sleep 6; "$bin" scale --run-dir "$dir" --ps 3 >/dev/null
    sleep 7; "$bin" scale --run-dir "$dir" --ps 1 >/dev/null
    wait "$pid"
    pauses=$(grep -o '"pause_seconds": [0-9.]*' "$dir/report.json" | awk '{printf "%.3f ", $2}')
    lost=$(grep -o '"steps_lost": [0-9]*' "$dir/report.json" | head -n "$(echo "$pauses" | wc -w)" | awk '{printf "%s ", $2}')
    printf "%-4s %-30s %-5s %s(lost %s)\n" "$i" "$bin" "$load" "$pauses" "$lost"
  done
done
