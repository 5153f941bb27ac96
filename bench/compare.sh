#!/usr/bin/env bash
# Compares rdmacp cp with cat|nc and cp on one page-cached file, on this
# machine, in one run. Prints MB/s medians (and min-max) and ratios.
#
#   bench/compare.sh [-s SIZE_MiB] [-n RUNS] [-d DIR]
#
# rdmacp's figure includes what its copy guarantees: every chunk verified
# (crc32c), the destination fsynced and renamed into place. cp and nc are
# shown without and with an fsync of the destination (`sync FILE`).
set -euo pipefail
size=1024 runs=3 dir=
while getopts s:n:d: o; do
  case $o in s) size=$OPTARG ;; n) runs=$OPTARG ;; d) dir=$OPTARG ;; *) exit 2 ;; esac
done
cd "$(dirname "$0")/.."
if ! command -v nc >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q netcat-openbsd >/dev/null
fi
[ -n "$dir" ] || dir=$(mktemp -d /var/tmp/rdmacp-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
mkdir -p "$dir/export" "$dir/out"
bin=$dir/rdmacp
go build -o "$bin" ./cmd/rdmacp
src=$dir/export/file
head -c $((size << 20)) /dev/urandom >"$src"
cat "$src" >/dev/null # page-cache it
bytes=$((size << 20))
port=$((20000 + RANDOM % 20000))

"$bin" serve --transport iwarp-soft --listen 127.0.0.1:$port --export data="$dir/export" --log-level warn &
sleep 1

now() { date +%s.%N; }
mbps() { awk -v b=$bytes -v t0="$1" -v t1="$2" 'BEGIN { printf "%.0f", b / (t1 - t0) / 1e6 }'; }
declare -A res

record() { res[$1]="${res[$1]:-} $2"; }

for i in $(seq "$runs"); do
  for cs in 1MiB 4MiB 16MiB; do
    rm -f "$dir/out/r"
    t0=$(now); "$bin" cp -q --transport iwarp-soft --chunk-size $cs 127.0.0.1:$port:data/file "$dir/out/r" >/dev/null 2>&1; t1=$(now)
    cmp -s "$src" "$dir/out/r" || { echo "rdmacp copy differs" >&2; exit 1; }
    record "rdmacp cp, chunk $cs" "$(mbps "$t0" "$t1")"
  done
  for sync in 0 1; do
    rm -f "$dir/out/c"
    t0=$(now); cp "$src" "$dir/out/c"; [ $sync = 0 ] || sync "$dir/out/c"; t1=$(now)
    record "cp$([ $sync = 1 ] && echo ' + fsync')" "$(mbps "$t0" "$t1")"
    rm -f "$dir/out/n"
    np=$((port + 1))
    t0=$(now)
    nc -l 127.0.0.1 $np >"$dir/out/n" &
    lp=$!
    sleep 0.2
    nc -N 127.0.0.1 $np <"$src"
    wait $lp
    [ $sync = 0 ] || sync "$dir/out/n"
    t1=$(now)
    # the listener's start-up sleep is not transfer time
    t1=$(awk -v t="$t1" 'BEGIN { printf "%.9f", t - 0.2 }')
    cmp -s "$src" "$dir/out/n" || { echo "nc copy differs" >&2; exit 1; }
    record "cat | nc$([ $sync = 1 ] && echo ' + fsync')" "$(mbps "$t0" "$t1")"
  done
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.0f %d-%d", m, a[1], a[NR]}'; }
declare -A med span
for k in "${!res[@]}"; do
  read -r m r <<<"$(echo "${res[$k]}" | median)"
  med[$k]=$m span[$k]=$r
done
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r); ${size} MiB page-cached file; median of $runs runs"
printf '%-28s %8s %12s\n' "method" "MB/s" "min-max"
for k in "${!res[@]}"; do printf '%-28s %8s %12s\n' "$k" "${med[$k]}" "${span[$k]}"; done | sort
best=${med["rdmacp cp, chunk 4MiB"]}
echo
for k in "cat | nc" "cat | nc + fsync" "cp" "cp + fsync"; do
  awk -v a="$best" -v b="${med[$k]}" -v k="$k" 'BEGIN { printf "rdmacp cp (4MiB chunks) / %-17s = %.2f\n", k, a / b }'
done
