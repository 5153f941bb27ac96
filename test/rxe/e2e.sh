#!/usr/bin/env bash
# test/rxe/e2e.sh - rdmacp end to end over real verbs (rdma_rxe), inside
# the guest of run.sh, which builds rdmacp with -tags rdma and runs this:
#
#   test/rxe/run.sh --e2e [--perf]            # after the ibverbs tests
#   test/rxe/run.sh --e2e --no-tests          # only this
#
# What it checks, against one `rdmacp serve --transport ibverbs` in the
# background:
#   - the target logs the transport it uses (ibverbs);
#   - `rdmacp cp --transport ibverbs` of files of 0 B, 1 B, an odd size
#     and 100 MiB of random bytes: exit 0, sha256 of source and copy
#     equal, the --json summary names "transport":"ibverbs ...";
#   - `rdmacp ls` (exports, -l, --json) shows the files with their sizes;
#   - a missing file exits 5, a wrong secret exits 4;
#   - four initiators at once; an initiator killed mid-copy (the target
#     ends its session and goes on serving); a target killed mid-copy
#     (cp exits 3 promptly, leaving no file);
#   - connects ended in flight: ls -l (which closes as its data QPs
#     join) and cp interrupted (SIGINT) at 40-640 ms: no crash, exit 0
#     or 130, and the target holds no more cm_ids or QPs afterwards
#     (rdma resource show);
#   - the staging warning ("staging windows through registered bounce
#     buffers") appears exactly once on Linux <= 6.1, whose rxe can't
#     register read-only file mappings (EFAULT), and never on >= 6.12,
#     which registers the file mapping itself (zero-copy);
#   - the target stops on SIGTERM within 30 s (no QP teardown stalls) and
#     the kernel logged no WARNING/BUG meanwhile.
# Every command runs under timeout(1): a hung connection fails the run.
#
# With --perf (or E2E_PERF=1) it then measures, E2E_RUNS times each
# (default 3; the median is reported), ib_read_bw -s 1 MiB with -q 4 and
# -q 1 against `rdmacp cp --qps 4` / `--qps 1` of the 100 MiB file, and
# prints a table with the ratio rdmacp/ib_read_bw. cp's rate is its
# --json mb_per_s: the whole copy (open, READs, per-chunk CRC32C checks,
# writing the destination, fsync, rename), not the wire alone.
#
# Environment: RDMACP (the binary; default /run/rxe-job/bin/rdmacp),
# E2E_PORT (default 7471), E2E_BIG_MIB (default 100), E2E_RUNS (default 3),
# E2E_EXPECT_STAGED=0|1 (override the kernel-version expectation),
# E2E_KEEP=1 (keep the work directory).
set -u
: "${RXE_DEV:?run this inside test/rxe/run.sh}" "${RXE_ADDR:?}" "${RXE_GID_INDEX:?}"
PERF=${E2E_PERF:-0}
while [ $# -gt 0 ]; do
	case $1 in
	--perf) PERF=1; shift ;;
	*) echo "usage: $0 [--perf]" >&2; exit 2 ;;
	esac
done
RDMACP=${RDMACP:-/run/rxe-job/bin/rdmacp}
PORT=${E2E_PORT:-7471}
BIG_MIB=${E2E_BIG_MIB:-100}
RUNS=${E2E_RUNS:-3}
KERNEL=${RXE_KERNEL:-$(uname -r)}
[ -x "$RDMACP" ] || { echo "e2e: FAIL: no rdmacp binary at $RDMACP"; exit 1; }

W=$(mktemp -d /tmp/rdmacp-e2e.XXXXXX)
SRC=$W/src DST=$W/dst
mkdir -p "$SRC" "$DST"
(umask 077; echo "e2e-secret-$$-$RANDOM-$RANDOM" >"$W/secret") # serve refuses a secret others can read
T=(--transport ibverbs -d "$RXE_DEV" --secret-file "$W/secret")
REMOTE=$RXE_ADDR:$PORT

FAILS=0 SRV=
pass() { echo "e2e: ok   $*"; }
fail() { echo "e2e: FAIL $*"; FAILS=$((FAILS + 1)); }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
cleanup() {
	[ -n "$SRV" ] && kill -KILL "$SRV" 2>/dev/null
	[ "${E2E_KEEP:-0}" = 1 ] || rm -rf "$W"
}
trap cleanup EXIT
DMESG0=$(dmesg 2>/dev/null | wc -l)

# ------------------------------------------------------------ files
t=$(now)
: >"$SRC/empty"
printf 'x' >"$SRC/one"
head -c 9441281 /dev/urandom >"$SRC/odd" # 9 MiB + 4097: 3 chunks, the last partial, not page-aligned
head -c $((BIG_MIB << 20)) /dev/urandom >"$SRC/big"
echo "e2e: kernel $KERNEL, source files ready in $(since "$t")s: $(cd "$SRC" && stat -c '%n=%s' empty one odd big | tr '\n' ' ')"

# ------------------------------------------------------------ target
timeout -k 5 900 "$RDMACP" serve "${T[@]}" --listen "$REMOTE" --export "data=$SRC" 2>"$W/serve.log" &
SRV=$!
up=0
for _ in $(seq 300); do
	grep -q 'msg=serving' "$W/serve.log" 2>/dev/null && { up=1; break; }
	kill -0 "$SRV" 2>/dev/null || break
	sleep 0.1
done
if [ $up = 0 ]; then
	fail "target did not start"
	cat "$W/serve.log"
	exit 1
fi
if grep -q 'msg=serving.*transport="\{0,1\}ibverbs' "$W/serve.log"; then
	pass "target logs its transport: $(grep -o 'transport="[^"]*"' "$W/serve.log" | head -1)"
else
	fail "target does not log transport ibverbs"
	grep 'msg=serving' "$W/serve.log"
fi

# cp NAME [cp flags...]: copy data/NAME to $DST/NAME, check it.
cpcheck() {
	local name=$1 out=$W/cp.$1.json t rc
	shift
	rm -f "$DST/$name"
	t=$(now)
	timeout -k 5 180 "$RDMACP" cp "${T[@]}" --json "$@" "$REMOTE:data/$name" "$DST/$name" >"$out" 2>"$W/cp.$name.err"
	rc=$?
	local secs
	secs=$(since "$t")
	if [ $rc != 0 ]; then
		fail "cp $name: exit $rc after ${secs}s"
		cat "$out" "$W/cp.$name.err"
		return 1
	fi
	local a b
	a=$(sha256sum <"$SRC/$name" | cut -c1-64)
	b=$(sha256sum <"$DST/$name" 2>/dev/null | cut -c1-64)
	if [ "$a" != "$b" ]; then
		fail "cp $name: sha256 differs: source $a, copy ${b:-missing}"
		return 1
	fi
	if ! grep -q '"message_type":"summary".*"transport":"ibverbs' "$out"; then
		fail "cp $name: --json summary does not say \"transport\":\"ibverbs"
		cat "$out"
		return 1
	fi
	local mb
	mb=$(sed -n 's/.*"message_type":"summary".*"mb_per_s":\([0-9.eE+-]*\).*/\1/p' "$out" | tail -1)
	pass "cp $name ($(stat -c %s "$SRC/$name") B): sha256 ${a:0:16}.. matches, ${secs}s wall, mb_per_s ${mb:-?} $*"
}

# ------------------------------------------------------------ copies
for f in empty one odd big; do
	cpcheck "$f"
done
grep -h -o '"transport":"[^"]*"' "$W/cp.big.json" | head -1 | sed 's/^/e2e:      /'

# Human output: the transport line on stderr.
rm -f "$DST/one"
if timeout -k 5 60 "$RDMACP" cp "${T[@]}" "$REMOTE:data/one" "$DST/" >"$W/cp.h.out" 2>"$W/cp.h.err" &&
	grep -q '^transport: ibverbs' "$W/cp.h.err" && cmp -s "$SRC/one" "$DST/one"; then
	pass "cp (text output) says: $(grep '^transport:' "$W/cp.h.err")"
else
	fail "cp (text output)"
	cat "$W/cp.h.out" "$W/cp.h.err"
fi

# ------------------------------------------------------------ ls
if timeout -k 5 60 "$RDMACP" ls "${T[@]}" "$REMOTE:" >"$W/ls.0" 2>"$W/ls.0.err" && grep -qx 'data/' "$W/ls.0"; then
	pass "ls $REMOTE: lists the export: $(tr '\n' ' ' <"$W/ls.0")"
else
	fail "ls of the exports"
	cat "$W/ls.0" "$W/ls.0.err"
fi
if timeout -k 5 60 "$RDMACP" ls -l "${T[@]}" "$REMOTE:data" >"$W/ls.l" 2>"$W/ls.l.err"; then
	ok=1
	for f in empty one odd big; do
		awk -v n="$f" -v s="$(stat -c %s "$SRC/$f")" '$NF == n && $2 == s { found = 1 } END { exit !found }' "$W/ls.l" || ok=0
	done
	if [ $ok = 1 ]; then pass "ls -l data: names and sizes match"; else
		fail "ls -l data: names or sizes differ"
		cat "$W/ls.l"
	fi
else
	fail "ls -l data"
	cat "$W/ls.l" "$W/ls.l.err"
fi
if timeout -k 5 60 "$RDMACP" ls --json "${T[@]}" "$REMOTE:data" >"$W/ls.j" 2>"$W/ls.j.err" &&
	grep -q '"name":"big"' "$W/ls.j" && [ "$(grep -c '"message_type":"entry"' "$W/ls.j")" = 4 ]; then
	pass "ls --json data: 4 entries"
else
	fail "ls --json data"
	cat "$W/ls.j" "$W/ls.j.err"
fi

# ------------------------------------------------------------ errors
timeout -k 5 60 "$RDMACP" cp "${T[@]}" --json "$REMOTE:data/nosuch" "$DST/nosuch" >"$W/cp.nosuch" 2>&1
rc=$?
if [ $rc = 5 ] && [ ! -e "$DST/nosuch" ]; then pass "cp of a missing file: exit 5"; else
	fail "cp of a missing file: exit $rc, want 5"
	cat "$W/cp.nosuch"
fi
echo "wrong-$$" >"$W/wrong"
timeout -k 5 60 "$RDMACP" cp --transport ibverbs -d "$RXE_DEV" --secret-file "$W/wrong" "$REMOTE:data/one" "$DST/wrong" >"$W/cp.wrong" 2>&1
rc=$?
if [ $rc = 4 ] && [ ! -e "$DST/wrong" ]; then pass "cp with a wrong secret: exit 4"; else
	fail "cp with a wrong secret: exit $rc, want 4"
	cat "$W/cp.wrong"
fi

# ------------------------------------------------------------ sessions at once
# Four initiators together: four sessions, 16 data QPs, windows bound on
# each, all on one rxe device.
t=$(now)
pids=()
for i in 1 2 3; do
	timeout -k 5 180 "$RDMACP" cp "${T[@]}" --json --qps 4 "$REMOTE:data/odd" "$DST/odd.$i" >"$W/par.$i" 2>&1 &
	pids+=($!)
done
timeout -k 5 180 "$RDMACP" cp "${T[@]}" --json --qps 2 "$REMOTE:data/big" "$DST/big.par" >"$W/par.big" 2>&1 &
pids+=($!)
bad=0
for p in "${pids[@]}"; do wait "$p" || bad=$((bad + 1)); done
for i in 1 2 3; do cmp -s "$SRC/odd" "$DST/odd.$i" || bad=$((bad + 1)); done
cmp -s "$SRC/big" "$DST/big.par" || bad=$((bad + 1))
if [ $bad = 0 ]; then pass "4 initiators at once (3x odd, 1x big): all copies identical, $(since "$t")s"; else
	fail "4 initiators at once: $bad failures"
	cat "$W"/par.*
fi
rm -f "$DST"/odd.? "$DST/big.par"

# An initiator killed mid-copy: the target must notice (disconnect), end
# the session and its keys, and go on serving.
closed0=$(grep -c 'msg="session closed' "$W/serve.log")
# (No timeout(1) around it: the KILL must reach rdmacp itself, and does
# within 5 s.)
"$RDMACP" cp "${T[@]}" --json --qps 4 "$REMOTE:data/big" "$DST/killed" >"$W/kill.out" 2>&1 &
victim=$!
for _ in $(seq 100); do # until it has landed some data
	grep -q '"message_type":"status".*"bytes":[1-9]' "$W/kill.out" 2>/dev/null && break
	kill -0 "$victim" 2>/dev/null || break
	sleep 0.05
done
kill -KILL "$victim" 2>/dev/null
wait "$victim" 2>/dev/null
t=$(now)
noticed=0
for _ in $(seq 300); do
	[ "$(grep -c 'msg="session closed' "$W/serve.log")" -gt "$closed0" ] && { noticed=1; break; }
	sleep 0.1
done
last=$(grep 'msg="session closed' "$W/serve.log" | tail -1 | sed -E 's/^.*msg=//')
if grep -q '"message_type":"summary"' "$W/kill.out"; then
	echo "e2e: note: the copy to be killed finished first; kill check not made"
elif [ $noticed = 1 ] && [ ! -e "$DST/killed" ]; then
	pass "initiator killed mid-copy ($(grep -c '"message_type":"status"' "$W/kill.out") status lines): target ended the session after $(since "$t")s: $last"
else
	fail "initiator killed mid-copy: session end noticed=$noticed, dest exists=$([ -e "$DST/killed" ] && echo yes || echo no)"
fi
rm -f "$DST"/.killed* "$DST"/killed*
cpcheck one

# ------------------------------------------------------------ interrupted connects
# Connects ended in flight: ls closes straight after its List, its data
# QPs' joins finished or cancelled; cp gets SIGINT at staggered times,
# while its control QP connects or its data QPs join. Each exits 0 or 130
# (interrupted) with no crash, the target goes on serving, and it is left
# holding no more cm_ids or QPs (rdma resource show) than before. A guard
# at the command level: the provider's crash on a cancelled connect
# (SIGSEGV in rdma_get_cm_event) is proved and tested by verbs/ibverbs
# TestCancelConnect, which this guest runs first; here the 500 ms
# joinGrace and an interrupted close's 300 ms bound hid it (20 runs of
# the unfixed rdmacp passed).
SRVPID=$(pgrep -P "$SRV" | head -1)
# The kernel names the thread that created an object as its "pid".
rescount() {
	rdma -j resource show "$1" 2>/dev/null | grep -o '"pid":[0-9]*' |
		grep -cxF -f <(ls "/proc/$SRVPID/task" 2>/dev/null | sed 's/^/"pid":/')
}
cm0=$(rescount cm_id) qp0=$(rescount qp)
[ "$cm0" -ge 1 ] || echo "e2e: note: rdma resource show lists no cm_id of the target (pid ${SRVPID:-?}): what it holds is not checked"
t=$(now)
bad=0 ints=0
for i in $(seq 4); do
	if ! timeout -k 5 60 "$RDMACP" ls -l "${T[@]}" "$REMOTE:data" >"$W/cls.out" 2>&1 || ! grep -q ' big$' "$W/cls.out"; then
		bad=$((bad + 1))
		echo "e2e: ls -l run $i:"
		cat "$W/cls.out"
	fi
done
for i in $(seq 16); do
	d=$(awk -v i="$i" 'BEGIN { printf "%.3f", 0.04 * i }') # 40 ms .. 640 ms
	timeout --preserve-status -k 10 -s INT "$d" "$RDMACP" cp "${T[@]}" --qps 4 "$REMOTE:data/odd" "$DST/int.$i" >"$W/cint.out" 2>&1
	rc=$?
	[ $rc = 130 ] && ints=$((ints + 1))
	if { [ $rc != 0 ] && [ $rc != 130 ]; } || grep -qE 'SIGSEGV|fatal error|panic' "$W/cint.out"; then
		bad=$((bad + 1))
		echo "e2e: cp interrupted after ${d}s: exit $rc"
		tail -5 "$W/cint.out"
	fi
	rm -f "$DST/int.$i" "$DST"/.int.*
done
left=
for _ in $(seq 150); do
	cm=$(rescount cm_id) qp=$(rescount qp)
	[ "$cm" -le "$cm0" ] && [ "$qp" -le "$qp0" ] && { left=; break; }
	left="cm_ids $cm (before: $cm0), QPs $qp (before: $qp0)"
	sleep 0.1
done
if [ $bad = 0 ] && [ -z "$left" ] && kill -0 "$SRV" 2>/dev/null; then
	pass "interrupted connects: 4 ls -l, 16 cp interrupted at 40-640 ms ($ints exited 130): no crash; target holds cm_ids $cm, QPs $qp (before: $cm0, $qp0), $(since "$t")s"
else
	fail "interrupted connects: $bad bad runs; target left: ${left:-nothing}; target alive: $(kill -0 "$SRV" 2>/dev/null && echo yes || echo no)"
fi
cpcheck one

# ------------------------------------------------------------ perf
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# ib_read_bw Q: prints its BW average in MiB/s (perftest's unit).
ibbw() {
	local q=$1 iters=$(((BIG_MIB + $1 - 1) / $1)) srv try r
	iters=$((iters < 5 ? 5 : iters))
	for try in 1 2 3; do
		timeout -k 5 60 ib_read_bw -d "$RXE_DEV" -x "$RXE_GID_INDEX" -F -s 1048576 -n "$iters" -q "$q" >"$W/ibs.$q" 2>&1 &
		srv=$!
		sleep 1.5
		timeout -k 5 60 ib_read_bw -d "$RXE_DEV" -x "$RXE_GID_INDEX" -F -s 1048576 -n "$iters" -q "$q" "$RXE_ADDR" >"$W/ibc.$q" 2>&1
		r=$?
		wait "$srv"
		if [ $r = 0 ]; then
			awk '$1 == 1048576 && NF >= 5 { print $4; found = 1 } END { exit !found }' "$W/ibc.$q" && return 0
		fi
		echo "e2e: ib_read_bw -q $q try $try failed (exit $r):" >&2
		tail -3 "$W/ibs.$q" "$W/ibc.$q" >&2
	done
	return 1
}
if [ "$PERF" = 1 ]; then
	echo "e2e: perf: ib_read_bw -d $RXE_DEV -s 1048576 (${BIG_MIB} MiB per run) vs rdmacp cp of the ${BIG_MIB} MiB file, $RUNS runs each"
	declare -A IB CP
	# cpbw FILE FLAGS...: one copy of big, its mb_per_s appended to FILE.
	cpbw() {
		local f=$1
		shift
		rm -f "$DST/big"
		if timeout -k 5 180 "$RDMACP" cp "${T[@]}" --json "$@" "$REMOTE:data/big" "$DST/big" >"$W/cpq" 2>&1; then
			sed -n 's/.*"message_type":"summary".*"mb_per_s":\([0-9.eE+-]*\).*/\1/p' "$W/cpq" | tail -1 >>"$f"
		else
			fail "rdmacp cp $* of big"
			cat "$W/cpq"
		fi
	}
	# benchbw FILE FLAGS...: rdmacp bench (READs only, no landing, the
	# same work as ib_read_bw), its avg_mb_per_s appended to FILE.
	benchbw() {
		local f=$1
		shift
		if timeout -k 5 60 "$RDMACP" bench "${T[@]}" --json -s 1MiB --depth 16 -D 3 "$@" "$REMOTE:data/big" >"$W/bq" 2>&1; then
			sed -n 's/.*"avg_mb_per_s":\([0-9.eE+-]*\).*/\1/p' "$W/bq" | tail -1 >>"$f"
		else
			echo "e2e: note: rdmacp bench $* failed:"
			tail -3 "$W/bq"
		fi
	}
	declare -A BN
	for q in 4 1; do
		: >"$W/ib.$q"
		: >"$W/cpr.$q"
		: >"$W/bn.$q"
		for i in $(seq "$RUNS"); do
			v=$(ibbw "$q") && echo "$v" >>"$W/ib.$q" || echo "e2e: note: ib_read_bw -q $q run $i gave no result"
			cpbw "$W/cpr.$q" --qps "$q"
			benchbw "$W/bn.$q" --qps "$q"
			echo "e2e: perf run $i -q $q: ib_read_bw $(tail -1 "$W/ib.$q") MiB/s, rdmacp bench $(tail -1 "$W/bn.$q") MB/s, rdmacp cp $(tail -1 "$W/cpr.$q") MB/s"
		done
		IB[$q]=$(median <"$W/ib.$q")
		CP[$q]=$(median <"$W/cpr.$q")
		BN[$q]=$(median <"$W/bn.$q")
	done
	for q in 4 1; do
		awk -v q="$q" -v ib="${IB[$q]}" -v bn="${BN[$q]}" 'BEGIN {
			if (ib == "-" || bn == "-") { printf "e2e: bench -q %s: no figure\n", q; exit }
			printf "e2e: | %s QPs: rdmacp bench %.1f MB/s vs ib_read_bw %.1f MB/s: ratio %.2f |\n", q, bn, ib * 1.048576, bn / (ib * 1.048576) }'
	done
	# The same copy without chunk digests: how much verification costs.
	: >"$W/cpr.none"
	for i in $(seq "$RUNS"); do
		cpbw "$W/cpr.none" --qps 4 --digest none
	done
	echo "e2e: perf cp --qps 4 --digest none: $(tr '\n' ' ' <"$W/cpr.none")MB/s"
	IB[4n]=${IB[4]}
	CP[4n]=$(median <"$W/cpr.none")
	cmp -s "$SRC/big" "$DST/big" || fail "perf: the last copy of big differs from its source"
	echo "e2e: bandwidth on $KERNEL ($RXE_DEV, median of $RUNS; MB = 10^6 bytes, ib_read_bw's MiB/s converted):"
	printf 'e2e: | %-25s | %-23s | %-22s | %-17s |\n' QPs "ib_read_bw MB/s (MiB/s)" "rdmacp cp MB/s" "rdmacp/ib_read_bw"
	for q in 4 1 4n; do
		awk -v q="${q/4n/4 (cp --digest none)}" -v ib="${IB[$q]}" -v cp="${CP[$q]}" 'BEGIN {
			if (ib == "-" || cp == "-") { printf "e2e: | %-25s | %-23s | %-22s | %-17s |\n", q, ib, cp, "-"; exit }
			mb = ib * 1.048576
			printf "e2e: | %-25s | %-23s | %-22s | %-17s |\n", q, sprintf("%.1f (%.1f)", mb, ib), sprintf("%.1f", cp), sprintf("%.2f", cp / mb) }'
	done
	echo "e2e: (cp's MB/s is the whole copy: open, READs, CRC32C of every chunk, writing and syncing the file; ib_read_bw moves bytes only)"
fi

# ------------------------------------------------------------ staging warning
n=$(grep -c 'staging windows through registered bounce buffers' "$W/serve.log")
expect=${E2E_EXPECT_STAGED:-}
if [ -z "$expect" ]; then
	IFS=.- read -r kmaj kmin _ <<<"$KERNEL"
	v=$((kmaj * 1000 + kmin))
	if [ $v -le 6001 ]; then expect=1; elif [ $v -ge 6012 ]; then expect=0; fi
fi
case $expect in
1) if [ "$n" = 1 ]; then pass "staging warning logged once (Linux $KERNEL can't register read-only file mappings)"; else
	fail "staging warning logged $n times on $KERNEL, want once"
fi ;;
0) if [ "$n" = 0 ]; then pass "no staging warning on $KERNEL: file mappings registered directly (zero-copy)"; else
	fail "staging warning logged $n times on $KERNEL, want none (the file mapping should register)"
	grep 'staging windows' "$W/serve.log"
fi ;;
*) echo "e2e: note: staging warning logged $n times on $KERNEL (no expectation for this kernel)" ;;
esac

# ------------------------------------------------------------ shutdown
t=$(now)
kill -TERM "$SRV"
stopped=0
for _ in $(seq 300); do
	kill -0 "$SRV" 2>/dev/null || { stopped=1; break; }
	sleep 0.1
done
if [ $stopped = 1 ]; then
	wait "$SRV"
	rc=$?
	SRV=
	if [ $rc = 0 ] || [ $rc = 130 ]; then pass "target stopped on SIGTERM in $(since "$t")s (exit $rc)"; else
		fail "target exited $rc on SIGTERM"
	fi
else
	fail "target still running 30 s after SIGTERM"
fi
if grep -q 'level=ERROR' "$W/serve.log"; then
	fail "target logged errors"
	grep 'level=ERROR' "$W/serve.log"
fi
echo "e2e: target log (warnings and session events):"
grep -E 'level=(WARN|ERROR)|msg="session (refused|closed)' "$W/serve.log" |
	sed -E 's/^time=[^ ]* //; s/ peer=[^ ]*//; s/ session=[^ ]*//' | sort | uniq -c | sort -rn | head -12 | sed 's/^/e2e:   /'

# A target killed (SIGKILL) mid-copy: the initiator's outstanding READs
# must fail and cp exit 3 (connection lost) promptly, leaving no file.
P2=$((PORT + 1))
# (No timeout(1) around it: it is killed below, or by the exit trap.)
"$RDMACP" serve "${T[@]}" --listen "$RXE_ADDR:$P2" --export "data=$SRC" 2>"$W/serve2.log" &
SRV=$!
for _ in $(seq 300); do
	grep -q 'msg=serving' "$W/serve2.log" 2>/dev/null && break
	sleep 0.1
done
# cp tries to re-establish the session for --retry-for (2 min by
# default): 5 s here, then it must give up with exit 3 and nothing left.
timeout -k 5 120 "$RDMACP" cp "${T[@]}" --json --qps 4 --retry-for 5s "$RXE_ADDR:$P2:data/big" "$DST/orphan" >"$W/orphan.out" 2>&1 &
cpid=$!
for _ in $(seq 200); do
	grep -q '"message_type":"status".*"bytes":[1-9]' "$W/orphan.out" 2>/dev/null && break
	kill -0 "$cpid" 2>/dev/null || break
	sleep 0.05
done
t=$(now)
kill -KILL "$SRV" 2>/dev/null
wait "$cpid"
rc=$?
secs=$(since "$t")
wait "$SRV" 2>/dev/null
SRV=
if grep -q '"message_type":"summary"' "$W/orphan.out"; then
	echo "e2e: note: the copy finished before its target was killed; check not made"
elif [ $rc = 3 ] && [ ! -e "$DST/orphan" ] && [ -z "$(ls -A "$DST" | grep -F '.orphan.')" ]; then
	pass "target killed mid-copy: cp exit 3 after ${secs}s (reconnecting for --retry-for 5s), no file left: $(grep -o '"error":"[^"]*"' "$W/orphan.out" | head -1)"
else
	fail "target killed mid-copy: cp exit $rc after ${secs}s (want 3), dest exists=$([ -e "$DST/orphan" ] && echo yes || echo no)"
	tail -3 "$W/orphan.out"
fi

if dmesg >/dev/null 2>&1; then
	dmesg | tail -n +$((DMESG0 + 1)) >"$W/dmesg"
	if grep -qE 'WARNING:|BUG:|cleanup failed' "$W/dmesg"; then
		fail "the kernel complained during the run:"
		grep -E -A3 'WARNING:|BUG:|cleanup failed' "$W/dmesg" | head -20
	fi
fi

if [ $FAILS = 0 ]; then
	echo "e2e: PASS on $KERNEL"
	exit 0
fi
echo "e2e: $FAILS check(s) FAILED on $KERNEL"
echo "e2e: --- target log tail"
tail -20 "$W/serve.log"
exit 1
