#!/usr/bin/env bash
# test/abuse/run.sh - rdmacp's abuse suite (issue 14), against real
# `rdmacp serve` and `rdmacp cp` processes on loopback, every loop bounded
# in count and time. About 100 s on 2 cores. Each test prints a table of
# its figures.
#   - a 30 s flood of 200 connections that complete the MPA exchange and
#     never send Hello (from 127.0.0.2-11: they fill all 128 handshake
#     slots), while 8 copies run from 127.0.0.1: every copy byte-exact
#     within 20 s; the daemon's RSS and descriptors under their bounds,
#     descriptors back to the baseline after; fewer than 20 log lines a
#     second.
#   - the same flood from 127.0.0.1, the copies' own address (one host,
#     a NAT): every copy byte-exact within 20 s, the same bounds.
#   - a single-file export swapped after start (a symlink to a secret,
#     then another regular file): refused, exit 5, nothing at DEST.
#   - a procfs file (exported itself, and bind-mounted into a directory
#     export: root) refused, exit 5, "pseudo file system"; cp -r reports
#     it failed, never ok with 0 bytes.
#   - an in-place edit keeping size and mtime (touch -r) after the
#     digests were cached: the next copies byte-exact.
#   - a cp SIGSTOPped mid-copy against --idle-timeout 3s: the daemon's
#     descriptors back to the baseline within the idle timeout + 2 s.
#   - 100,000 connections (at most 60 s) that each get a control QP and
#     close at once, from 127.0.0.10-25: RSS flat (within 16 MiB of the
#     10k sample), descriptors back to the baseline.
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
