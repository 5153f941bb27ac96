#!/usr/bin/env bash
# test/longlink/run.sh - rdmacp over a long link: real serve and cp in two
# network namespaces joined through test/linkemu (the project's userspace
# link emulator: delay below the socket; this kernel has no sch_netem),
# with tbf for a rate. Five cases: 200 ms RTT against the same link with
# no delay (whole-copy and steady rates, and the extra time in RTTs); the
# same with a competing TCP flow taking 5% of a 100 MB/s link; 1% random
# loss at 50 ms RTT against none; and a copy capped at 50 MiB/s by cp
# --bwlimit and by serve --bwlimit; and TestCubic, the 50 ms, lossy and
# 200 ms cases with CUBIC (LONGLINK_CC=cubic sets any case's congestion
# control: topo.sh). About 3 minutes on the 2-core host; bounded at 7.
#
# usage: test/longlink/run.sh [go test flags, e.g. -run TestLongRTT]
#   RDMACP_BIN=/path/to/rdmacp     test that binary instead of building ./cmd/rdmacp
#   LONGLINK_MIN_RATIO=0.7         the bound on far/near (default 0.5)
#
# Prints "SKIP: <reason>" and exits 0 where it can't run (not root, no
# network namespaces, no go); exits non-zero if a case fails.
set -euo pipefail
if [ -n "${RDMACP_BIN:-}" ]; then
  RDMACP_BIN=$(realpath "$RDMACP_BIN")
  export RDMACP_BIN
fi
cd "$(dirname "$0")"
if [ "$(uname -s)" != Linux ]; then
  echo "SKIP: the long-link suite needs Linux network namespaces, this is $(uname -s)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: the long-link suite needs root (network namespaces, AF_PACKET)"
  exit 0
fi
for tool in go ip tc; do
  if ! command -v $tool >/dev/null; then
    echo "SKIP: no $tool in PATH"
    exit 0
  fi
done
probe=llp$$
if ! ip netns add "$probe" 2>/dev/null; then
  echo "SKIP: cannot create a network namespace"
  exit 0
fi
ip netns del "$probe"
t0=$(date +%s)
rc=0
RDMACP_LONGLINK=1 timeout -k 10 420 go test -v -count=1 -timeout 400s "$@" . || rc=$?
echo "long-link suite: exit $rc after $(( $(date +%s) - t0 ))s"
exit $rc
