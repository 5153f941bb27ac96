#!/usr/bin/env bash
# Would striping one copy over several targets (`--source h1,h2`) help on
# this machine? Measures READ bandwidth from one target with 4 QPs against
# the sum of two `rdmacp bench` runs at once, each against its own target
# process with 2 QPs (the same QPs in all), over loopback with iwarp-soft.
# If the two targets together are not faster, a second source cannot make
# a copy faster here either.
#
#   bench/sources.sh [-r RUNS] [-D SECONDS]
set -euo pipefail
runs=3 secs=3
while getopts r:D: o; do
  case $o in r) runs=$OPTARG ;; D) secs=$OPTARG ;; *) exit 2 ;; esac
done
cd "$(dirname "$0")/.."
dir=$(mktemp -d /dev/shm/rdmacp-sources.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
go build -o "$dir/rdmacp" ./cmd/rdmacp
head -c $((256 << 20)) /dev/urandom >"$dir/file"
p1=$((20000 + RANDOM % 20000)) p2=$((p1 + 1))
for p in $p1 $p2; do
  "$dir/rdmacp" serve --transport iwarp-soft --listen 127.0.0.1:$p --export data="$dir" --log-level error &
done
sleep 1
bench() { # port qps -> MB/s
  "$dir/rdmacp" bench --transport iwarp-soft --json -D "$secs" --qps "$2" --depth 4 -s 1MiB 127.0.0.1:$1:data/file 2>/dev/null |
    sed -n 's/.*"avg_mb_per_s":\([0-9.]*\).*/\1/p'
}
one=() two=()
for _ in $(seq "$runs"); do
  one+=("$(bench $p1 4 | awk '{ printf "%.0f", $1 }')")
  bench $p1 2 >"$dir/a" & a=$!
  bench $p2 2 >"$dir/b" & b=$!
  wait $a $b
  two+=("$(awk '{ s += $1 } END { printf "%.0f", s }' "$dir/a" "$dir/b")")
done
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
m1=$(median "${one[@]}") m2=$(median "${two[@]}")
echo "one target, 4 QPs:          ${m1} MB/s (runs: ${one[*]})"
echo "two targets, 2 QPs each:    ${m2} MB/s (runs: ${two[*]})"
awk -v a="$m1" -v b="$m2" 'BEGIN { printf "two / one: %.2fx\n", b / a }'
