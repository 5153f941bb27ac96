#!/usr/bin/env bash
# Regenerates docs/performance.md: rdmacp cp and bench against cat | nc,
# an rsync daemon, cp and a plain multi-stream Go TCP streamer/copier
# (bench/tcpstream), all on this machine, in this one run.
#
#   bench/report.sh [-s SIZE_MiB] [-n RUNS] [-D BENCH_SECS] [-b BIG_GiB]
#                   [-q "1 2 4 8"] [-p "1 4 16"] [-d DIR] [-o FILE] [-k]
#
#   -s  size of the page-cached file the copies move (default 1024 MiB)
#   -n  timed runs of each measurement, after one untimed warm-up (default 5)
#   -D  seconds per bandwidth test (rdmacp bench, tcpstream memory mode; default 3)
#   -b  size of the sparse file the peak-RSS copy moves (default 10 GiB; 0 skips it)
#   -q  queue pair / stream counts to sweep (default "1 2 4 8")
#   -p  READ depths to sweep at 4 QPs (default "1 4 16")
#   -d  work directory (default: a new one under /var/tmp, removed after)
#   -o  where to write the report (default docs/performance.md)
#   -k  keep the raw samples (DIR/samples.tsv), profiles and binaries
#   -R DIR  render only: write the report again from what a -k run kept in
#       DIR (to change the text without measuring again)
#
# Everything runs over loopback with the pure-Go iwarp-soft transport. The
# defaults take about 8 minutes on a 2-core VM.
set -euo pipefail
size=1024 runs=5 secs=3 big=10 qlist="1 2 4 8" dlist="1 4 16" dir= out= keep= render=
while getopts s:n:D:b:q:p:d:o:kR: o; do
  case $o in
  s) size=$OPTARG ;; n) runs=$OPTARG ;; D) secs=$OPTARG ;; b) big=$OPTARG ;;
  q) qlist=$OPTARG ;; p) dlist=$OPTARG ;; d) dir=$OPTARG ;; o) out=$OPTARG ;; k) keep=1 ;; R) render=$OPTARG ;;
  *) exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
. bench/lib.sh
repo=$PWD
[ -n "$out" ] || out=$repo/docs/performance.md
case $out in /*) ;; *) out=$repo/$out ;; esac
started=$(date +%s)
log() { printf '[%4ds] %s\n' $(($(date +%s) - started)) "$*" >&2; }
methods=(rdmacp rdmacp_none nc nc_fsync cp cp_fsync rsync rsync_fsync go go_nosync dd_fsync dd_direct)

if [ -z "$render" ]; then
load0=$(cut -d' ' -f1-3 /proc/loadavg)
need=()
command -v nc >/dev/null || need+=(netcat-openbsd)
command -v rsync >/dev/null || need+=(rsync)
[ -x /usr/bin/time ] || need+=(time)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi

made_dir=
if [ -z "$dir" ]; then
  dir=$(mktemp -d /var/tmp/rdmacp-report.XXXXXX)
  made_dir=1
fi
mkdir -p "$dir/export" "$dir/out" "$dir/big"
cleanup() {
  for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$keep" ]; then
    rm -rf "$dir/export" "$dir/out" "$dir/big"
    echo "kept the samples and profiles in $dir (render again with -R $dir)" >&2
  elif [ -n "$made_dir" ]; then
    rm -rf "$dir"
  else
    rm -rf "$dir/export" "$dir/out" "$dir/big"
  fi
}
trap cleanup EXIT

bin=$dir/rdmacp ts=$dir/tcpstream
go build -o "$bin" ./cmd/rdmacp
go build -o "$ts" ./bench/tcpstream
src=$dir/export/file
bytes=$((size << 20))
log "writing a $size MiB file"
head -c $bytes /dev/urandom >"$src"
cat "$src" >/dev/null

samples=$dir/samples.tsv
: >"$samples"
rec() { printf '%s\t%s\n' "$1" "$2" >>"$samples"; }
mbps() { awk -v b="$1" -v t0="$2" -v t1="$3" 'BEGIN { printf "%.1f", b / (t1 - t0) / 1e6 }'; }
perGB() { awk -v c="$1" -v b="$2" 'BEGIN { printf "%.3f", c / (b / 1e9) }'; }
# user+system seconds and peak RSS (KiB) from /usr/bin/time -f '%U %S %M'
trss() { awk '{ print $3 }' "$1"; }
settle() { sync; sleep 0.3; }
# tcpstream recv says "listening" on stderr once it does; callers remove
# the file before starting it.
wait_listening() {
  for _ in $(seq 200); do grep -q listening "$1" 2>/dev/null && return 0; sleep 0.02; done
  echo "tcpstream recv did not start" >&2
  return 1
}

# what verifying costs in CPU: crc32c over 4 MiB chunks on this machine
crc=$(go test -run '^$' -bench 'Sum/crc32c' -benchtime 50x ./chunker 2>/dev/null | awk '/Sum\/crc32c/ { for (i = 1; i < NF; i++) if ($(i + 1) == "MB/s") print $i }')
[ -z "$crc" ] || rec crc.mbps "$crc"

# --- servers --------------------------------------------------------------
port=$(free_port)
"$bin" serve --transport iwarp-soft --listen 127.0.0.1:$port --export data="$dir/export" --log-level warn 2>"$dir/serve.log" &
spid=$!
wait_port $port
rport=$(free_port)
cat >"$dir/rsyncd.conf" <<EOF
port = $rport
address = 127.0.0.1
use chroot = no
uid = $(id -u)
gid = $(id -g)
[data]
path = $dir/export
read only = yes
EOF
rsync --daemon --no-detach --config="$dir/rsyncd.conf" --log-file="$dir/rsyncd.log" &
wait_port $rport

# --- one copy of the page-cached file by each method ------------------------
# Each sets $t0 $t1 (wall clock), $ci (initiator or receiver CPU s) and $ct
# (target or sender CPU s, "" if not known).
dst=$dir/out/copy
copy_rdmacp() { # extra cp flags...
  local c0
  c0=$(pcpu $spid)
  t0=$(now)
  /usr/bin/time -o "$dir/time" -f '%U %S %M' "$bin" cp -q --transport iwarp-soft "$@" 127.0.0.1:$port:data/file "$dst" >/dev/null 2>"$dir/cp.err"
  t1=$(now)
  ct=$(awk -v a="$c0" -v b="$(pcpu $spid)" 'BEGIN { printf "%.3f", b - a }')
  ci=$(tcpu "$dir/time")
  cmp -s "$src" "$dst" || { echo "rdmacp copy differs" >&2; exit 1; }
}
copy_nc() { # fsync: 0 or 1
  local np lpid
  np=$(free_port)
  /usr/bin/time -o "$dir/time.l" -f '%U %S %M' nc -l 127.0.0.1 $np >"$dst" &
  lpid=$!
  for _ in $(seq 100); do ss -ltn 2>/dev/null | grep -q ":$np " && break; sleep 0.02; done
  t0=$(now)
  /usr/bin/time -o "$dir/time.s" -f '%U %S %M' bash -c "cat '$src' | nc -N 127.0.0.1 $np"
  wait $lpid
  [ "$1" = 0 ] || sync "$dst"
  t1=$(now)
  ci=$(tcpu "$dir/time.l") ct=$(tcpu "$dir/time.s")
  cmp -s "$src" "$dst" || { echo "nc copy differs" >&2; exit 1; }
}
copy_cp() { # fsync: 0 or 1
  t0=$(now)
  /usr/bin/time -o "$dir/time" -f '%U %S %M' cp "$src" "$dst"
  [ "$1" = 0 ] || sync "$dst"
  t1=$(now)
  ci=$(tcpu "$dir/time") ct=
}
copy_rsync() { # fsync: 0 or 1
  local f=
  [ "$1" = 0 ] || f=--fsync
  t0=$(now)
  /usr/bin/time -o "$dir/time" -f '%U %S %M' rsync --whole-file $f rsync://127.0.0.1:$rport/data/file "$dst"
  t1=$(now)
  ci=$(tcpu "$dir/time") ct=
  cmp -s "$src" "$dst" || { echo "rsync copy differs" >&2; exit 1; }
}
copy_go() { # streams fsync
  local np rpid
  np=$(free_port)
  rm -f "$dir/recv.err"
  "$ts" recv -listen 127.0.0.1:$np -n "$1" -o "$dst" -fsync=$([ "$2" = 1 ] && echo true || echo false) >"$dir/recv.json" 2>"$dir/recv.err" &
  rpid=$!
  wait_listening "$dir/recv.err"
  t0=$(now)
  "$ts" send -connect 127.0.0.1:$np -n "$1" -i "$src" >"$dir/send.json"
  wait $rpid
  t1=$(now)
  ci=$(jget cpu_seconds "$dir/recv.json") ct=$(jget cpu_seconds "$dir/send.json")
  cmp -s "$src" "$dst" || { echo "tcpstream copy differs" >&2; exit 1; }
}
copy_dd() { # dd flag: how a local copy lands, buffered + fsync or O_DIRECT
  t0=$(now)
  /usr/bin/time -o "$dir/time" -f '%U %S %M' dd if="$src" of="$dst" bs=4M "$1" status=none
  t1=$(now)
  ci=$(tcpu "$dir/time") ct=
}

run_method() {
  rm -f "$dst"
  settle
  case $1 in
  rdmacp) copy_rdmacp ;;
  rdmacp_none) copy_rdmacp --digest none ;;
  rdmacp_q*) copy_rdmacp --qps "${1#rdmacp_q}" ;;
  nc) copy_nc 0 ;;
  nc_fsync) copy_nc 1 ;;
  cp) copy_cp 0 ;;
  cp_fsync) copy_cp 1 ;;
  rsync) copy_rsync 0 ;;
  rsync_fsync) copy_rsync 1 ;;
  go) copy_go 4 1 ;;
  go_nosync) copy_go 4 0 ;;
  dd_fsync) copy_dd conv=fsync ;;
  dd_direct) copy_dd oflag=direct ;;
  esac
}

log "copies of the $size MiB file: ${methods[*]}; then rdmacp cp --qps $qlist"
for i in $(seq 0 "$runs"); do
  for m in "${methods[@]}" $(for q in $qlist; do [ "$q" = 4 ] || echo rdmacp_q$q; done); do
    run_method "$m"
    [ "$i" -gt 0 ] || continue # the warm-up: digests cached, page cache and files settled
    rec "copy.$m" "$(mbps $bytes "$t0" "$t1")"
    rec "cpui.$m" "$(perGB "$ci" $bytes)"
    [ -z "$ct" ] || rec "cput.$m" "$(perGB "$ct" $bytes)"
  done
  [ "$i" -gt 0 ] && log "copy run $i/$runs done"
done
rm -f "$dst"

# --- READ bandwidth against the Go TCP streamer ------------------------------
bench() { # qps depth
  local c0
  c0=$(pcpu $spid)
  "$bin" bench --transport iwarp-soft --json -D "$secs" --qps "$1" --depth "$2" -s 1MiB 127.0.0.1:$port:data/file >"$dir/bench.json" 2>/dev/null
  local ct
  ct=$(awk -v a="$c0" -v b="$(pcpu $spid)" 'BEGIN { printf "%.3f", b - a }')
  local k=bench.q$1.d$2
  rec "$k.avg" "$(jget avg_mb_per_s "$dir/bench.json")"
  rec "$k.min" "$(jget min_mb_per_s "$dir/bench.json")"
  rec "$k.peak" "$(jget peak_mb_per_s "$dir/bench.json")"
  rec "$k.cpui" "$(jget cpu_seconds_per_gb "$dir/bench.json")"
  rec "$k.cput" "$(perGB "$ct" "$(jget bytes "$dir/bench.json")")"
}
bench_crc() { # the same READ test with MPA CRC asked for by the initiator
  local c0 ct
  c0=$(pcpu $spid)
  "$bin" bench --transport iwarp-soft --mpa-crc on --json -D "$secs" --qps 4 --depth 4 -s 1MiB 127.0.0.1:$port:data/file >"$dir/crc.json" 2>/dev/null
  ct=$(awk -v a="$c0" -v b="$(pcpu $spid)" 'BEGIN { printf "%.3f", b - a }')
  rec crcon.avg "$(jget avg_mb_per_s "$dir/crc.json")"
  rec crcon.min "$(jget min_mb_per_s "$dir/crc.json")"
  rec crcon.peak "$(jget peak_mb_per_s "$dir/crc.json")"
  rec crcon.cpui "$(jget cpu_seconds_per_gb "$dir/crc.json")"
  rec crcon.cput "$(perGB "$ct" "$(jget bytes "$dir/crc.json")")"
}
stream() { # streams
  local np rpid
  np=$(free_port)
  rm -f "$dir/recv.err"
  "$ts" recv -listen 127.0.0.1:$np -n "$1" >"$dir/recv.json" 2>"$dir/recv.err" &
  rpid=$!
  wait_listening "$dir/recv.err"
  "$ts" send -connect 127.0.0.1:$np -n "$1" -duration "${secs}s" >"$dir/send.json"
  wait $rpid
  local b
  b=$(jget bytes "$dir/recv.json")
  rec "stream.q$1" "$(awk -v g="$(jget gb_per_s "$dir/recv.json")" 'BEGIN { printf "%.1f", g * 1000 }')"
  rec "stream.q$1.cpui" "$(jget cpu_seconds_per_gb "$dir/recv.json")"
  rec "stream.q$1.cput" "$(perGB "$(jget cpu_seconds "$dir/send.json")" "$b")"
}
log "bandwidth: rdmacp bench vs tcpstream at $qlist streams, depth $dlist, ${secs}s each"
for i in $(seq 1 "$runs"); do
  for q in $qlist; do
    bench "$q" 4
    stream "$q"
  done
  for d in $dlist; do [ "$d" = 4 ] || bench 4 "$d"; done
  bench_crc
  log "bandwidth run $i/$runs done"
done

# --- peak RSS copying a big sparse file -------------------------------------
if [ "$big" -gt 0 ]; then
  log "peak RSS: a $big GiB sparse file"
  truncate -s "${big}G" "$dir/big/sparse"
  bport=$(free_port)
  "$bin" serve --transport iwarp-soft --listen 127.0.0.1:$bport --export big="$dir/big" --log-level warn 2>"$dir/serve-big.log" &
  bpid=$!
  wait_port $bport
  maxrss() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
  peak_anon=0 peak_file=0
  t0=$(now)
  /usr/bin/time -o "$dir/time" -f '%U %S %M' "$bin" cp -q --transport iwarp-soft 127.0.0.1:$bport:big/sparse "$dir/out/sparse" >/dev/null 2>"$dir/cp-big.err" &
  tpid=$!
  while kill -0 $tpid 2>/dev/null; do
    read -r a f < <(awk '/^RssAnon/ { a = $2 } /^RssFile/ { f = $2 } END { print a + 0, f + 0 }' "/proc/$bpid/status")
    [ "$a" -le "$peak_anon" ] || peak_anon=$a
    [ "$f" -le "$peak_file" ] || peak_file=$f
    sleep 0.2
  done
  wait $tpid
  t1=$(now)
  rec big.mbps "$(mbps $((big << 30)) "$t0" "$t1")"
  rec big.init.rss "$(trss "$dir/time")"
  rec big.cpui "$(perGB "$(tcpu "$dir/time")" $((big << 30)))"
  rec big.tgt.hwm "$(awk '/^VmHWM/ { print $2 }' "/proc/$bpid/status")"
  rec big.tgt.anon "$peak_anon"
  rec big.tgt.file "$peak_file"
  # rdmacp verified every chunk; a full cmp of $big GiB would take longer than the copy
  [ "$(stat -c %s "$dir/out/sparse")" = $((big << 30)) ] || { echo "big copy has the wrong size" >&2; exit 1; }
  rm -f "$dir/out/sparse"
  settle
  # the same amount landed locally, buffered + fsync and O_DIRECT
  for f in conv=fsync oflag=direct; do
    t0=$(now)
    /usr/bin/time -o "$dir/time" -f '%U %S %M' dd if=/dev/zero of="$dir/out/dd" bs=4M count=$((big << 8)) "$f" status=none
    t1=$(now)
    rec "big.dd.$f" "$(mbps $((big << 30)) "$t0" "$t1")"
    rec "big.dd.$f.cpu" "$(perGB "$(tcpu "$dir/time")" $((big << 30)))"
    rm -f "$dir/out/dd"
    settle
  done
  kill $bpid
  wait $bpid 2>/dev/null || true
fi

# --- profiles ---------------------------------------------------------------
prof=
if command -v perf >/dev/null && perf record -o /dev/null -q -- true 2>/dev/null; then
  log "profiles"
  prof=1
  "$bin" bench --transport iwarp-soft -D "$secs" --cpuprofile "$dir/bench.pprof" 127.0.0.1:$port:data/file >/dev/null 2>&1 &
  bpid=$!
  sleep 0.3
  perf record -q -F 499 -g -o "$dir/perf.target" -p $spid -- sleep "$((secs > 1 ? secs - 1 : 1))" 2>/dev/null
  wait $bpid
  rm -f "$dst"
  settle
  perf record -q -F 499 -g -o "$dir/perf.cp" -- "$bin" cp -q --transport iwarp-soft 127.0.0.1:$port:data/file "$dst" >/dev/null 2>&1
fi
kill $spid 2>/dev/null || true
measured=$(date -u +%Y-%m-%d) version=$(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown)
load1=$(cut -d' ' -f1-3 /proc/loadavg)
psi=$(awk '/^some/ { sub("avg300=", "", $4); print $4 "%" }' /proc/pressure/cpu 2>/dev/null || echo "n/a")
others=$(ps -eo pcpu=,comm= --sort=-pcpu | awk -v me="$$" '$1 >= 10 && $2 !~ /^(ps|awk|rdmacp|tcpstream|report.sh)$/ { printf "%s%s %s%%", sep, $2, $1; sep = ", " }')
declare -p size runs secs big qlist dlist prof measured version load0 load1 psi others >"$dir/params.sh"
else
  dir=$render samples=$render/samples.tsv bin=$render/rdmacp
  [ -f "$dir/params.sh" ] || { echo "$dir has no params.sh: was it kept by a -k run?" >&2; exit 2; }
  # shellcheck disable=SC1091
  . "$dir/params.sh"
fi
ptop() { # perf file: top symbols by self time
  perf report -i "$1" --no-children --sort sym --stdio -g none 2>/dev/null | grep '%' | head -"$2" |
    awk '{ pct = $1; $1 = ""; $2 = ""; sub(/^ +/, ""); printf "| %s | `%s` |\n", pct, $0 }'
}
cum() { # perf file, pattern: inclusive time of matching symbols
  perf report -i "$1" --children --sort sym --stdio -g none 2>/dev/null | grep '%' | grep -E "$2" | head -"$3" |
    awk '{ pct = $1; $1 = ""; $2 = ""; $3 = ""; sub(/^ +/, ""); printf "| %s | `%s` |\n", pct, $0 }'
}

# --- the report -------------------------------------------------------------
log "writing $out"
# median, min and max of a key's samples
sstat() { awk -F'\t' -v k="$1" '$1 == k { print $2 }' "$samples" | sort -g | awk '
  { a[NR] = $1 } END {
    if (NR == 0) { print "- - -"; exit }
    m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
    print m, a[1], a[NR] }'; }
med() { sstat "$1" | awk '{ print $1 }'; }
cell() { sstat "$1" | awk -v f="${2:-%.0f}" '$1 == "-" { print "–"; exit } { printf f " (" f "–" f ")\n", $1, $2, $3 }'; }
one() { sstat "$1" | awk -v f="${2:-%.0f}" '$1 == "-" { print "–"; exit } { printf f "\n", $1 }'; }
# the ratio of two keys run by run (their samples were taken in turn, so
# the k-th of each pair up and drifts in the machine's load cancel):
# "median (min–max)"
ratio() {
  paste <(awk -F'\t' -v k="$1" '$1 == k { print $2 }' "$samples") <(awk -F'\t' -v k="$2" '$1 == k { print $2 }' "$samples") |
    awk '$1 != "" && $2 > 0 { print $1 / $2 }' | sort -g | awk '
    { a[NR] = $1 } END {
      if (NR == 0) { print "–"; exit }
      m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
      printf "%.2f (%.2f–%.2f)\n", m, a[1], a[NR] }'
}
# met or missed against a threshold; "(within the spread)" when the
# run-by-run min–max of a ratio straddles it
verdict() {
  awk -v r="$1" -v t="$2" -v dir="${3:-ge}" 'BEGIN {
    split(r, f, " "); m = f[1]
    if (m == "–" || m == "") { print "–"; exit }
    v = ((dir == "ge" && m >= t) || (dir == "le" && m <= t)) ? "met" : "**missed**"
    if (f[2] ~ /^\(/) {
      gsub(/[()]/, "", f[2]); split(f[2], mm, "–")
      if (dir == "le") { lo = 1 - mm[2]; hi = 1 - mm[1] } else { lo = mm[1]; hi = mm[2] }
      if (lo < t && hi > t) v = v " (within the spread)"
    }
    print v }'
}
mib() { awk -v k="$1" 'BEGIN { printf "%.0f", k / 1024 }'; }
label() {
  case $1 in
  rdmacp) echo "rdmacp cp (crc32c, verified, fsync)" ;;
  rdmacp_none) echo "rdmacp cp --digest none (fsync)" ;;
  nc) echo "cat \| nc" ;;
  nc_fsync) echo "cat \| nc + fsync" ;;
  cp) echo "cp (copy_file_range)" ;;
  cp_fsync) echo "cp + fsync" ;;
  rsync) echo "rsync --whole-file from rsync --daemon" ;;
  rsync_fsync) echo "rsync --whole-file --fsync" ;;
  go) echo "tcpstream file, 4 streams (pwrite, fsync)" ;;
  go_nosync) echo "tcpstream file, 4 streams, no fsync" ;;
  dd_fsync) echo "local: dd bs=4M conv=fsync (buffered landing)" ;;
  dd_direct) echo "local: dd bs=4M oflag=direct (O_DIRECT landing)" ;;
  esac
}

r_verify=$(ratio copy.rdmacp copy.rdmacp_none)
# verification's share of the copy's CPU: crc32c seconds per GB over the
# copy's initiator + target seconds per GB
v_cpu=$(awk -v m="$(med crc.mbps)" 'BEGIN { if (m == "" || m == "-") print "–"; else printf "%.3f", 1000 / m }')
v_share=$(awk -v v="$v_cpu" -v i="$(med cpui.rdmacp)" -v t="$(med cput.rdmacp)" 'BEGIN { if (v == "–" || i + t == 0) print "–"; else printf "%.3f", v / (i + t) }')
verify_cost=$(awk -v r="${r_verify%% *}" 'BEGIN { if (r == "–") print "–"; else printf "%.2f", 1 - r }')
verify_pct=$(awk -v c="$verify_cost" -v r="$r_verify" 'BEGIN {
  if (c == "–") print "–"; else if (c < 0) printf "none measurable: crc32c/none = %s\n", r; else printf "%.0f%% (crc32c/none = %s)\n", c * 100, r }')
r_bench=$(ratio bench.q4.d4.avg stream.q4)
r_nc=$(ratio copy.rdmacp copy.nc)
r_ncs=$(ratio copy.rdmacp copy.nc_fsync)
r_go=$(ratio copy.rdmacp copy.go)
r_gons=$(ratio copy.rdmacp copy.go_nosync)
rss_i=$(mib "$(med big.init.rss)")
rss_t=$(mib "$(med big.tgt.hwm)")
rss_ok() { awk -v a="$1" 'BEGIN { print (a != "" && a <= 128) ? "met" : "**missed**" }'; }

{
  cat <<EOF
# rdmacp performance

<!-- Generated by bench/report.sh; edit the script, not this file. -->

Measured $measured by \`bench/report.sh -s $size -n $runs -D $secs -b $big\` in one run on one
machine; every figure is the **median of $runs runs** after an untimed warm-up, with the
min–max in brackets. MB is 10^6 bytes. Everything goes over loopback
with the pure-Go \`iwarp-soft\` transport: sender, receiver and the kernel's TCP
stack share the same cores, so these numbers measure CPU cost more than any network.

## Machine

| | |
| --- | --- |
| CPU | $(nproc) × $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo) |
| memory | $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) |
| kernel | $(uname -r) |
| OS | $(. /etc/os-release && echo "$PRETTY_NAME") |
| Go | $(go env GOVERSION) |
| other load | load average $load0 at the start, $load1 at the end; CPU pressure (some, avg300) $psi at the end${others:+; busy at the end: $others} |
| file system | $(df -T "$dir" | awk 'NR == 2 { print $2 }') on $(df "$dir" | awk 'NR == 2 { print $1 }') |
| rdmacp | $version, \`--qps 4 --depth 4 --read-size 1MiB\`, 4 MiB chunks, 32 MiB windows unless noted |

## Headline

| target (issue 7) | measured (medians) | ratio, run by run: median (min–max) | |
| --- | --- | --- | --- |
| \`rdmacp bench\` ≥ 0.85 × Go TCP streamer, 4 streams | $(one bench.q4.d4.avg) vs $(one stream.q4) MB/s | $r_bench | $(verdict "$r_bench" 0.85) |
| \`rdmacp cp\` ≥ 1.5 × \`cat \| nc\` ($size MiB, page-cached) | $(one copy.rdmacp) vs $(one copy.nc) MB/s | $r_nc | $(verdict "$r_nc" 1.5) |
| … against \`cat \| nc\` + fsync (same durability as rdmacp) | $(one copy.rdmacp) vs $(one copy.nc_fsync) MB/s | $r_ncs | $(verdict "$r_ncs" 1.5) |
| \`rdmacp cp\` ≥ 0.9 × Go TCP file copier, 4 streams, both fsync | $(one copy.rdmacp) vs $(one copy.go) MB/s | $r_go | $(verdict "$r_go" 0.9) |
| … against the copier without fsync | $(one copy.rdmacp) vs $(one copy.go_nosync) MB/s | $r_gons | $(verdict "$r_gons" 0.9) |
| verification costs ≤ 10%: its share of the copy's CPU | crc32c at $(one crc.mbps) MB/s = $v_cpu s/GB, of $(one cpui.rdmacp %.2f) + $(one cput.rdmacp %.2f) s/GB (initiator + target) | $(awk -v v="$v_share" 'BEGIN { if (v == "–") print v; else printf "%.0f%%", v * 100 }') | $(verdict "$v_share" 0.10 le) |
| … and in wall-clock time (crc32c vs \`--digest none\`) | $(one copy.rdmacp) vs $(one copy.rdmacp_none) MB/s | $verify_pct | $(verdict "$verify_cost ${r_verify#* }" 0.10 le) |
EOF
  if [ "$big" -gt 0 ]; then
    cat <<EOF
| peak RSS ≤ 128 MiB, $big GiB file: initiator | $rss_i MiB | | $(rss_ok "$rss_i") |
| peak RSS ≤ 128 MiB, $big GiB file: target | $rss_t MiB | | $(rss_ok "$rss_t") |
EOF
  fi
  cat <<EOF

## Copying a $size MiB page-cached file

Wall-clock time of the whole command, process start to exit, destination on the
same disk. rdmacp cp always verifies every chunk (unless \`--digest none\`),
fsyncs the destination and renames it into place; \`cat | nc\`, \`cp\` and rsync
don't fsync unless their "+ fsync" row says so (\`sync FILE\` after, or rsync \`--fsync\`).
CPU is user+system seconds per GB: the initiator (receiving side) from
\`/usr/bin/time\`, the target (sending side) from \`/proc/PID/stat\` of the
daemon (\`cat | nc\`: both ends timed; rsync's daemon side is not measured).

| method | MB/s | initiator CPU s/GB | target CPU s/GB |
| --- | --- | --- | --- |
EOF
  for m in "${methods[@]}"; do
    echo "| $(label "$m") | $(cell copy.$m) | $(one cpui.$m %.2f) | $(one cput.$m %.2f) |"
  done
  cat <<EOF

rdmacp cp over the number of queue pairs (depth 4):

| QPs | MB/s | initiator CPU s/GB | target CPU s/GB |
| --- | --- | --- | --- |
EOF
  for q in $qlist; do
    k=rdmacp_q$q
    [ "$q" = 4 ] && k=rdmacp
    echo "| $q | $(cell copy.$k) | $(one cpui.$k %.2f) | $(one cput.$k %.2f) |"
  done
  cat <<EOF

## READ bandwidth: \`rdmacp bench\` against a Go TCP streamer

\`rdmacp bench -D $secs -s 1MiB\` READs a 32 MiB window of the page-cached file over
and over into registered memory (no verification, no file); \`tcpstream\` sends
a 1 MiB buffer over N TCP connections for $secs s and the receiver throws it away.
One iwarp-soft QP is one TCP connection, so N QPs compare with N streams.
Min and peak are the slowest and fastest 100 ms interval of the run (medians over runs).

| QPs / streams | rdmacp bench avg MB/s | min | peak | tcpstream MB/s | ratio | bench CPU s/GB initiator / target | tcpstream CPU s/GB receiver / sender |
| --- | --- | --- | --- | --- | --- | --- | --- |
EOF
  for q in $qlist; do
    echo "| $q | $(cell bench.q$q.d4.avg) | $(one bench.q$q.d4.min) | $(one bench.q$q.d4.peak) | $(cell stream.q$q) | $(ratio bench.q$q.d4.avg stream.q$q) | $(one bench.q$q.d4.cpui %.2f) / $(one bench.q$q.d4.cput %.2f) | $(one stream.q$q.cpui %.2f) / $(one stream.q$q.cput %.2f) |"
  done
  cat <<EOF

Over loopback neither side asks for MPA's FPDU CRC32c by default
(\`--mpa-crc auto\`: the bytes never leave memory; the chunk digests still
check every byte end to end). The same test with the initiator asking for
it (\`--mpa-crc on\`, as \`auto\` does off loopback), 4 QPs × 4:

| | avg MB/s | min | peak | × tcpstream, 4 streams | CPU s/GB initiator / target |
| --- | --- | --- | --- | --- | --- |
| MPA CRC off (\`rdmacp bench\`) | $(cell bench.q4.d4.avg) | $(one bench.q4.d4.min) | $(one bench.q4.d4.peak) | $(ratio bench.q4.d4.avg stream.q4) | $(one bench.q4.d4.cpui %.2f) / $(one bench.q4.d4.cput %.2f) |
| MPA CRC on (\`--mpa-crc on\`) | $(cell crcon.avg) | $(one crcon.min) | $(one crcon.peak) | $(ratio crcon.avg stream.q4) | $(one crcon.cpui %.2f) / $(one crcon.cput %.2f) |

Over the READ depth, 4 QPs:

| READs in flight per QP | avg MB/s | min | peak | CPU s/GB initiator / target |
| --- | --- | --- | --- | --- |
EOF
  for d in $dlist; do
    echo "| $d | $(cell bench.q4.d$d.avg) | $(one bench.q4.d$d.min) | $(one bench.q4.d$d.peak) | $(one bench.q4.d$d.cpui %.2f) / $(one bench.q4.d$d.cput %.2f) |"
  done
  if [ "$big" -gt 0 ]; then
    cat <<EOF

## Memory: copying a $big GiB sparse file

One \`rdmacp cp\` (crc32c) of a $big GiB sparse file from a freshly started target,
at $(one big.mbps) MB/s (the target hashing the whole file at Open included). Peak RSS of the initiator from \`/usr/bin/time\`
("Maximum resident set size"), of the target from \`VmHWM\` in
\`/proc/PID/status\`, and the target's largest anonymous and file-backed RSS
sampled every 200 ms (file-backed: the pages of mapped windows it touched).

| | peak RSS |
| --- | --- |
| initiator | $rss_i MiB |
| target | $rss_t MiB (anonymous $(mib "$(med big.tgt.anon)") MiB, file-backed $(mib "$(med big.tgt.file)") MiB) |

Landing the same $big GiB locally from \`/dev/zero\` with \`dd bs=4M\`, for scale:

| | MB/s | CPU s/GB |
| --- | --- | --- |
| rdmacp cp of the sparse file (initiator) | $(one big.mbps) | $(one big.cpui %.2f) |
| dd conv=fsync (buffered, then fsync) | $(one big.dd.conv=fsync) | $(one big.dd.conv=fsync.cpu %.2f) |
| dd oflag=direct (O_DIRECT) | $(one big.dd.oflag=direct) | $(one big.dd.oflag=direct.cpu %.2f) |
EOF
  fi
  if [ -n "$prof" ]; then
    cat <<EOF

## Where the time goes

CPU profiles from this run (\`perf record -g\`; self time per symbol, kernel
symbols marked \`[k]\`). The target while \`rdmacp bench\` (4 QPs × 4, 1 MiB
READs) runs against it:

| self | symbol |
| --- | --- |
$(ptop "$dir/perf.target" 12)

The target's time by iwarp-soft function, inclusive:

| incl. | function |
| --- | --- |
$(cum "$dir/perf.target" 'iwarp|target\.' 8)

The initiator of one \`rdmacp cp\` of the $size MiB file:

| self | symbol |
| --- | --- |
$(ptop "$dir/perf.cp" 12)

| incl. | function |
| --- | --- |
$(cum "$dir/perf.cp" 'initiator\.|iwarp|chunker\.|pwrite|Fsync' 12)

The initiator during \`rdmacp bench\` (\`go tool pprof -top\` of \`--cpuprofile\`):

\`\`\`
$(go tool pprof -top -nodecount=12 "$bin" "$dir/bench.pprof" 2>/dev/null | sed -n '/flat%/,$p')
\`\`\`
EOF
  fi
  cat "$repo/bench/performance-notes.md"
} >"$out"
log "done in $(($(date +%s) - started))s: $out"
