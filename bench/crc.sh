#!/usr/bin/env bash
# What MPA's FPDU CRC32c costs rdmacp bench, side by side in one run: each
# round runs the plain Go TCP streamer (bench/tcpstream, N streams), then
# `rdmacp bench` with MPA CRC off and with `--mpa-crc on` (N QPs), and
# the ratios are taken within the round. Prints per round, then the
# medians (min-max) over the rounds.
#
#   bench/crc.sh [-n ROUNDS] [-D SECS] [-q QPS] [-d DEPTH] [-s FILE_MiB] [NAME=BINARY...]
#
# With NAME=BINARY arguments (rdmacp builds), every build is benched in
# every round against the one streamer run, so builds compare in one run;
# the first one serves. Without, the working tree is built as "this".
#
# Over loopback the CRC is the only thing that differs between the two
# rdmacp figures: both ends compute it (sender per FPDU, receiver before
# completing), on the same cores as the kernel's TCP copies.
set -euo pipefail
rounds=5 secs=3 qps=4 depth=4 size=64
while getopts n:D:q:d:s: o; do
  case $o in n) rounds=$OPTARG ;; D) secs=$OPTARG ;; q) qps=$OPTARG ;; d) depth=$OPTARG ;; s) size=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
cd "$(dirname "$0")/.."
. bench/lib.sh
dir=$(mktemp -d /var/tmp/rdmacp-crc.XXXXXX)
cleanup() {
  for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
names=() bins=()
if [ $# -eq 0 ]; then
  go build -o "$dir/rdmacp" ./cmd/rdmacp
  set -- this="$dir/rdmacp"
fi
for a in "$@"; do names+=("${a%%=*}"); bins+=("$(realpath "${a#*=}")"); done
ts=$dir/tcpstream
go build -o "$ts" ./bench/tcpstream
mkdir -p "$dir/export"
head -c $((size << 20)) /dev/urandom >"$dir/export/file"
cat "$dir/export/file" >/dev/null

port=$(free_port)
"${bins[0]}" serve --transport iwarp-soft --listen 127.0.0.1:$port --export data="$dir/export" --log-level warn 2>"$dir/serve.log" &
wait_port $port

stream() { # prints MB/s
  local np rpid
  np=$(free_port)
  rm -f "$dir/recv.err"
  "$ts" recv -listen 127.0.0.1:$np -n "$qps" >"$dir/recv.json" 2>"$dir/recv.err" &
  rpid=$!
  for _ in $(seq 200); do grep -q listening "$dir/recv.err" 2>/dev/null && break; sleep 0.02; done
  "$ts" send -connect 127.0.0.1:$np -n "$qps" -duration "${secs}s" >/dev/null
  wait $rpid
  awk -v g="$(jget gb_per_s "$dir/recv.json")" 'BEGIN { printf "%.0f", g * 1000 }'
}
bench() { # binary crc(on|off): prints MB/s
  "$1" bench --transport iwarp-soft --mpa-crc "$2" --json -D "$secs" --qps "$qps" --depth "$depth" -s 1MiB \
    127.0.0.1:$port:data/file >"$dir/bench.json" 2>"$dir/bench.err" || { cat "$dir/bench.err" >&2; exit 1; }
  printf '%.0f' "$(jget avg_mb_per_s "$dir/bench.json")"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%s (%s-%s)", m, a[1], a[NR]}'; }

declare -A col
echo "# $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $qps QPs x $depth / $qps streams, ${secs}s each, $rounds rounds"
for i in $(seq "$rounds"); do
  s=$(stream)
  line="round $i: tcpstream $s MB/s"
  col[stream]+=" $s"
  for k in "${!names[@]}"; do
    n=${names[$k]}
    off=$(bench "${bins[$k]}" off)
    on=$(bench "${bins[$k]}" on)
    col[$n.off]+=" $off" col[$n.on]+=" $on"
    col[$n.roff]+=" $(ratio "$off" "$s")" col[$n.ron]+=" $(ratio "$on" "$s")"
    line+="; $n off $off ($(ratio "$off" "$s")x) on $on ($(ratio "$on" "$s")x)"
  done
  echo "$line"
done
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg); medians (min-max) of $rounds rounds"
echo "tcpstream, $qps streams: $(echo "${col[stream]}" | median) MB/s"
for n in "${names[@]}"; do
  echo "$n: CRC off $(echo "${col[$n.off]}" | median) MB/s = $(echo "${col[$n.roff]}" | median) x tcpstream"
  echo "$n: CRC on  $(echo "${col[$n.on]}" | median) MB/s = $(echo "${col[$n.ron]}" | median) x tcpstream"
done
