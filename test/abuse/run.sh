#!/usr/bin/env bash
# test/abuse/run.sh - rdmacp's abuse suite (issue 14): a real `rdmacp
# serve` on 127.0.0.1 under a 30 s flood of 200 connections that complete
# the MPA exchange and never send Hello (from 127.0.0.2-5, reconnecting
# as they time out or are refused), while 8 `rdmacp cp` copies run from
# 127.0.0.1. Checks: every copy byte-exact; the daemon's RSS and
# descriptors under their bounds, descriptors back to the baseline after;
# fewer than 20 log lines a second. Prints a table of the figures. About
# 35 s.
#
# usage: test/abuse/run.sh [go test flags]
#   RDMACP_BIN=/path/to/rdmacp   test that binary instead of building ./cmd/rdmacp
#
# Prints "SKIP: <reason>" and exits 0 where it can't run (not Linux, no
# go, no /proc); exits non-zero if a check fails.
set -euo pipefail
if [ -n "${RDMACP_BIN:-}" ]; then
  RDMACP_BIN=$(realpath "$RDMACP_BIN")
  export RDMACP_BIN
fi
cd "$(dirname "$0")/../.."

if [ "$(uname -s)" != Linux ]; then
  echo "SKIP: the abuse suite needs Linux (/proc, 127.0.0.0/8 on lo), this is $(uname -s)"
  exit 0
fi
if ! command -v go >/dev/null; then
  echo "SKIP: no go toolchain in PATH"
  exit 0
fi
if [ ! -r /proc/self/status ]; then
  echo "SKIP: no /proc: the daemon's RSS and descriptors can't be measured"
  exit 0
fi

t0=$(date +%s)
rc=0
RDMACP_ABUSE=1 go test -v -count=1 -timeout 5m "$@" ./test/abuse/ || rc=$?
echo "abuse suite: exit $rc after $(( $(date +%s) - t0 ))s"
exit $rc
