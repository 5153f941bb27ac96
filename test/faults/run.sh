#!/usr/bin/env bash
# test/faults/run.sh - rdmacp's fault matrix: real serve and cp processes
# through a fault-injecting TCP proxy (test/faultproxy): links that go
# down, a frozen target, a corrupted FPDU, reset QPs, SIGTERM in each
# state. See test/faults/doc.go. Takes a few minutes (the longest case is
# a 60 s outage; the cases run 4 at a time).
#
# usage: test/faults/run.sh [go test flags, e.g. -run 'TestLinkDown']
#   RDMACP_BIN=/path/to/rdmacp   test that binary instead of building ./cmd/rdmacp
#
# Prints "SKIP: <reason>" and exits 0 where the matrix can't run (not
# Linux, no go); exits non-zero if any case fails.
set -euo pipefail
if [ -n "${RDMACP_BIN:-}" ]; then
  RDMACP_BIN=$(realpath "$RDMACP_BIN")
  export RDMACP_BIN
fi
cd "$(dirname "$0")/../.."

if [ "$(uname -s)" != Linux ]; then
  echo "SKIP: the fault matrix needs Linux (/proc, SIGSTOP, process groups), this is $(uname -s)"
  exit 0
fi
if ! command -v go >/dev/null; then
  echo "SKIP: no go toolchain in PATH"
  exit 0
fi
if [ ! -d /proc/self/fd ]; then
  echo "SKIP: no /proc: the daemon's descriptors can't be counted"
  exit 0
fi

t0=$(date +%s)
rc=0
RDMACP_FAULTS=1 go test -v -count=1 -timeout 20m -parallel 4 "$@" ./test/faults/ || rc=$?
echo "fault matrix: exit $rc after $(( $(date +%s) - t0 ))s"
exit $rc
