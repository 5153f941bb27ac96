#!/usr/bin/env bash
# test/rails/run.sh - rdmacp's multi-rail suite: two network namespaces
# joined by two veth pairs, each limited to 1 Gbit/s with tbf on the
# target's side, real `rdmacp serve` and `rdmacp cp` in them
# (test/netlab builds the network). Cases: two rails reach >= 1.8x one
# rail on a 512 MiB copy; a rail set down mid-copy, and the copy ends
# byte-exact on the other. Takes about a minute.
#
# usage: test/rails/run.sh [go test flags, e.g. -run TestRailDownMidCopy]
#   RDMACP_BIN=/path/to/rdmacp   test that binary instead of building ./cmd/rdmacp
#
# Prints "SKIP: <reason>" and exits 0 where it can't run (not Linux, not
# root, no ip/tc, no netns); exits non-zero if a case fails.
set -euo pipefail
if [ -n "${RDMACP_BIN:-}" ]; then
  RDMACP_BIN=$(realpath "$RDMACP_BIN")
  export RDMACP_BIN
fi
cd "$(dirname "$0")/../.."

if [ "$(uname -s)" != Linux ]; then
  echo "SKIP: the rails suite needs Linux network namespaces, this is $(uname -s)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: the rails suite needs root (ip netns, veth, tc)"
  exit 0
fi
for tool in go ip tc; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: no $tool in PATH"
    exit 0
  fi
done

t0=$(date +%s)
rc=0
RDMACP_RAILS=1 RDMACP_NETLAB=1 go test -v -count=1 -timeout 10m "$@" ./test/netlab/ ./test/rails/ || rc=$?
echo "rails suite: exit $rc after $(( $(date +%s) - t0 ))s"
exit $rc
