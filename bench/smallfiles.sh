#!/usr/bin/env bash
# Copies a tree of many small files (default 10,000 x 4 KiB) over loopback
# with rdmacp cp -r (packed, and --no-pack) and with an rsync daemon, and
# prints each one's time and rsync's time divided by rdmacp's.
#
#   bench/smallfiles.sh [-n FILES] [-k KiB] [-r RUNS] [-d DIR]
#
# Both ends are on this machine; the tree is page-cached. Each copy goes
# into an empty directory. rdmacp verifies every file (crc32c) and syncs
# the file system before renaming them into place; rsync is shown as it
# runs by default (no fsync), and with `sync -f` of the destination after.
set -euo pipefail
files=10000 kib=4 runs=3 dir=
while getopts n:k:r:d: o; do
  case $o in n) files=$OPTARG ;; k) kib=$OPTARG ;; r) runs=$OPTARG ;; d) dir=$OPTARG ;; *) exit 2 ;; esac
done
cd "$(dirname "$0")/.."
command -v rsync >/dev/null || { echo "rsync is not installed" >&2; exit 1; }
[ -n "$dir" ] || dir=$(mktemp -d /var/tmp/rdmacp-small.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
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
port=$((20000 + RANDOM % 20000))
rport=$((port + 1))
"$bin" serve --transport iwarp-soft --listen 127.0.0.1:$port --export data="$dir/export" --log-level warn &
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
sleep 1

now() { date +%s.%N; }
declare -A res
record() { res[$1]="${res[$1]:-} $2"; }
run() { # name command...
  local name=$1; shift
  rm -rf "$dir/out"; mkdir -p "$dir/out"; sync
  local t0 t1; t0=$(now); "$@" >/dev/null; t1=$(now)
  [ "$(find "$dir/out" -type f | wc -l)" -eq "$files" ] || { echo "$name: wrong file count" >&2; exit 1; }
  record "$name" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
}
for _ in $(seq "$runs"); do
  run rdmacp "$bin" cp -r -q --transport iwarp-soft 127.0.0.1:$port:data/tree "$dir/out/"
  run rdmacp-no-pack "$bin" cp -r -q --no-pack --transport iwarp-soft 127.0.0.1:$port:data/tree "$dir/out/"
  run rsync rsync -a rsync://127.0.0.1:$rport/data/tree "$dir/out/"
  run rsync+sync sh -c "rsync -a rsync://127.0.0.1:$rport/data/tree '$dir/out/' && sync -f '$dir/out'"
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "$files files x $kib KiB, $runs runs, median seconds:"
declare -A med
for k in rdmacp rdmacp-no-pack rsync rsync+sync; do
  med[$k]=$(echo "${res[$k]}" | median)
  printf '  %-16s %8ss   (runs:%s)\n' "$k" "${med[$k]}" "${res[$k]}"
done
awk -v r="${med[rsync]}" -v rs="${med[rsync+sync]}" -v p="${med[rdmacp]}" -v np="${med[rdmacp-no-pack]}" 'BEGIN {
  printf "rsync / rdmacp: %.2fx (rsync+sync / rdmacp: %.2fx); rdmacp --no-pack / rdmacp: %.2fx\n", r / p, rs / p, np / p }'
