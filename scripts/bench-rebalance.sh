#!/usr/bin/env bash
# Throughput of a sync run with one parameter server slowed, rebalanced
# or not (docs/elastic.md, "Rebalancing"). Runs N pairs (default 3),
# alternating: "rebalanced" asks `pstrain scale --rebalance` AT seconds
# after the start (default 8) and again 5 s later (each rebalance
# measures the layout it finds), "even" does not. Each run's steps/s is
# read from its progress lines, before (from 3 s to AT) and after (from
# AT+8 s to its last line); extra flags go to `pstrain run`.
#
#   scripts/bench-rebalance.sh 4 8 --mode sync --batch 64 --data-fraction 0.3 --epochs 16 --fault slow:ps/0@0s:3
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-3}"
at="${2:-8}"
shift 2 || true
go build -o bin/pstrain ./cmd/pstrain
out=run/bench-rebalance
rm -rf "$out"; mkdir -p "$out"
rate() { # rate LOG FROM TO: steps per second between the progress lines in [FROM, TO] seconds
  awk -v from="$2" -v to="$3" '/^step /{split($2,s,"/"); for(i=1;i<=NF;i++) if($i=="elapsed") {t=$(i+1); sub("s","",t); t=t+0}
    if(t>=from && t<=to){ if(t0==""){t0=t; s0=s[1]} t1=t; s1=s[1]} }
    END{ if(t1>t0) printf "%.1f", (s1-s0)/(t1-t0); else printf "-" }' "$1"
}
printf "%-10s %-5s %8s %8s %6s  %s\n" run load before after ratio change
for i in $(seq 1 "$n"); do
  for kind in rebalanced even; do
    dir="$out/$kind-$i"
    load=$(cut -d' ' -f1 /proc/loadavg)
    bin/pstrain run --run-dir "$dir" --sd-dir "" --checkpoint-dir "$dir/ck" --checkpoint-every 0s --report "$dir/report.json" \
      --target-accuracy 0 --eval-every 0 "$@" >"$dir.log" 2>&1 &
    pid=$!
    answer=""
    if [ "$kind" = rebalanced ]; then
      sleep "$at"
      answer=$(bin/pstrain scale --run-dir "$dir" --rebalance 2>&1 | tail -1 || true)
      sleep 5
      answer2=$(bin/pstrain scale --run-dir "$dir" --rebalance 2>&1 | tail -1 || true)
    fi
    wait "$pid"
    before=$(rate "$dir.log" 3 "$at")
    after=$(rate "$dir.log" $((at + 8)) 100000)
    ratio=$(awk -v a="$after" -v b="$before" 'BEGIN{ if (b>0) printf "%.2f", a/b; else print "-" }')
    change=$(grep -o '^parameter servers: .*' "$dir.log" | sed 's/parameter servers: 2 rebalanced to weights //; s/ at step .*//' | paste -sd';' || true)
    [ "$kind" = rebalanced ] && [ -z "$change" ] && change="$answer"
    [ "$kind" = rebalanced ] && case "$answer2" in *refused*|*"cannot scale"*) change="$change; then refused: ${answer2##*imbalance: }";; esac
    printf "%-10s %-5s %8s %8s %6s  %s\n" "$kind-$i" "$load" "$before" "$after" "$ratio" "$change"
  done
done
