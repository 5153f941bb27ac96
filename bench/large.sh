#!/usr/bin/env bash
# Large and sparse files (#16): time to first byte, holes neither read nor
# sent, and what both ends hold, over loopback with iwarp-soft.
#
#   bench/large.sh [-s "1 16 100"] [-r RUNS] [-d DIR] [-x]
#
# 1. Time to first byte for sparse files of each size in -s (GiB; default
#    1, 16 and 100), each holding 8 MiB of data at its start and at its
#    middle: the time from `rdmacp cp` starting to the target's first
#    mapped window (rdmacp_served_bytes_total > 0 on --metrics-listen,
#    polled every 10 ms; the first READ follows at once). The copy goes to
#    /dev/null (verified, thrown away) so nothing of it lands on disk.
# 2. A 100 GiB sparse file holding 1 GiB of data (8 islands of 128 MiB)
#    against a dense 1 GiB file: median copy time of RUNS (default 3) runs
#    each, taking turns, the ratio (goal at most 2), and the disk the
#    destination uses (du; goal at most 1.1 GiB), and the peak RSS of the
#    target (VmHWM, one daemon per case) and of cp (time's %M).
# -x skips part 2 (a target without holes fills the disk there).
set -euo pipefail
sizes="1 16 100" runs=3 dir= skip2=
while getopts s:r:d:x o; do
  case $o in s) sizes=$OPTARG ;; r) runs=$OPTARG ;; d) dir=$OPTARG ;; x) skip2=1 ;; *) exit 2 ;; esac
done
cd "$(dirname "$0")/.."
. bench/lib.sh
[ -n "$dir" ] || dir=$(mktemp -d /var/tmp/rdmacp-large.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; wait; rm -rf "$dir"' EXIT
mkdir -p "$dir/export" "$dir/out"
bin=$dir/rdmacp
go build -o "$bin" ./cmd/rdmacp

port= mport= spid=
start_serve() {
  [ -z "$spid" ] || { kill "$spid"; wait "$spid" 2>/dev/null || true; }
  port=$(free_port) mport=$(free_port)
  "$bin" serve --transport iwarp-soft --listen 127.0.0.1:$port --metrics-listen 127.0.0.1:$mport \
    --export data="$dir/export" --log-level warn 2>>"$dir/serve.log" &
  spid=$!
  wait_port $port
  wait_port $mport
}
# served: bytes of windows mapped so far (a counter: a copy can map and
# unmap its windows between two polls).
served() { curl -s "http://127.0.0.1:$mport/metrics" | awk '/^rdmacp_served_bytes_total/{ s += $2 } END { print s + 0 }'; }
hwm() { awk '/^VmHWM:/{ print $2 }' /proc/$spid/status; } # kB
cp1() { "$bin" cp -q --transport iwarp-soft "127.0.0.1:$port:data/$1" "$2"; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# island FILE OFFSET BYTES writes random data.
island() { dd if=/dev/urandom of="$1" bs=1M seek=$(($2 >> 20)) count=$(($3 >> 20)) conv=notrunc status=none; }

echo "time to first byte (cp to /dev/null; first window mapped by the target):"
for g in $sizes; do
  f=$dir/export/sparse$g
  truncate -s ${g}G "$f"
  island "$f" 0 $((8 << 20))
  island "$f" $(((g << 30) / 2)) $((8 << 20))
  start_serve # a fresh daemon: nothing cached
  t0=$(now)
  cp1 sparse$g /dev/null &
  cpid=$!
  ttfb=
  while kill -0 $cpid 2>/dev/null; do
    if [ "$(served)" != "0" ]; then ttfb=$(secs "$t0" "$(now)"); break; fi
    sleep 0.01
  done
  wait $cpid
  t1=$(now)
  # A copy over before the first poll saw a window: its first byte came
  # sooner than the whole copy.
  printf '  %4d GiB sparse (16 MiB data): first byte %ss, whole copy %ss\n' "$g" "${ttfb:-<= whole}" "$(secs "$t0" "$t1")"
  rm -f "$f"
done
[ -z "$skip2" ] || exit 0

echo "100 GiB sparse holding 1 GiB of data against a dense 1 GiB file ($runs runs each):"
sp=$dir/export/sparse100 dn=$dir/export/dense1
truncate -s 100G "$sp"
for i in $(seq 0 7); do island "$sp" $((i * (100 << 30) / 8)) $((128 << 20)); done
island "$dn" 0 $((1 << 30))
a= b= rss_a= rss_b= du_a= du_b= t_a= t_b=
for _ in $(seq "$runs"); do
  for which in sparse100 dense1; do
    start_serve
    rm -f "$dir/out/$which"
    t0=$(now)
    /usr/bin/time -f %M -o "$dir/time" "$bin" cp -q --transport iwarp-soft "127.0.0.1:$port:data/$which" "$dir/out/$which"
    t=$(secs "$t0" "$(now)")
    if [ $which = sparse100 ]; then
      a="$a $t" rss_a=$(cat "$dir/time") t_a=$(hwm) du_a=$(du -k "$dir/out/$which" | cut -f1)
    else
      b="$b $t" rss_b=$(cat "$dir/time") t_b=$(hwm) du_b=$(du -k "$dir/out/$which" | cut -f1)
    fi
    # rdmacp verified every chunk and the file digest; cmp the dense copy
    # too (cmp of the sparse one would read 200 GiB of holes).
    [ $which = sparse100 ] || cmp -s "$dir/export/$which" "$dir/out/$which" || { echo "copy of $which differs" >&2; exit 1; }
  done
done
ma=$(echo "$a" | median) mb=$(echo "$b" | median)
printf '  %-34s %7ss (runs:%s)  dest du %d MiB  peak RSS target %d MiB, cp %d MiB\n' \
  "100 GiB sparse, 1 GiB data" "$ma" "$a" $((du_a >> 10)) $((t_a >> 10)) $((rss_a >> 10)) \
  "1 GiB dense" "$mb" "$b" $((du_b >> 10)) $((t_b >> 10)) $((rss_b >> 10))
awk -v a="$ma" -v b="$mb" 'BEGIN { printf "sparse / dense: %.2f\n", a / b }'
