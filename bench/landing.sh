#!/usr/bin/env bash
# The landing benchmark (#27): rdmacp cp of one page-cached file into
# tmpfs and onto the disk, against the plain Go 4-stream copier
# (bench/tcpstream), cat | nc, dd (the one-copy ceiling) and rdmacp bench
# (no landing), interleaved in one run, medians of RUNS rounds, with
# ratios and the receiving side's CPU seconds per GB (bench/ab.sh -x).
#
#   bench/landing.sh [-s SIZE_MiB] [-n RUNS] [-t TMPFS_DIR] [-D DISK_DIR] [NAME=BINARY...]
#
# TMPFS_DIR defaults to /dev/shm, DISK_DIR to /var/tmp; an empty one is
# skipped. A mapped landing is chosen only in a tmpfs with huge pages
# (mount -t tmpfs -o huge=always,size=3G tmpfs DIR for -t DIR).
#
# Without binaries it builds this tree's rdmacp; give two (before=...
# after=...) to compare builds, alternating in the same rounds.
set -euo pipefail
size=1024 runs=3 tmpfs=/dev/shm disk=/var/tmp
while getopts s:n:t:D: o; do
  case $o in s) size=$OPTARG ;; n) runs=$OPTARG ;; t) tmpfs=$OPTARG ;; D) disk=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
cd "$(dirname "$0")/.."
bins=("$@")
if [ ${#bins[@]} = 0 ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  go build -o "$tmp/rdmacp" ./cmd/rdmacp
  bins=("this=$tmp/rdmacp")
fi
for where in "$tmpfs" "$disk"; do
  [ -n "$where" ] || continue # -t "" or -D "": skip it
  d=$(mktemp -d "$where/rdmacp-landing.XXXXXX")
  echo "== into $where"
  bench/ab.sh -x -s "$size" -n "$runs" -d "$d/run" "${bins[@]}" 2>/dev/null
  rm -rf "$d"
done
