#!/usr/bin/env bash
# The second copy of an unchanged tree: rdmacp cp -r (rsync's quick check:
# size and mtime, no data read) against rsync -a from an rsync daemon,
# side by side on this machine, over loopback.
#
#   bench/incremental.sh [-n FILES] [-b BYTES] [-r RUNS] [-d DIR]
#
# Makes a tree of FILES (default 10,000) files of BYTES (default 16) bytes
# in 100 directories, copies it once with each tool into its own
# destination, then times RUNS (default 5) second runs of each, taking
# turns, and prints the medians and the ratio rdmacp / rsync (at most 1.0
# is the goal). Each run is the whole command: start, connect, compare,
# exit. rsync is installed with apt-get if it is missing.
set -euo pipefail
files=10000 bytes=16 runs=5 dir=
while getopts n:b:r:d: o; do
  case $o in n) files=$OPTARG ;; b) bytes=$OPTARG ;; r) runs=$OPTARG ;; d) dir=$OPTARG ;; *) exit 2 ;; esac
done
cd "$(dirname "$0")/.."
. bench/lib.sh
if ! command -v rsync >/dev/null; then
  apt-get update -qq && apt-get install -y -qq rsync >/dev/null
fi
[ -n "$dir" ] || dir=$(mktemp -d /var/tmp/rdmacp-incr.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; wait; rm -rf "$dir"' EXIT
mkdir -p "$dir/export/tree" "$dir/out.rdmacp" "$dir/out.rsync"
bin=$dir/rdmacp
go build -o "$bin" ./cmd/rdmacp
python3 - "$dir/export/tree" "$files" "$bytes" <<'PY'
import os, sys
root, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    d = os.path.join(root, "d%03d" % (i * 100 // n))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d" % i), "wb") as f:
        f.write(os.urandom(size))
PY
port=$(free_port)
"$bin" serve --transport iwarp-soft --listen 127.0.0.1:$port --export data="$dir/export" --log-level warn &
rport=$(free_port)
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
wait_port $port
wait_port $rport

rd() { "$bin" cp -r -q --transport iwarp-soft 127.0.0.1:$port:data/tree "$dir/out.rdmacp/"; }
rs() { rsync -a rsync://127.0.0.1:$rport/data/tree "$dir/out.rsync/"; }
rd # the first copies, not timed
rs
# A second run that reads anything is not the quick check this measures.
"$bin" cp -r --json --transport iwarp-soft 127.0.0.1:$port:data/tree "$dir/out.rdmacp/" >"$dir/check.json"
for want in '"bytes_read":0,' '"files_failed":0,' "\"regular_files\":$files,"; do
  grep -q "$want" "$dir/check.json" || { echo "rdmacp's second run is not a quick check (want $want):" >&2; cat "$dir/check.json" >&2; exit 1; }
done

secs() { local t0 t1; t0=$(now); "$@"; t1=$(now); awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'; }
a= b=
for _ in $(seq "$runs"); do
  a="$a $(secs rd)"
  b="$b $(secs rs)"
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
ma=$(echo "$a" | median) mb=$(echo "$b" | median)
echo "second run of an unchanged tree of $files files x $bytes B, $runs runs each, median seconds:"
printf '  %-30s %7ss   (runs:%s)\n' "rdmacp cp -r" "$ma" "$a" "rsync -a (daemon)" "$mb" "$b"
awk -v a="$ma" -v b="$mb" 'BEGIN { printf "rdmacp / rsync: %.2f\n", a / b }'
