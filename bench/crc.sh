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
# The streamer's receiver reads each stream into the next MiB of a ring of
# DEPTH MiB (tcpstream recv -ring), as bench's READs land in DEPTH slots
# of 1 MiB per QP. Read into one 1 MiB buffer that never leaves L2, the
# streamer's receiver did 0.12 CPU s/GB, not 0.14, and the same build
# measured 0.73x (CRC off) and 0.60x (on) against it, where it measures
# 0.86-0.87x and 0.70-0.75x against the ring (two runs each, -n 5).
#
# The streamer's sender sends the next MiB of a source as large as the
# file (tcpstream send -window), as bench READs the next MiB of the
# file's window in turn. Sent from one 1 MiB buffer that never leaves
# L2, the sender did 0.18 CPU s/GB, not 0.22 (three runs each), where a
# target serving a 64 MiB window reads its bytes from memory.
#
# On 2 cores both ends share the CPUs, so the rate follows CPU s/GB of
# both sides together; the script prints that ratio too (streamer's
# receiver + sender over initiator + target), which stays put when other
# work on the host moves the MB/s of one run against the next.
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

# Each build serves itself, so that its target's CPU is its own.
declare -A port spid
for k in "${!names[@]}"; do
  port[$k]=$(free_port)
  "${bins[$k]}" serve --transport iwarp-soft --listen 127.0.0.1:${port[$k]} --export data="$dir/export" --log-level warn 2>"$dir/serve.$k.log" &
  spid[$k]=$!
  wait_port "${port[$k]}"
done
perGB() { awk -v c="$1" -v b="$2" 'BEGIN { printf "%.2f", c / (b / 1e9) }'; }

stream() { # prints MB/s, receiver and sender CPU s/GB
  recv_start "$dir/recv.json" "$dir/recv.err" "$ts" -n "$qps" -ring $((depth << 20)) || exit 1
  "$ts" send -connect "$recv_addr" -n "$qps" -duration "${secs}s" -window $((size << 20)) >"$dir/send.json" || exit 1
  wait $recv_pid || { echo "tcpstream recv: $(cat "$dir/recv.err")" >&2; exit 1; }
  awk -v g="$(jget gb_per_s "$dir/recv.json")" 'BEGIN { printf "%.0f", g * 1000 }'
  printf ' %.2f %s' "$(jget cpu_seconds_per_gb "$dir/recv.json")" "$(perGB "$(jget cpu_seconds "$dir/send.json")" "$(jget bytes "$dir/recv.json")")"
}
bench() { # build crc(on|off): prints MB/s, initiator and target CPU s/GB
  local c0
  c0=$(pcpu "${spid[$1]}")
  "${bins[$1]}" bench --transport iwarp-soft --mpa-crc "$2" --json -D "$secs" --qps "$qps" --depth "$depth" -s 1MiB \
    127.0.0.1:${port[$1]}:data/file >"$dir/bench.json" 2>"$dir/bench.err" || { cat "$dir/bench.err" >&2; exit 1; }
  local f
  f=$(jget qp_failures "$dir/bench.json")
  [ "${f:-0}" = 0 ] || echo "warning: ${names[$1]} --mpa-crc $2: $f data QPs failed: $(grep -o '"cause":"[^"]*"' "$dir/bench.json" | head -1)" >&2
  printf '%.0f %.2f %s' "$(jget avg_mb_per_s "$dir/bench.json")" "$(jget cpu_seconds_per_gb "$dir/bench.json")" \
    "$(perGB "$(awk -v a="$c0" -v b="$(pcpu "${spid[$1]}")" 'BEGIN { print b - a }')" "$(jget bytes "$dir/bench.json")")"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

declare -A col
echo "# $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $qps QPs x $depth / $qps streams, ${secs}s each, $rounds rounds"
echo "# per run: MB/s, x tcpstream of the round, CPU s/GB receiving / sending side"
for i in $(seq "$rounds"); do
  read -r s sr ss <<<"$(stream)"
  [ -n "$s" ] || exit 1 # stream said why
  line="round $i: tcpstream $s MB/s $sr/$ss"
  col[stream]+=" $s" col[stream.cr]+=" $sr" col[stream.cs]+=" $ss"
  # The runs in one order on odd rounds and in reverse on even ones. In
  # one order throughout, two builds with the same target code measured
  # a target CPU of 0.28-0.30 s/GB (CRC on) as the first build of each
  # round and 0.24-0.25 as the second (two runs of -n 7, the order of
  # the builds swapped): more than what was being compared.
  runs=()
  for k in "${!names[@]}"; do for c in off on; do runs+=("$k $c"); done; done
  if [ $((i % 2)) = 0 ]; then
    for ((a = 0, b = ${#runs[@]} - 1; a < b; a++, b--)); do t=${runs[a]} runs[a]=${runs[b]} runs[b]=$t; done
  fi
  declare -A got=()
  for kc in "${runs[@]}"; do
    read -r k c <<<"$kc"
    n=${names[$k]}
    read -r v ci ct <<<"$(bench "$k" $c)"
    [ -n "$v" ] || exit 1 # bench said why
    col[$n.$c]+=" $v" col[$n.$c.r]+=" $(ratio "$v" "$s")" col[$n.$c.ci]+=" $ci" col[$n.$c.ct]+=" $ct"
    col[$n.$c.cr]+=" $(ratio "$(awk -v a="$sr" -v b="$ss" 'BEGIN { print a + b }')" "$(awk -v a="$ci" -v b="$ct" 'BEGIN { print a + b }')")"
    got[$n.$c]="; $n $c $v ($(ratio "$v" "$s")x) $ci/$ct"
  done
  for n in "${names[@]}"; do line+="${got[$n.off]}${got[$n.on]}"; done
  echo "$line"
done
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg); medians (min-max) of $rounds rounds"
echo "tcpstream, $qps streams: $(echo "${col[stream]}" | median_range) MB/s; CPU s/GB receiver $(echo "${col[stream.cr]}" | median_range), sender $(echo "${col[stream.cs]}" | median_range)"
for n in "${names[@]}"; do
  for c in off on; do
    printf '%s: CRC %-3s %s MB/s = %s x tcpstream (by CPU s/GB of both sides: %s); CPU s/GB initiator %s, target %s\n' "$n" $c \
      "$(echo "${col[$n.$c]}" | median_range)" "$(echo "${col[$n.$c.r]}" | median_range)" "$(echo "${col[$n.$c.cr]}" | median_range)" \
      "$(echo "${col[$n.$c.ci]}" | median_range)" "$(echo "${col[$n.$c.ct]}" | median_range)"
  done
done
