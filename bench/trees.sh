#!/usr/bin/env bash
# Copies trees of 10k, 100k and 1M small files (default 1 KiB, in
# directories of 100) over loopback with rdmacp cp -r and with an rsync
# daemon, and prints each one's time and peak RSS (both ends), and
# rsync's time divided by rdmacp's: the goal is >= 2x at every size, with
# memory that stays flat as the tree grows.
#
#   bench/trees.sh [-s "10000 100000 1000000"] [-b BYTES] [-r RUNS] [-d DIR] [-o BIN]
#
# DIR defaults to a new directory in /dev/shm (tmpfs: the disk is not
# measured); a 1M-file tree of 1 KiB files takes 4 GiB there, twice over
# while a copy exists. Peak RSS is GNU time's "Maximum resident set size"
# of cp (rsync: of the client, its largest process) and of the daemon
# (serve; rsync: the daemon and its per-connection child), each daemon
# started afresh for each size. The trees are made with test/trees/gentree.
# CPU is user + system seconds per 1,000 files copied: of cp, the median
# of its runs (the first copy of a size lands in memory never touched, and
# in this VM is slower for it); of the daemon, all its runs, its walk
# included, divided by runs x files; "both" adds the two, and the ratio
# line gives rsync's over rdmacp's too: the ratio a loaded run tends to.
#
# -o BIN adds BIN (another rdmacp, say a build of main) as "before", run
# in turn with the others in each round, with its own daemon: a before
# and after measured under the same load.
set -euo pipefail
sizes="10000 100000 1000000" bytes=1024 runs=3 dir= old=
while getopts s:b:r:d:o: o; do
  case $o in s) sizes=$OPTARG ;; b) bytes=$OPTARG ;; r) runs=$OPTARG ;; d) dir=$OPTARG ;; o) old=$(realpath "$OPTARG") ;; *) exit 2 ;; esac
done
cd "$(dirname "$0")/.."
for c in rsync /usr/bin/time; do
  command -v $c >/dev/null || { echo "$c is not installed" >&2; exit 1; }
done
[ -n "$dir" ] || dir=$(mktemp -d /dev/shm/rdmacp-trees.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done; wait; rm -rf "$dir"' EXIT
bin=$dir/rdmacp gen=$dir/gentree
go build -o "$bin" ./cmd/rdmacp
go build -o "$gen" ./test/trees/gentree
now() { date +%s.%N; }
maxrss() { awk '/Maximum resident/ { printf "%.0f", $NF / 1024 }' "$1"; } # MiB
cpus() { awk '/User time|System time/ { s += $NF } END { printf "%.2f", s }' "$1"; } # user + sys (GNU time gives 1/100 s)
tools="rdmacp${old:+ before} rsync"
median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-9s %-7s %9s %12s %12s %14s %14s %12s\n' files tool seconds "cp MiB" "daemon MiB" "cp CPU s/1k" "daemon s/1k" "both s/1k"
for n in $sizes; do
  rm -rf "$dir/export"
  "$gen" -files "$n" -per 100 -size "$bytes" "$dir/export/s"
  port=$((20000 + RANDOM % 20000)) rport=$((port + 1))
  /usr/bin/time -v -o "$dir/serve.time" "$bin" serve --transport iwarp-soft --listen 127.0.0.1:$port --export data="$dir/export" --log-level error &
  spid=$!
  opid=
  if [ -n "$old" ]; then
    oport=$((port + 2))
    /usr/bin/time -v -o "$dir/before.time" "$old" serve --transport iwarp-soft --listen 127.0.0.1:$oport --export data="$dir/export" --log-level error &
    opid=$!
  fi
  cat >"$dir/rsyncd.conf" <<CONF
port = $rport
address = 127.0.0.1
use chroot = false
pid file = $dir/rsyncd.pid
[data]
  path = $dir/export
  read only = true
CONF
  rm -f "$dir/rsyncd.pid"
  /usr/bin/time -v -o "$dir/rsyncd.time" rsync --daemon --no-detach --config="$dir/rsyncd.conf" &
  rpid=$!
  pids=($spid $rpid $opid)
  sleep 1
  declare -A t=() m=() c=()
  for round in $(seq 1 "$runs"); do
    # each round starts with the next tool: the very first copy, into
    # memory never touched, is no one tool's every time
    set -- $tools
    order=$(for i in $(seq 0 $(($# - 1))); do k=$(((i + round - 1) % $# + 1)); echo "${!k}"; done)
    for tool in $order; do
      rm -rf "$dir/out"
      mkdir "$dir/out"
      t0=$(now)
      if [ $tool = rdmacp ]; then
        /usr/bin/time -v -o "$dir/cp.time" "$bin" cp -r -q --transport iwarp-soft 127.0.0.1:$port:data/s "$dir/out/"
      elif [ $tool = before ]; then
        /usr/bin/time -v -o "$dir/cp.time" "$old" cp -r -q --transport iwarp-soft 127.0.0.1:$oport:data/s "$dir/out/"
      else
        /usr/bin/time -v -o "$dir/cp.time" rsync -a rsync://127.0.0.1:$rport/data/s "$dir/out/"
      fi
      t1=$(now)
      got=$(find "$dir/out/s" -type f | wc -l)
      [ "$got" -eq "$n" ] || { echo "$tool: $got files, want $n" >&2; exit 1; }
      t[$tool]="${t[$tool]:-} $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
      m[$tool]=$(maxrss "$dir/cp.time")
      c[$tool]="${c[$tool]:-} $(cpus "$dir/cp.time")"
    done
  done
  rm -rf "$dir/out"
  # the daemons' peaks: serve on SIGTERM, rsync's on SIGTERM of its pid
  pkill -TERM -P $spid || true
  [ -z "$opid" ] || pkill -TERM -P $opid || true
  kill -TERM "$(cat "$dir/rsyncd.pid")" 2>/dev/null || true
  wait $spid $rpid $opid 2>/dev/null || true
  pids=()
  declare -A dm=([rdmacp]=$(maxrss "$dir/serve.time") [rsync]=$(maxrss "$dir/rsyncd.time"))
  declare -A dc=([rdmacp]=$(cpus "$dir/serve.time") [rsync]=$(cpus "$dir/rsyncd.time"))
  [ -z "$old" ] || { dm[before]=$(maxrss "$dir/before.time"); dc[before]=$(cpus "$dir/before.time"); }
  declare -A med=() both=()
  for tool in $tools; do
    med[$tool]=$(echo "${t[$tool]}" | median)
    ck=$(awk -v c="$(echo "${c[$tool]}" | median)" -v k="$n" 'BEGIN { printf "%.4f", c / k * 1000 }')
    dk=$(awk -v c="${dc[$tool]}" -v k="$((runs * n))" 'BEGIN { printf "%.4f", c / k * 1000 }')
    both[$tool]=$(awk -v a="$ck" -v b="$dk" 'BEGIN { printf "%.4f", a + b }')
    printf '%-9s %-7s %9s %12s %12s %14s %14s %12s   (runs:%s; cp CPU s:%s)\n' "$n" $tool "${med[$tool]}" "${m[$tool]}" "${dm[$tool]}" \
      "$ck" "$dk" "${both[$tool]}" "${t[$tool]}" "${c[$tool]}"
  done
  # Under load the times tend to the ratio of the CPU both ends spend
  # (docs/performance.md, "Small files"): printed beside the times' ratio.
  awk -v r="${med[rsync]}" -v p="${med[rdmacp]}" -v rc="${both[rsync]}" -v pc="${both[rdmacp]}" -v n="$n" 'BEGIN { printf "%-9s rsync / rdmacp: %.2fx (CPU, both ends: %.2fx)\n", n, r / p, rc / pc }'
  [ -z "$old" ] || awk -v r="${med[rsync]}" -v p="${med[before]}" -v rc="${both[rsync]}" -v pc="${both[before]}" -v n="$n" 'BEGIN { printf "%-9s rsync / before: %.2fx (CPU, both ends: %.2fx)\n", n, r / p, rc / pc }'
  unset t m c dm dc med both
  echo "load average after $n files: $(cut -d' ' -f1-3 /proc/loadavg)"
done
