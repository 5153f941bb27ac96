#!/usr/bin/env bash
# test/rxe/interop.sh - the pure-Go iWARP provider (iwarp-soft) against the
# kernel's soft-iWARP driver (siw), a stack nobody here wrote. Runs inside
# the guest of `test/rxe/run.sh --interop`, which loads siw.ko, creates
# siw0 and builds the binaries:
#
#   1. rping (kernel siw through rdma_cm) against the pure-Go provider, both
#      roles (verbs/iwarp's TestRpingClient / TestRpingServer);
#   2. rdmacp serve --transport ibverbs -d siw0 <- rdmacp cp --transport iwarp-soft
#   3. rdmacp serve --transport iwarp-soft      <- rdmacp cp --transport ibverbs -d siw0
#      files of 0 B, 1 B, 9 MiB + 4097 B and 64 MiB, sha256-checked,
#      --qps 4 --depth 8;
#   4. in both directions, the initiator killed mid-copy (the target ends
#      that session and serves the next copy) and the target killed
#      mid-copy (cp exits 3, no file left);
#   5. a capture on lo of 1 and the small copies (dumpcap), decoded
#      with tshark's iwarp dissectors; the pcapng goes to $RXE_OUT.
#
# Every line of the result says "interop: ok" or "interop: FAIL"; exit 1 if
# any failed. Environment: SIW_DEV SIW_ADDR RDMACP IWARP_TEST (from
# run.sh); INTEROP_RDMACP_B: the rdmacp binary used for direction 3
# (default $RDMACP); INTEROP_BIG_MIB (64).
set -u
: "${SIW_DEV:?run this inside test/rxe/run.sh --interop}" "${SIW_ADDR:?}" "${RDMACP:?}"
RDMACP_B=${INTEROP_RDMACP_B:-$RDMACP}
BIG_MIB=${INTEROP_BIG_MIB:-64}
W=$(mktemp -d "${TMPDIR:-/tmp}/interop.XXXXXX")
SRC=$W/src DST=$W/dst
mkdir -p "$SRC" "$DST"
FAILS=0 PIDS=()
pass() { echo "interop: ok   $*"; }
fail() { echo "interop: FAIL $*"; FAILS=$((FAILS + 1)); }
note() { echo "interop: $*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
	[ "${INTEROP_KEEP:-0}" = 1 ] || rm -rf "$W"
}
trap cleanup EXIT
T0=$(now)
DMESG0=$(dmesg 2>/dev/null | wc -l)
KERNEL=$(uname -r)

note "kernel $KERNEL, $SIW_DEV on ${SIW_NETDEV:-?} $SIW_ADDR: $(ibv_devinfo -d "$SIW_DEV" 2>/dev/null | awk '/transport:|max_qp_rd_atom:|max_sge_rd:|state:/ { printf "%s %s; ", $1, $2 }')"
head -c 0 /dev/zero >"$SRC/empty"
printf 'x' >"$SRC/one"
head -c 9441281 /dev/urandom >"$SRC/odd" # 9 MiB + 4097: 3 chunks of 4 MiB, the last partial
head -c $((BIG_MIB << 20)) /dev/urandom >"$SRC/big"
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/secret") # serve refuses a secret others can read

# ------------------------------------------------------------ capture
PCAP=$W/interop.pcapng CAP=
if command -v dumpcap >/dev/null; then
	dumpcap -q -i lo -B 64 -f 'tcp' -w "$PCAP" 2>"$W/dumpcap.err" &
	CAP=$!
	PIDS+=($CAP)
	for _ in $(seq 100); do [ -s "$PCAP" ] && break; sleep 0.1; done
	[ -s "$PCAP" ] || { note "dumpcap did not start: $(head -3 "$W/dumpcap.err")"; kill "$CAP" 2>/dev/null; CAP=; }
else
	note "SKIP capture: no dumpcap (apt-get install tshark)"
fi

# ------------------------------------------------------------ rping
if [ -n "${IWARP_TEST:-}" ] && command -v rping >/dev/null; then
	t=$(now)
	(cd "${RXE_SRCDIR:-/}/verbs/iwarp" 2>/dev/null || cd /; IWARP_RPING_ADDR=$SIW_ADDR timeout -k 5 240 "$IWARP_TEST" -test.run '^TestRping' -test.v -test.timeout 200s) >"$W/rping.out" 2>&1
	rc=$?
	sed 's/^/interop:   /' "$W/rping.out" | grep -E -- '--- |rping_interop_test|started:|ping data|DISCONNECT|^interop:   (ok|FAIL|PASS)' | cut -c1-220 | head -60
	for tcase in TestRpingClient TestRpingServer; do
		if grep -q -- "--- PASS: $tcase " "$W/rping.out"; then pass "$tcase (pure-Go provider vs rping on $SIW_DEV)"
		else fail "$tcase (exit $rc)"; fi
	done
	note "rping tests took $(since "$t")s"
else
	note "SKIP rping: no IWARP_TEST binary or no rping"
fi

# ------------------------------------------------------------ targets
# start_target NAME PORT BINARY ARGS...: rdmacp serve in the background.
start_target() {
	local name=$1 port=$2 bin=$3
	shift 3
	"$bin" serve "$@" --secret-file "$W/secret" --listen "$SIW_ADDR:$port" --export "data=$SRC" 2>"$W/serve.$name.log" &
	PIDS+=($!)
	eval "SRV_$name=$!"
	for _ in $(seq 300); do
		grep -q 'msg=serving' "$W/serve.$name.log" 2>/dev/null && return 0
		kill -0 "$!" 2>/dev/null || break
		sleep 0.1
	done
	fail "target $name did not start"
	cat "$W/serve.$name.log"
	return 1
}

# cpcheck DIR FILE BINARY ARGS...: cp data/FILE from target DIR's port, check it.
declare -A PORT=([A]=7491 [B]=7492 [A2]=7493 [B2]=7494)
cpcheck() {
	local dir=$1 name=$2 bin=$3 out t rc secs a b
	shift 3
	out=$W/cp.$dir.$name.json
	rm -f "$DST/$name"
	t=$(now)
	timeout -k 5 240 "$bin" cp "$@" --secret-file "$W/secret" --json --qps 4 --depth 8 "$SIW_ADDR:${PORT[$dir]}:data/$name" "$DST/$name" >"$out" 2>"$W/cp.$dir.$name.err"
	rc=$?
	secs=$(since "$t")
	if [ $rc != 0 ]; then
		fail "[$dir] cp $name: exit $rc after ${secs}s: $(grep -o '"error":"[^"]*"' "$out" | head -1)$(tail -2 "$W/cp.$dir.$name.err" | tr '\n' ' ')"
		return 1
	fi
	a=$(sha256sum <"$SRC/$name" | cut -c1-64)
	b=$(sha256sum <"$DST/$name" 2>/dev/null | cut -c1-64)
	if [ "$a" != "$b" ]; then
		fail "[$dir] cp $name: sha256 differs: source $a, copy ${b:-missing}"
		return 1
	fi
	pass "[$dir] cp $name ($(stat -c %s "$SRC/$name") B): sha256 ${a:0:16}.. equal, ${secs}s, mb_per_s $(sed -n 's/.*"message_type":"summary".*"mb_per_s":\([0-9.eE+-]*\).*/\1/p' "$out" | tail -1)"
	rm -f "$DST/$name"
}

A_T=(--transport ibverbs -d "$SIW_DEV") A_C=(--transport iwarp-soft)
B_T=(--transport iwarp-soft) B_C=(--transport ibverbs -d "$SIW_DEV")
note "[A] = serve ${A_T[*]} <- cp ${A_C[*]};  [B] = serve ${B_T[*]} <- cp ${B_C[*]}${INTEROP_RDMACP_B:+ (B with $RDMACP_B)}"
start_target A "${PORT[A]}" "$RDMACP" "${A_T[@]}" && A_UP=1 || A_UP=0
start_target B "${PORT[B]}" "$RDMACP_B" "${B_T[@]}" && B_UP=1 || B_UP=0
for f in empty one odd; do
	[ $A_UP = 1 ] && cpcheck A "$f" "$RDMACP" "${A_C[@]}"
	[ $B_UP = 1 ] && cpcheck B "$f" "$RDMACP_B" "${B_C[@]}"
done
for d in A B; do
	j=$W/cp.$d.one.json
	[ -f "$j" ] && note "[$d] cp says: $(grep -o '"transport":"[^"]*"' "$j" | head -1)"
	note "[$d] target says: $(grep -o 'msg=serving.*' "$W/serve.$d.log" | head -1 | cut -c1-200)"
done

# ------------------------------------------------------------ decode
if [ -n "$CAP" ]; then
	sleep 0.5
	kill -INT "$CAP" 2>/dev/null
	wait "$CAP" 2>/dev/null
	TS=(-n -o tcp.desegment_tcp_streams:TRUE --disable-protocol rpcordma --disable-protocol smb_direct)
	note "capture: $(stat -c %s "$PCAP") bytes"
	if [ -n "${RXE_OUT:-}" ]; then cp "$PCAP" "$RXE_OUT/interop-$KERNEL.pcapng" && note "capture saved as interop-$KERNEL.pcapng"; fi
	t=$(now)
	timeout 150 tshark -r "$PCAP" "${TS[@]}" -Y 'iwarp_mpa.key.req or iwarp_mpa.key.rep' -T fields -E separator='|' \
		-e tcp.srcport -e tcp.dstport -e iwarp_mpa.key.req -e iwarp_mpa.rev -e iwarp_mpa.crc_flag -e iwarp_mpa.marker_flag -e iwarp_mpa.pdlength -e iwarp_mpa.privatedata \
		2>/dev/null | awk -F'|' '{ w = ($3 != "") ? "request" : "reply"
			if ($1 ~ /^749/) w = w " from :" $1; else if ($2 ~ /^749/) w = w " to :" $2; else w = w " (rping)"
			printf "%s: rev %s crc %s markers %s pd_len %s ird/ord %s ulp %s\n", w, $4, $5, $6, $7, substr($8, 1, 8), substr($8, 9, 12) }' |
		sort | uniq -c | sort -rn | head -24 | sed 's/^/interop:   mpa /'
	timeout 150 tshark -r "$PCAP" "${TS[@]}" -T fields -e iwarp_rdma.opcode 2>/dev/null | tr ',' '\n' | grep -v '^$' | sort | uniq -c |
		awk '{ n[$2] = $1 } END { printf "interop:   rdmap opcodes: write %d, read req %d, read resp %d, send %d, send+SE %d, terminate %d\n", n["0x00"]+n["0"], n["0x01"]+n["1"], n["0x02"]+n["2"], n["0x03"]+n["3"], n["0x05"]+n["5"], n["0x07"]+n["7"] }'
	timeout 150 tshark -r "$PCAP" "${TS[@]}" -q -z expert >"$W/expert" 2>&1
	grep -E 'IWARP|Malformed|^(Errors|Warns|Notes) \(' "$W/expert" | sed 's/  */ /g' | sort | uniq -c | head -30 | sed 's/^/interop:   expert /'
	if grep -q 'Malformed' "$W/expert"; then fail "tshark found malformed frames (see above)"; else pass "tshark: no malformed frames"; fi
	note "decode took $(since "$t")s"
fi

# ------------------------------------------------------------ 64 MiB
[ $A_UP = 1 ] && cpcheck A big "$RDMACP" "${A_C[@]}"
[ $B_UP = 1 ] && cpcheck B big "$RDMACP_B" "${B_C[@]}"

# ------------------------------------------------------------ disconnects
# kill_initiator DIR BINARY ARGS...: cp killed mid-copy; the target ends
# the session and serves the next copy.
kill_initiator() {
	local dir=$1 bin=$2 log=$W/serve.$1.log c0 v t ok=0
	shift 2
	c0=$(grep -c 'msg="session closed' "$log")
	# --bwlimit: 64 MiB take 8 s, so the kill lands mid-copy. Unpaced,
	# the copy had read all 64 MiB when the first status line came, the
	# kill landed as it ended, and once no session end was seen.
	"$bin" cp "$@" --secret-file "$W/secret" --json --qps 4 --depth 8 --bwlimit 8M "$SIW_ADDR:${PORT[$dir]}:data/big" "$DST/killed" >"$W/kill.$dir" 2>&1 &
	v=$!
	for _ in $(seq 200); do
		grep -q '"message_type":"status".*"bytes":[1-9]' "$W/kill.$dir" 2>/dev/null && break
		kill -0 "$v" 2>/dev/null || break
		sleep 0.05
	done
	kill -KILL "$v" 2>/dev/null
	wait "$v" 2>/dev/null
	t=$(now)
	for _ in $(seq 300); do
		[ "$(grep -c 'msg="session closed' "$log")" -gt "$c0" ] && { ok=1; break; }
		sleep 0.1
	done
	if grep -q '"message_type":"summary"' "$W/kill.$dir"; then
		note "[$dir] the copy to be killed finished first; kill check not made"
	elif [ $ok = 1 ] && [ ! -e "$DST/killed" ]; then
		pass "[$dir] initiator killed mid-copy: target ended the session after $(since "$t")s: $(grep 'msg="session closed' "$log" | tail -1 | sed -E 's/^.*msg=//' | cut -c1-160)"
		# A SIGKILLed cp can't remove its hidden temporary; the destination was never created.
		note "[$dir] the killed cp left its temporary: $(cd "$DST" && ls -A | grep -c '^\.killed\..*\.part$') .part file(s), no $DST/killed"
	else
		fail "[$dir] initiator killed mid-copy: session end seen=$ok, dest exists=$([ -e "$DST/killed" ] && echo yes || echo no)"
		tail -3 "$log"
	fi
	local said
	if said=$(cpcheck "$dir" odd "$bin" "$@"); then
		pass "[$dir] ... and the target serves the next copy"
	else
		# cpcheck ran in a subshell: its FAIL line says how the copy failed, and it is counted here.
		echo "$said"
		note "[$dir] target does not serve after the killed initiator; its log ends:"
		tail -5 "$log" | sed 's/^/interop:     /'
		FAILS=$((FAILS + 1))
	fi
}

# kill_target DIR TBINARY CBINARY "TARGS" CARGS...: the target killed mid-copy.
kill_target() {
	local dir=$1 tbin=$2 cbin=$3 pid c rc t
	# shellcheck disable=SC2206
	local targs=($4)
	shift 4
	start_target "$dir" "${PORT[$dir]}" "$tbin" "${targs[@]}" || return
	pid=$(eval echo "\$SRV_$dir")
	rm -f "$DST/orphan"
	# cp re-establishes a lost session for --retry-for (2 min by
	# default): 5 s here, then it must give up with exit 3.
	timeout -k 5 120 "$cbin" cp "$@" --secret-file "$W/secret" --json --qps 4 --depth 8 --retry-for 5s "$SIW_ADDR:${PORT[$dir]}:data/big" "$DST/orphan" >"$W/orphan.$dir" 2>&1 &
	c=$!
	for _ in $(seq 200); do
		grep -q '"message_type":"status".*"bytes":[1-9]' "$W/orphan.$dir" 2>/dev/null && break
		kill -0 "$c" 2>/dev/null || break
		sleep 0.05
	done
	t=$(now)
	kill -KILL "$pid" 2>/dev/null
	wait "$c"
	rc=$?
	wait "$pid" 2>/dev/null
	if grep -q '"message_type":"summary"' "$W/orphan.$dir"; then
		note "[${dir%2}] the copy finished before its target was killed; check not made"
	elif [ $rc = 3 ] && [ ! -e "$DST/orphan" ] && ! ls -A "$DST" | grep -q orphan; then
		pass "[${dir%2}] target killed mid-copy: cp exit 3 after $(since "$t")s, no file left: $(grep -o '"error":"[^"]*"' "$W/orphan.$dir" | head -1 | cut -c1-160)"
	else
		fail "[${dir%2}] target killed mid-copy: cp exit $rc after $(since "$t")s (want 3), left: $(ls -A "$DST" | grep orphan | tr '\n' ' ')"
		tail -3 "$W/orphan.$dir"
	fi
}

[ $A_UP = 1 ] && kill_initiator A "$RDMACP" "${A_C[@]}"
[ $B_UP = 1 ] && kill_initiator B "$RDMACP_B" "${B_C[@]}"
kill_target A2 "$RDMACP" "$RDMACP" "${A_T[*]}" "${A_C[@]}"
kill_target B2 "$RDMACP_B" "$RDMACP_B" "${B_T[*]}" "${B_C[@]}"

# The first targets are still up, and log no error.
for d in A B; do
	pid=$(eval echo "\${SRV_$d:-}")
	[ -n "$pid" ] || continue
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid"
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -0 "$pid" 2>/dev/null && fail "[$d] target still running 10 s after SIGTERM"
	else
		fail "[$d] target died during the run"
	fi
	if grep -q 'level=ERROR' "$W/serve.$d.log"; then
		fail "[$d] target logged errors: $(grep 'level=ERROR' "$W/serve.$d.log" | head -3 | cut -c1-200)"
	fi
	grep -E 'level=(WARN|ERROR)|msg="session (refused|closed)' "$W/serve.$d.log" |
		sed -E 's/^time=[^ ]* //; s/ peer=[^ ]*//; s/ session=[^ ]*//' | sort | uniq -c | sort -rn | head -6 | cut -c1-200 | sed "s/^/interop:   [$d] log /"
done

if dmesg >/dev/null 2>&1; then
	dmesg | tail -n +$((DMESG0 + 1)) >"$W/dmesg"
	grep -E 'WARNING:|BUG:' "$W/dmesg" >/dev/null && { fail "the kernel complained:"; grep -E -A3 'WARNING:|BUG:' "$W/dmesg" | head -20; }
	grep -i siw "$W/dmesg" | sort | uniq -c | sort -rn | head -8 | cut -c1-200 | sed 's/^/interop:   dmesg /'
fi
[ -n "${RXE_OUT:-}" ] && cp "$W"/serve.*.log "$W"/*.json "$W"/rping.out "$RXE_OUT/" 2>/dev/null
if [ $FAILS = 0 ]; then
	echo "interop: PASS on $KERNEL in $(since "$T0")s"
	exit 0
fi
echo "interop: $FAILS check(s) FAILED on $KERNEL in $(since "$T0")s"
exit 1
