#!/usr/bin/env bash
# test/trees/run.sh - rdmacp's large-tree suite (see test/trees/doc.go):
# 1,000,000 empty files in 10,101 directories copied by real serve and cp
# processes, peak RSS <= 128 MiB and <= 1200 descriptors on each side,
# the copy identical; and a 100,000-file --partial copy SIGKILLed halfway
# and resumed. About 2-3 min on 2 cores; needs ~3 GiB of tmpfs (/dev/shm,
# or RDMACP_TREES_DIR).
#
# usage: test/trees/run.sh [go test flags, e.g. -run TestKillAndResume]
#   RDMACP_BIN=/path/to/rdmacp   test that binary instead of building ./cmd/rdmacp
set -euo pipefail
if [ -n "${RDMACP_BIN:-}" ]; then
  RDMACP_BIN=$(realpath "$RDMACP_BIN")
  export RDMACP_BIN
fi
cd "$(dirname "$0")/../.."
if [ "$(uname -s)" != Linux ]; then
  echo "SKIP: the large-tree suite reads /proc (VmHWM, fds), this is $(uname -s)"
  exit 0
fi
if ! command -v go >/dev/null; then
  echo "SKIP: no go toolchain in PATH"
  exit 0
fi
dir=${RDMACP_TREES_DIR:-/dev/shm}
if [ ! -d "$dir" ] || [ ! -w "$dir" ]; then
  echo "SKIP: $dir is not a writable directory (set RDMACP_TREES_DIR)"
  exit 0
fi
avail=$(df -k --output=avail "$dir" | tail -1)
if [ "$avail" -lt $((3 * 1024 * 1024)) ]; then
  echo "SKIP: $dir has $((avail / 1024)) MiB free; the suite needs 3 GiB"
  exit 0
fi
inodes=$(df --output=iavail "$dir" | tail -1)
if [ "$inodes" != "-" ] && [ "$inodes" -lt 2100000 ]; then
  echo "SKIP: $dir has $inodes free inodes; the suite needs 2,100,000"
  exit 0
fi
t0=$(date +%s)
rc=0
RDMACP_TREES=1 RDMACP_TREES_DIR=$dir go test -v -count=1 -timeout 15m "$@" ./test/trees/ || rc=$?
echo "large-tree suite: exit $rc after $(( $(date +%s) - t0 ))s"
exit $rc
