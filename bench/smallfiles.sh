#!/usr/bin/env bash
# Copies a tree of many small files (default 10,000 x 4 KiB) over loopback
# with rdmacp cp -r (packed, and --no-pack), with an rsync daemon and with
# `tar | nc`, and prints each one's time and the others' time divided by
# rdmacp's.
#
#   bench/smallfiles.sh [-n FILES] [-k KiB] [-r RUNS] [-d DIR | -e] [-R] [-o BIN]
#
# Both ends are on this machine; the tree is page-cached. Each copy goes
# into a new empty directory, DIR/out.N (DIR defaults to a new directory in
# /var/tmp; give -d /dev/shm/x to take the disk out of it). -e (root only)
# makes DIR a fresh ext4 file system in a loop file instead: ext4 creates
# files far more slowly for a few minutes after many were deleted (it
# skips recently freed inodes), so a used file system gives every tool
# whatever the last deletions left it. rdmacp
# verifies every file (crc32c) and syncs the file system before the tree
# is renamed into place; rsync and tar are shown as they run by default
# (no fsync), and with `sync -f` of the destination after.
#
# -R deletes the last copy before the next one starts (outside the
# timing), so that each tool writes into memory the kernel freed a moment
# ago. Without it every copy lands in RAM the guest has never touched, and
# in a VM (this firecracker guest) the first touch of a page costs a trip
# to the host: 10,000 x 4 KiB into tmpfs took rdmacp 0.16 s into reused
# memory and 0.38-0.48 s into fresh, rsync+sync 0.45 s and 0.8 s. Both
# figures are real; they answer different questions (a nightly job into
# a long-lived tmpfs, or the first copy after boot), so quote which.
#
# -o BIN adds BIN (another rdmacp, say a build of main) as "before", with
# its own daemon, run in turn with the others in every round: a before and
# after under the same load. Each rdmacp's and rsync's CPU (user + system
# seconds per 1,000 files, of the client and of its daemon, the daemon's
# reaped children included: rsync's per-connection sender) and the
# client's peak RSS are printed too, and the load averages at the start
# and the end: trust the ratios of one run more than any one time.
set -euo pipefail
files=10000 kib=4 runs=3 dir= ext4= reuse= old=
while getopts n:k:r:d:eRo: o; do
  case $o in n) files=$OPTARG ;; k) kib=$OPTARG ;; r) runs=$OPTARG ;; d) dir=$OPTARG ;; e) ext4=1 ;; R) reuse=1 ;; o) old=$(realpath "$OPTARG") ;; *) exit 2 ;; esac
done
cd "$(dirname "$0")/.."
for c in rsync tar nc /usr/bin/time; do
  command -v $c >/dev/null || { echo "$c is not installed" >&2; exit 1; }
done
if [ -n "$ext4" ] && [ -n "$dir" ]; then
  echo "-e makes its own directory: give -d or -e, not both" >&2
  exit 2
fi
[ -n "$dir" ] || dir=$(mktemp -d /var/tmp/rdmacp-small.XXXXXX)
img= mounted=
trap 'kill $(jobs -p) 2>/dev/null; wait; if [ -n "$img" ]; then [ -z "$mounted" ] || umount "$dir"; rm -f "$img"; rmdir "$dir"; else rm -rf "$dir"; fi' EXIT
if [ -n "$ext4" ]; then
  # room for every round's copies (6 per round), data and inodes
  img=$(mktemp /var/tmp/rdmacp-small-ext4.XXXXXX)
  truncate -s $(( (runs + 1) * 6 * files * (kib + 4) / 1024 + 1024 ))M "$img"
  mkfs.ext4 -q -F -N $(( (runs + 2) * 6 * (files + files / 50) )) "$img"
  mount -o loop "$img" "$dir"
  mounted=1
fi
mkdir -p "$dir/export/tree"
bin=$dir/rdmacp
go build -o "$bin" ./cmd/rdmacp
python3 - "$dir/export/tree" "$files" "$kib" <<'PY'
import os, sys
root, n, kib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    d = os.path.join(root, "d%03d" % (i // 100))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d" % i), "wb") as f:
        f.write(os.urandom(kib * 1024))
PY
cat "$dir"/export/tree/*/* >/dev/null
sync # the new tree's own writeback would slow the first runs down
port=$((20000 + RANDOM % 20000))
rport=$((port + 1)) tport=$((port + 2))
"$bin" serve --transport iwarp-soft --listen 127.0.0.1:$port --export data="$dir/export" --log-level warn &
spid=$!
oport=$((port + 3)) opid=
if [ -n "$old" ]; then
  "$old" serve --transport iwarp-soft --listen 127.0.0.1:$oport --export data="$dir/export" --log-level warn &
  opid=$!
fi
# cpu PID: its user + system clock ticks so far, its reaped children's too
cpu() { awk '{ print $14 + $15 + $16 + $17 }' "/proc/$1/stat"; }
cat >"$dir/rsyncd.conf" <<CONF
port = $rport
address = 127.0.0.1
use chroot = false
pid file = $dir/rsyncd.pid
[data]
  path = $dir/export
  read only = true
CONF
rsync --daemon --no-detach --config="$dir/rsyncd.conf" &
rpid=$!
sleep 1
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"

now() { date +%s.%N; }
# fresh points DIR/out at a new empty directory: nothing is deleted while
# the runs go on (deleting 10,000 files just before creating 10,000 more
# slows ext4 down for seconds on this VM, whoever creates them).
nout=0
fresh() {
  [ -z "$reuse" ] || [ $nout = 0 ] || rm -rf "$dir/out.$nout"
  nout=$((nout + 1))
  mkdir "$dir/out.$nout"
  ln -sfn "out.$nout" "$dir/out"
  sync
}
declare -A res
warm=1 # the first round is a warm-up, not recorded
record() { [ $warm = 1 ] || res[$1]="${res[$1]:-} $2"; }
declare -A cpcpu dcpu rss
hz=$(getconf CLK_TCK)
run() { # name command...
  local name=$1; shift
  fresh
  local d=${daemon:-} d0=0 d1=0
  [ -z "$d" ] || d0=$(cpu "$d")
  local t0 t1; t0=$(now); /usr/bin/time -f '%U %S %M' -o "$dir/cp.cpu" "$@" >/dev/null; t1=$(now)
  [ -z "$d" ] || d1=$(cpu "$d")
  [ "$(find "$dir/out/" -type f | wc -l)" -eq "$files" ] || { echo "$name: wrong file count" >&2; exit 1; }
  record "$name" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
  if [ $warm = 0 ] && [ -n "$d" ]; then
    cpcpu[$name]=$(awk -v a="${cpcpu[$name]:-0}" '{ printf "%.3f", a + $1 + $2 }' "$dir/cp.cpu")
    dcpu[$name]=$(awk -v a="${dcpu[$name]:-0}" -v t=$((d1 - d0)) -v hz="$hz" 'BEGIN { printf "%.3f", a + t / hz }')
    rss[$name]=$(awk -v a="${rss[$name]:-0}" '{ printf "%d", ($3 > a ? $3 : a) }' "$dir/cp.cpu")
  fi
}
for round in $(seq 0 "$runs"); do
  [ "$round" = 0 ] || warm=0
  daemon=$spid run rdmacp "$bin" cp -r -q --transport iwarp-soft 127.0.0.1:$port:data/tree "$dir/out/"
  [ -z "$old" ] || daemon=$opid run before "$old" cp -r -q --transport iwarp-soft 127.0.0.1:$oport:data/tree "$dir/out/"
  daemon=$spid run rdmacp-no-pack "$bin" cp -r -q --no-pack --transport iwarp-soft 127.0.0.1:$port:data/tree "$dir/out/"
  daemon=$rpid run rsync rsync -a rsync://127.0.0.1:$rport/data/tree "$dir/out/"
  run rsync+sync sh -c "rsync -a rsync://127.0.0.1:$rport/data/tree '$dir/out/' && sync -f '$dir/out'"
  for sync in 0 1; do
    # the listener's start-up is outside the timing: it starts first
    # and waits for the connection
    fresh
    (nc -l 127.0.0.1 $tport | tar -C "$dir/out" -xf -) &
    lp=$!
    sleep 0.2
    t0=$(now)
    tar -C "$dir/export" -cf - tree | nc -N 127.0.0.1 $tport
    wait $lp
    [ $sync = 0 ] || sync -f "$dir/out"
    t1=$(now)
    [ "$(find "$dir/out/" -type f | wc -l)" -eq "$files" ] || { echo "tar: wrong file count" >&2; exit 1; }
    record "tar|nc$([ $sync = 1 ] && echo +sync)" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "$files files x $kib KiB into $(df --output=fstype "$dir" | tail -1)$([ -n "$img" ] && echo " (fresh, in a loop file)")$([ -n "$reuse" ] && echo " (-R: into memory the last copy freed)"), $runs runs after a warm-up round, median seconds:"
declare -A med
for k in rdmacp ${old:+before} rdmacp-no-pack rsync rsync+sync tar\|nc tar\|nc+sync; do
  med[$k]=$(echo "${res[$k]}" | median)
  printf '  %-16s %8ss   (runs:%s)\n' "$k" "${med[$k]}" "${res[$k]}"
done
for k in rdmacp ${old:+before} rdmacp-no-pack rsync; do
  d=$spid
  case $k in before) d=$opid ;; rsync) d=$rpid ;; esac
  awk -v k="$k" -v c="${cpcpu[$k]}" -v d="${dcpu[$k]}" -v n=$((runs * files)) -v m="${rss[$k]}" -v r="$(ps -o rss= -p "$d")" \
    'BEGIN { printf "  %-16s CPU s per 1k files: client %.4f, daemon %.4f; client peak RSS %d MiB, daemon RSS now %d MiB\n", k, c / n * 1000, d / n * 1000, m / 1024, r / 1024 }'
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
awk -v r="${med[rsync]}" -v rs="${med[rsync+sync]}" -v t="${med[tar|nc]}" -v ts="${med[tar|nc+sync]}" \
  -v p="${med[rdmacp]}" -v np="${med[rdmacp-no-pack]}" 'BEGIN {
  printf "rsync / rdmacp: %.2fx (rsync+sync / rdmacp: %.2fx)\n", r / p, rs / p
  printf "tar|nc / rdmacp: %.2fx (tar|nc+sync / rdmacp: %.2fx)\n", t / p, ts / p
  printf "rdmacp --no-pack / rdmacp: %.2fx\n", np / p }'
[ -z "$old" ] || awk -v r="${med[rsync]}" -v rs="${med[rsync+sync]}" -v b="${med[before]}" -v p="${med[rdmacp]}" 'BEGIN {
  printf "before: rsync / before: %.2fx (rsync+sync / before: %.2fx); before / rdmacp: %.2fx\n", r / b, rs / b, b / p }'
