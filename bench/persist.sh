#!/usr/bin/env bash
# Persisted digests: the bytes the target reads to hash (rchar from
# /proc/PID/io; its windows are mmapped, so serving adds page faults, not
# rchar; what is left is its sockets' control traffic), and the bytes it
# hashed (its rdmacp_digest_bytes_total), when it serves an unchanged file
#   1. the first time, with an empty state directory,
#   2. the second time, after a restart with the same state directory
#      (goal: 0),
#   3. after a restart with --no-persist-digests (the old behaviour),
#   4. after rdmacp hash into a new state directory, then a restart,
#   5. after an edit with the mtime put back (touch -r): hashed again,
#   6. served the moment it changed (its ctime is now: a copy just landed),
#      then after a restart (goal: 0; #27 saw 704 of 1,024 MiB hashed).
# Each copy goes to /dev/null (verified, then thrown away).
#
#   bench/persist.sh [-s SIZE_MiB] [-d DIR]      (default 4096 MiB)
set -euo pipefail
size=4096 dir=
while getopts s:d: o; do
  case $o in s) size=$OPTARG ;; d) dir=$OPTARG ;; *) exit 2 ;; esac
done
cd "$(dirname "$0")/.."
. bench/lib.sh
[ -n "$dir" ] || dir=$(mktemp -d /var/tmp/rdmacp-persist.XXXXXX)
pid=
cleanup() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/export"
go build -o "$dir/rdmacp" ./cmd/rdmacp
src=$dir/export/file
head -c $((size << 20)) /dev/urandom >"$src"
touch -d '1 hour ago' "$src"
sleep 2.1 # its ctime is now: past the 2 s racy window, its digests may persist
port=$(free_port)
mport=$(free_port)

start() { # start STATE_DIR [FLAGS...]: a daemon, its pid in $pid
  local state=$1
  shift
  "$dir/rdmacp" serve --listen 127.0.0.1:$port --export data="$dir/export" --state-dir "$state" \
    --metrics-listen 127.0.0.1:$mport -q "$@" 2>>"$dir/serve.log" &
  pid=$!
  wait_port $port
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }
rchar() { awk '/^rchar:/ { print $2 }' /proc/$pid/io; }
hashed() { # rdmacp_digest_bytes_total, scraped with bash's /dev/tcp
  exec 3<>/dev/tcp/127.0.0.1/$mport
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  awk '/^rdmacp_digest_bytes_total / { printf "%.0f", $2 }' <&3
  exec 3<&-
}
served() { # served LABEL: copy the file, print what the daemon read meanwhile
  local before after t0 t1 h0 h1
  before=$(rchar) h0=$(hashed)
  t0=$(now)
  "$dir/rdmacp" cp -q 127.0.0.1:$port:data/file /dev/null
  t1=$(now)
  after=$(rchar) h1=$(hashed)
  printf '%-42s rchar %11d B (%.4f of the file)  hashed %11d B  copy %.2f s\n' "$1" $((after - before)) \
    "$(echo "($after - $before) / ($size * 1048576)" | bc -l)" $((h1 - h0)) "$(echo "$t1 - $t0" | bc -l)"
}

echo "file: $size MiB of random data, 4 MiB chunks, crc32c, iwarp-soft on loopback"
start "$dir/state1"
served "1. first serve, empty state dir"
served "   same daemon again (in-memory cache)"
stop
start "$dir/state1"
served "2. after a restart, same state dir"
stop
start "$dir/state1" --no-persist-digests
served "3. after a restart, --no-persist-digests"
stop
"$dir/rdmacp" hash -q --state-dir "$dir/state2" "$src"
start "$dir/state2"
served "4. rdmacp hash, then a new daemon"
stop
ref=$(mktemp "$dir/ref.XXXXXX")
touch -r "$src" "$ref"
printf 'x' | dd of="$src" bs=1 seek=12345 conv=notrunc status=none
touch -r "$ref" "$src"
start "$dir/state1"
served "5. after a touch -r edit, same state dir"
stop
touch -d '1 hour ago' "$src" # a ctime of now, as a file copied in has
start "$dir/state3"
served "6. served the moment it changed"
stop
start "$dir/state3"
served "   after a restart, same state dir"
stop
