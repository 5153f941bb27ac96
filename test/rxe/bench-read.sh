#!/usr/bin/env bash
# test/rxe/bench-read.sh - READ bandwidth in one guest: perftest's
# ib_read_bw, then the ibverbs provider's BenchmarkRead (verbstest.RunBench).
# Runs inside the guest of run.sh:
#
#   test/rxe/run.sh --pkg ./verbs/ibverbs -- test/rxe/bench-read.sh
#
# Environment: SIZE (bytes per READ, default 1048576), ITERS (ib_read_bw
# iterations, default 300), QPS (default "1 4"), BENCH (Go -test.bench
# pattern, default Read/Read/<SIZE>KiB/), BENCHTIME (default 2s).
set -u
: "${RXE_DEV:?run this inside test/rxe/run.sh}" "${RXE_ADDR:?}" "${RXE_GID_INDEX:?}"
SIZE=${SIZE:-1048576} ITERS=${ITERS:-300} QPS=${QPS:-1 4}
BENCH=${BENCH:-Read/Read/$((SIZE / 1024))KiB/} BENCHTIME=${BENCHTIME:-2s}
rc=0
for q in $QPS; do
	echo "--- ib_read_bw -s $SIZE -n $ITERS -q $q"
	timeout 300 ib_read_bw -d "$RXE_DEV" -x "$RXE_GID_INDEX" -F -s "$SIZE" -n "$ITERS" -q "$q" >/tmp/srv.$q 2>&1 &
	srv=$!
	sleep 1
	timeout 300 ib_read_bw -d "$RXE_DEV" -x "$RXE_GID_INDEX" -F -s "$SIZE" -n "$ITERS" -q "$q" "$RXE_ADDR" >/tmp/cli.$q 2>&1 || rc=1
	wait $srv || rc=1
	grep -E '^ *#bytes|^ *[0-9]+ +[0-9]+ ' /tmp/cli.$q || { tail -5 /tmp/srv.$q /tmp/cli.$q; rc=1; }
done
for bin in ${RXE_TEST_BINS:-}; do
	case $bin in *ibverbs*) ;; *) continue ;; esac
	echo "--- $(basename "$bin") -test.bench $BENCH -test.benchtime $BENCHTIME"
	(cd /tmp && "$bin" -test.run '^$' -test.bench "$BENCH" -test.benchtime "$BENCHTIME") || rc=1
done
exit $rc
