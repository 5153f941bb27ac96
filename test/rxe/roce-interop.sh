#!/usr/bin/env bash
# test/rxe/roce-interop.sh - the pure-Go RoCEv2 provider (roce-soft)
# against the kernel's Soft-RoCE driver (rxe), a stack nobody here wrote.
# Runs inside the guest of run.sh:
#
#   test/rxe/run.sh --e2e --pkg ./verbs/roce -- test/rxe/roce-interop.sh
#
# rxe1 sits on one end of a veth pair in the guest's first network
# namespace (rxe on Linux 6.1 listens in init_net only); the other end is
# in namespace rsoft, where every roce-soft process runs. Both ends set
# up their QPs with roce-soft's out-of-band exchange (ibverbs
# --ibverbs-setup oob); roce-soft checks rxe's ICRCs on a raw socket
# (--roce-icrc raw: rxe's IP ID is not 0).
#
#   [A] serve --transport ibverbs -d rxe1 <- cp --transport roce-soft:
#       1 B, 100 KiB + 3 B, 9 MiB + 4097 B, 64 MiB, cmp-checked; a push
#       of 9 MiB + 4097 B into the ibverbs target (rxe READs from
#       roce-soft);
#   [B] serve --transport roce-soft <- cp --transport ibverbs -d rxe1:
#       the same files;
#   in both: the initiator SIGKILLed mid-copy (the target ends the
#   session and serves the next copy); a copy ([A]: 9 MiB + 4097 B, [B]:
#   100 KiB + 3 B) and a push again through netem on both veth ends (1%
#   loss, 1% duplicates, 90% of packets delayed 1 ms so the rest
#   overtake them);
#   a capture on the veth of [A]'s small copies and push, decoded by
#   tshark (verbs/roce TestTsharkPcap: no malformed packet, every ICRC
#   right, rxe's and roce-soft's);
#   rdmacp bench over the same veth: roce-soft against rxe, then
#   iwarp-soft against iwarp-soft, alternated, 3 runs each.
#   Then, with the IB CM over QP1 instead of the out-of-band exchange:
#   [C] serve --transport ibverbs -d rxe1 with stock rdma_cm (no oob flag)
#       <- cp --transport roce-soft --roce-setup cm (the IB CM over QP1):
#       100 KiB + 3 B and 64 MiB pulled, 100 KiB + 3 B and 9 MiB + 4097 B
#       pushed, cmp-checked; the capture's CM MADs listed, REQ, REP, RTU,
#       DREQ and DREP required, and tshark-checked (TestTsharkPcap);
#   [D] serve --transport roce-soft --roce-setup cm <- cp --transport
#       ibverbs -d rxe1 (stock rdma_cm): 100 KiB + 3 B and 64 MiB pulled,
#       9 MiB + 4097 B pushed, cmp-checked.
#
# Every check prints "roce-interop: ok" or "roce-interop: FAIL"; exit 1 if
# any failed. Environment: RDMACP, RXE_TEST_BINS (a roce test binary),
# ROCE_INTEROP_BIG_MIB (64), ROCE_INTEROP_BENCH_RUNS (3),
# ROCE_INTEROP_NETEM (1; 0 skips the lossy link checks).
set -u
: "${RXE_VM:?run this inside test/rxe/run.sh}" "${RDMACP:?run.sh --e2e builds it}"
BIG_MIB=${ROCE_INTEROP_BIG_MIB:-64}
RUNS=${ROCE_INTEROP_BENCH_RUNS:-3}
ROCE_TEST=
for b in ${RXE_TEST_BINS:-}; do case $b in *roce.test) ROCE_TEST=$b ;; esac; done
W=$(mktemp -d /tmp/roce-interop.XXXXXX)
SRC=$W/src DST=$W/dst IN=$W/in
mkdir -p "$SRC" "$DST" "$IN"
FAILS=0 PIDS=()
pass() { echo "roce-interop: ok   $*"; }
fail() { echo "roce-interop: FAIL $*"; FAILS=$((FAILS + 1)); }
note() { echo "roce-interop: $*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
	ip netns del rsoft 2>/dev/null
	[ -n "${RXE_OUT:-}" ] && cp "$W"/*.log "$W"/*.json "$W"/*.err "$RXE_OUT/" 2>/dev/null
	rm -rf "$W"
}
trap cleanup EXIT
T0=$(now)
DMESG0=$(dmesg 2>/dev/null | wc -l)
KERNEL=$(uname -r)

# ------------------------------------------------------------ network
NS=rsoft DEV=rxe1 VA=rveth0 VB=rveth1 A=198.18.0.1 B=198.18.0.2
GIDA=0000:0000:0000:0000:0000:ffff:c612:0001 # ::ffff:198.18.0.1
S=(ip netns exec $NS)
{
	ip netns add $NS &&
		ip link add $VA type veth peer name $VB &&
		ip link set $VB netns $NS &&
		ip addr add $A/24 dev $VA && ip link set $VA up &&
		"${S[@]}" ip addr add $B/24 dev $VB && "${S[@]}" ip link set $VB up && "${S[@]}" ip link set lo up &&
		rdma link add $DEV type rxe netdev $VA
} || { echo "roce-interop: FAIL cannot set up the namespace, veth and $DEV"; exit 1; }
P=/sys/class/infiniband/$DEV/ports/1
GIDX=
for _ in $(seq 200); do
	if grep -q ACTIVE $P/state 2>/dev/null; then
		for g in $P/gids/*; do
			if [ "$(cat "$g" 2>/dev/null)" = $GIDA ] && grep -q v2 "$P/gid_attrs/types/${g##*/}" 2>/dev/null; then GIDX=${g##*/}; break 2; fi
		done
	fi
	sleep 0.05
done
[ -n "$GIDX" ] || { echo "roce-interop: FAIL $DEV has no active port with a RoCE v2 GID for $A"; exit 1; }
note "kernel $KERNEL: $DEV on $VA $A (gid $GIDX, active_mtu $(ibv_devinfo -d $DEV 2>/dev/null | awk '/active_mtu/ { print $2 }'), veth mtu $(cat /sys/class/net/$VA/mtu)); roce-soft in netns $NS on $VB $B"

head -c 0 /dev/zero >"$SRC/empty"
printf 'x' >"$SRC/one"
head -c 102403 /dev/urandom >"$SRC/small"
head -c 9441281 /dev/urandom >"$SRC/odd" # 9 MiB + 4097: 3 chunks of 4 MiB, the last partial
head -c $((BIG_MIB << 20)) /dev/urandom >"$SRC/big"
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/secret")

ROCE=(--transport roce-soft --roce-icrc raw)
IBV=(--transport ibverbs -d $DEV --ibverbs-setup oob)

# start_target NAME ADDR:PORT CMD...: rdmacp serve in the background.
start_target() {
	local name=$1 listen=$2 i
	shift 2
	"$@" serve --secret-file "$W/secret" --listen "$listen" --export "data=$SRC" --export "in=$IN" --writable in --state-dir "$W/state.$name" 2>"$W/serve.$name.log" &
	PIDS+=($!)
	eval "SRV_$name=$!"
	for i in $(seq 300); do
		grep -q 'msg=serving' "$W/serve.$name.log" 2>/dev/null && return 0
		kill -0 "$!" 2>/dev/null || break
		sleep 0.1
	done
	fail "target $name did not start: $(tail -3 "$W/serve.$name.log" | tr '\n' ' ')"
	return 1
}

stop_target() {
	local pid
	pid=$(eval echo "\${SRV_$1:-}")
	[ -n "$pid" ] || return
	kill -TERM "$pid" 2>/dev/null
	for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -0 "$pid" 2>/dev/null && { fail "[$1] target still running 10 s after SIGTERM"; kill -KILL "$pid"; }
	grep -q 'level=ERROR' "$W/serve.$1.log" && fail "[$1] target logged errors: $(grep 'level=ERROR' "$W/serve.$1.log" | head -3 | cut -c1-240)"
}

# cpcheck DIR REMOTE FILE CMD...: pull data/FILE, cmp it with the source.
cpcheck() {
	local dir=$1 remote=$2 name=$3 out t rc secs
	shift 3
	out=$W/cp.$dir.$name.json
	rm -f "$DST/$name"
	t=$(now)
	timeout -k 5 240 "$@" cp --secret-file "$W/secret" --json --qps 4 --depth 8 "$remote:data/$name" "$DST/$name" >"$out" 2>"$W/cp.$dir.$name.err"
	rc=$?
	secs=$(since "$t")
	if [ $rc != 0 ]; then
		fail "[$dir] cp $name: exit $rc after ${secs}s: $(grep -o '"error":"[^"]*"' "$out" | head -1)$(tail -2 "$W/cp.$dir.$name.err" | tr '\n' ' ' | cut -c1-300)"
		return 1
	fi
	if ! cmp -s "$SRC/$name" "$DST/$name"; then
		fail "[$dir] cp $name: the copy differs from the source ($(stat -c %s "$DST/$name" 2>/dev/null || echo missing) of $(stat -c %s "$SRC/$name") B)"
		return 1
	fi
	pass "[$dir] cp $name ($(stat -c %s "$SRC/$name") B): byte-exact (cmp), ${secs}s, mb_per_s $(sed -n 's/.*"message_type":"summary".*"mb_per_s":\([0-9.eE+-]*\).*/\1/p' "$out" | tail -1)"
	rm -f "$DST/$name"
}

# pushcheck DIR REMOTE FILE CMD...: push FILE into in/, cmp it there.
pushcheck() {
	local dir=$1 remote=$2 name=$3 t rc
	shift 3
	rm -f "$IN/$name"
	t=$(now)
	timeout -k 5 240 "$@" cp --secret-file "$W/secret" --json --qps 4 --depth 8 "$SRC/$name" "$remote:in/$name" >"$W/push.$dir.$name.json" 2>"$W/push.$dir.$name.err"
	rc=$?
	if [ $rc != 0 ]; then
		fail "[$dir] push $name: exit $rc after $(since "$t")s: $(grep -o '"error":"[^"]*"' "$W/push.$dir.$name.json" | head -1)$(tail -2 "$W/push.$dir.$name.err" | tr '\n' ' ' | cut -c1-300)"
	elif cmp -s "$SRC/$name" "$IN/$name"; then
		pass "[$dir] push $name ($(stat -c %s "$SRC/$name") B) into the target: byte-exact (cmp), $(since "$t")s"
	else
		fail "[$dir] push $name: the pushed file differs from the source"
	fi
}

# lossy DIR REMOTE NAME CMD...: a copy of NAME and a push through netem
# on both veth ends (loss, duplicates, reordering): byte-exact, and rxe1
# saw the damage (its sequence-error and retry counters rose).
NETEM=(delay 1ms loss 1% duplicate 1% reorder 10%)
counters() { (cd /sys/class/infiniband/$DEV/ports/1/hw_counters && cat out_of_seq_request duplicate_request completer_retry_err rcvd_seq_err 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'); }
lossy() {
	local dir=$1 remote=$2 name=$3 c0 c1
	shift 3
	if [ "${ROCE_INTEROP_NETEM:-1}" != 1 ]; then
		note "[$dir] lossy link not run (ROCE_INTEROP_NETEM=0)"
		return
	fi
	if ! tc qdisc add dev $VA root netem "${NETEM[@]}" 2>"$W/tc.err" || ! "${S[@]}" tc qdisc add dev $VB root netem "${NETEM[@]}" 2>>"$W/tc.err"; then
		note "SKIP lossy link: $(head -2 "$W/tc.err" | tr '\n' ' ')"
		tc qdisc del dev $VA root 2>/dev/null
		return
	fi
	c0=$(counters)
	cpcheck "$dir-netem" "$remote" "$name" "$@"
	pushcheck "$dir-netem" "$remote" small "$@"
	c1=$(counters)
	tc qdisc del dev $VA root
	"${S[@]}" tc qdisc del dev $VB root
	note "[$dir-netem] netem ${NETEM[*]} on both ends: rxe1's out_of_seq_request + duplicate_request + completer_retry_err + rcvd_seq_err rose by $((c1 - c0))"
	[ $((c1 - c0)) -gt 0 ] || fail "[$dir-netem] rxe1 saw no damage: the emulated link did nothing"
}

# kill_initiator DIR REMOTE CMD...: cp SIGKILLed mid-copy: the target sees
# the out-of-band TCP connection end, ends the session, and serves the
# next copy.
kill_initiator() {
	local dir=$1 remote=$2 log=$W/serve.$1.log c0 v t ok=0
	shift 2
	c0=$(grep -c 'msg="session closed' "$log")
	"$@" cp --secret-file "$W/secret" --json --qps 4 --depth 8 "$remote:data/big" "$DST/killed" >"$W/kill.$dir" 2>&1 &
	v=$!
	for _ in $(seq 300); do
		grep -q '"message_type":"status".*"bytes":[1-9]' "$W/kill.$dir" 2>/dev/null && break
		kill -0 "$v" 2>/dev/null || break
		sleep 0.05
	done
	# ip netns exec execs: $v is rdmacp itself.
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
	else
		fail "[$dir] initiator killed mid-copy: session end seen=$ok, dest exists=$([ -e "$DST/killed" ] && echo yes || echo no)"
		tail -3 "$log"
	fi
	cpcheck "$dir" "$remote" small "$@" && pass "[$dir] ... and the target serves the next copy"
}

# ------------------------------------------------------------ [A]
note "[A] = serve ${IBV[*]} ($A) <- cp ${ROCE[*]} (netns $NS)"
PCAP=$W/rxe-roce.pcapng CAP=
if command -v dumpcap >/dev/null; then
	dumpcap -q -i $VA -B 64 -c 20000 -f 'udp port 4791' -w "$PCAP" 2>"$W/dumpcap.err" &
	CAP=$!
	PIDS+=($CAP)
	for _ in $(seq 100); do [ -s "$PCAP" ] && break; sleep 0.1; done
	[ -s "$PCAP" ] || { note "dumpcap did not start: $(head -3 "$W/dumpcap.err")"; kill "$CAP" 2>/dev/null; CAP=; }
else
	note "SKIP capture: no dumpcap (apt-get install tshark)"
fi
if start_target A "$A:7491" "$RDMACP" "${IBV[@]}"; then
	for f in empty one small; do cpcheck A "$A:7491" "$f" "${S[@]}" "$RDMACP" "${ROCE[@]}"; done
	pushcheck A "$A:7491" small "${S[@]}" "$RDMACP" "${ROCE[@]}"
	if [ -n "$CAP" ]; then
		sleep 0.5
		kill -INT "$CAP" 2>/dev/null
		wait "$CAP" 2>/dev/null
		CAP=
	fi
	for f in odd big; do cpcheck A "$A:7491" "$f" "${S[@]}" "$RDMACP" "${ROCE[@]}"; done
	pushcheck A "$A:7491" odd "${S[@]}" "$RDMACP" "${ROCE[@]}"
	lossy A "$A:7491" odd "${S[@]}" "$RDMACP" "${ROCE[@]}"
	kill_initiator A "$A:7491" "${S[@]}" "$RDMACP" "${ROCE[@]}"
	note "[A] cp says: $(grep -o '"transport":"[^"]*"' "$W/cp.A.one.json" 2>/dev/null | head -1)"
	note "[A] target says: $(grep -o 'msg=serving.*' "$W/serve.A.log" | head -1 | cut -c1-240)"
	note "[A] target's session: $(grep -o 'msg="session open.*' "$W/serve.A.log" | head -1 | cut -c1-300)"
fi

# ------------------------------------------------------------ decode
if [ -s "$PCAP" ]; then
	note "capture: $(stat -c %s "$PCAP") bytes on $VA"
	[ -n "${RXE_OUT:-}" ] && cp "$PCAP" "$RXE_OUT/rxe-roce-$KERNEL.pcapng" && note "capture saved as rxe-roce-$KERNEL.pcapng"
	if [ -n "$ROCE_TEST" ] && command -v tshark >/dev/null; then
		t=$(now)
		(cd /run/rxe-job && ROCE_PCAP=$PCAP ROCE_PCAP_KERNEL_PEER=1 timeout -k 5 300 "$ROCE_TEST" -test.run '^TestTsharkPcap$' -test.v -test.timeout 280s) >"$W/tshark.out" 2>&1
		rc=$?
		sed 's/^/roce-interop:   /' "$W/tshark.out" | grep -v '^roce-interop:   $' | cut -c1-300 | head -20
		if [ $rc = 0 ] && grep -q -- '--- PASS: TestTsharkPcap' "$W/tshark.out"; then
			pass "tshark: the rxe <-> roce-soft capture has no malformed packet and every ICRC checks ($(since "$t")s)"
		else
			fail "tshark check of the capture (exit $rc)"
		fi
	else
		note "SKIP tshark check: no roce test binary (run.sh --pkg ./verbs/roce) or no tshark"
	fi
fi

# ------------------------------------------------------------ [B]
note "[B] = serve ${ROCE[*]} (netns $NS, $B) <- cp ${IBV[*]}"
bench_ok=0
[ -n "${SRV_A:-}" ] && kill -0 "$SRV_A" 2>/dev/null && bench_ok=1
# roce-soft processes share UDP 4791 in the namespace: [A]'s target
# stays up (it is in the first namespace), [B]'s runs only now.
if start_target B "$B:7492" "${S[@]}" "$RDMACP" "${ROCE[@]}"; then
	for f in empty one small odd big; do cpcheck B "$B:7492" "$f" "$RDMACP" "${IBV[@]}"; done
	pushcheck B "$B:7492" small "$RDMACP" "${IBV[@]}"
	# small, not odd: rxe's requester answers a lost response with
	# go-back-N, every later READ asked again from its start, and pulled
	# 9 MiB through this link in 119-130 s (docs/interop.md).
	lossy B "$B:7492" small "$RDMACP" "${IBV[@]}"
	kill_initiator B "$B:7492" "$RDMACP" "${IBV[@]}"
	note "[B] cp says: $(grep -o '"transport":"[^"]*"' "$W/cp.B.one.json" 2>/dev/null | head -1)"
	stop_target B
fi

# ------------------------------------------------------------ bench
# rdmacp bench (READs only, no landing) over the same veth: roce-soft in
# the namespace against rxe, and iwarp-soft in the namespace against an
# iwarp-soft target on rxe's address.
benchbw() {
	local out=$1
	shift
	if timeout -k 5 90 "${S[@]}" "$RDMACP" bench --secret-file "$W/secret" --json -s 1MiB --qps 4 --depth 16 -D 3 "$@" >"$out" 2>&1; then
		sed -n 's/.*"avg_mb_per_s":\([0-9.eE+-]*\).*/\1/p' "$out" | tail -1
	else
		echo "error: $(tail -2 "$out" | tr '\n' ' ' | cut -c1-200)" >&2
		echo 0
	fi
}
if [ $bench_ok = 1 ] && start_target I "$A:7493" "$RDMACP" --transport iwarp-soft; then
	RR=() II=()
	for i in $(seq "$RUNS"); do
		RR+=("$(benchbw "$W/bench.roce.$i.json" "${ROCE[@]}" "$A:7491:data/big")")
		II+=("$(benchbw "$W/bench.iwarp.$i.json" --transport iwarp-soft "$A:7493:data/big")")
	done
	med() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
	mr=$(med "${RR[@]}") mi=$(med "${II[@]}")
	note "bench (1 MiB READs, 4 QPs x depth 16, 3 s, $RUNS runs alternated) over $VA<->$VB:"
	note "  roce-soft -> rxe ($DEV, --ibverbs-setup oob): ${RR[*]} MB/s, median $mr"
	note "  iwarp-soft -> iwarp-soft:                    ${II[*]} MB/s, median $mi"
	awk -v r="$mr" -v i="$mi" 'BEGIN { if (i > 0) printf "roce-interop:   ratio roce-soft/rxe : iwarp-soft = %.2f\n", r / i }'
	awk -v r="$mr" 'BEGIN { exit !(r > 0) }' && pass "bench roce-soft -> rxe: median $mr MB/s" || fail "bench roce-soft -> rxe gave no figure: $(tail -2 "$W/bench.roce.1.json" | cut -c1-200)"
	stop_target I
fi
stop_target A

# ------------------------------------------------------------ [C]
# rdma_cm's Connection Manager over QP1 (--roce-setup cm): a stock
# ibverbs target, with no --ibverbs-setup flag, takes roce-soft's REQ as it
# takes any rdma_cm client's. A capture of the small copy and push (CM
# MADs included) is decoded by tshark: no malformed packet, every ICRC
# right, and the CM exchange REQ, REP, RTU, DREQ, DREP all there.
CM=(--transport roce-soft --roce-icrc raw --roce-setup cm)
IBC=(--transport ibverbs -d $DEV)
note "[C] = serve ${IBC[*]} ($A, stock rdma_cm) <- cp ${CM[*]} (netns $NS)"
PCAPC=$W/rxe-cm.pcapng CAP=
if command -v dumpcap >/dev/null; then
	dumpcap -q -i $VA -B 64 -c 20000 -f 'udp port 4791' -w "$PCAPC" 2>"$W/dumpcap-cm.err" &
	CAP=$!
	PIDS+=($CAP)
	for _ in $(seq 100); do [ -s "$PCAPC" ] && break; sleep 0.1; done
	[ -s "$PCAPC" ] || { note "dumpcap did not start: $(head -3 "$W/dumpcap-cm.err")"; kill "$CAP" 2>/dev/null; CAP=; }
fi
if start_target C "$A:7494" "$RDMACP" "${IBC[@]}"; then
	cpcheck C "$A:7494" small "${S[@]}" "$RDMACP" "${CM[@]}"
	pushcheck C "$A:7494" small "${S[@]}" "$RDMACP" "${CM[@]}"
	if [ -n "$CAP" ]; then
		sleep 0.5
		kill -INT "$CAP" 2>/dev/null
		wait "$CAP" 2>/dev/null
		CAP=
	fi
	cpcheck C "$A:7494" big "${S[@]}" "$RDMACP" "${CM[@]}"
	pushcheck C "$A:7494" odd "${S[@]}" "$RDMACP" "${CM[@]}"
	note "[C] cp says: $(grep -o '"transport":"[^"]*"' "$W/cp.C.small.json" 2>/dev/null | head -1)"
	note "[C] target's session: $(grep -o 'msg="session open.*' "$W/serve.C.log" | head -1 | cut -c1-300)"
	stop_target C
fi
if [ -s "$PCAPC" ] && command -v tshark >/dev/null; then
	[ -n "${RXE_OUT:-}" ] && cp "$PCAPC" "$RXE_OUT/rxe-cm-$KERNEL.pcapng"
	tshark -r "$PCAPC" -Y infiniband.mad -T fields -e frame.number -e ip.src -e ip.dst -e infiniband.mad.attributeid -e infiniband.cm.rej.reason >"$W/cm-mads" 2>&1
	note "[C] CM MADs captured (frame, from, to, attribute, REJ reason):"
	head -24 "$W/cm-mads" | sed 's/^/roce-interop:   /'
	for a in 0x0010:REQ:$B 0x0013:REP:$A 0x0014:RTU:$B 0x0015:DREQ: 0x0016:DREP:; do
		IFS=: read -r id name from <<<"$a"
		if awk -v id=$id -v f="$from" '$4 == id && (f == "" || $2 == f) { n++ } END { exit !n }' "$W/cm-mads"; then
			pass "[C] capture has the $name${from:+ from $from}"
		else
			fail "[C] capture has no $name${from:+ from $from}"
		fi
	done
	if [ -n "$ROCE_TEST" ]; then
		(cd /run/rxe-job && ROCE_PCAP=$PCAPC ROCE_PCAP_KERNEL_PEER=1 timeout -k 5 300 "$ROCE_TEST" -test.run '^TestTsharkPcap$' -test.v -test.timeout 280s) >"$W/tshark-cm.out" 2>&1
		rc=$?
		sed 's/^/roce-interop:   /' "$W/tshark-cm.out" | grep -v '^roce-interop:   $' | cut -c1-300 | head -12
		if [ $rc = 0 ] && grep -q -- '--- PASS: TestTsharkPcap' "$W/tshark-cm.out"; then
			pass "[C] tshark: the capture with rdma_cm's CM MADs has no malformed packet and every ICRC checks"
		else
			fail "[C] tshark check of the CM capture (exit $rc)"
		fi
	fi
else
	note "SKIP [C] capture check: no capture or no tshark"
fi

# ------------------------------------------------------------ [D]
# The passive side: a roce-soft target with --roce-setup cm takes the REQ
# of a stock ibverbs cp on rxe (rdma_cm, no flag), pull and push.
note "[D] = serve ${CM[*]} (netns $NS, $B) <- cp ${IBC[*]} (stock rdma_cm)"
if start_target D "$B:7495" "${S[@]}" "$RDMACP" "${CM[@]}"; then
	for f in small big; do cpcheck D "$B:7495" "$f" "$RDMACP" "${IBC[@]}"; done
	pushcheck D "$B:7495" odd "$RDMACP" "${IBC[@]}"
	note "[D] cp says: $(grep -o '"transport":"[^"]*"' "$W/cp.D.small.json" 2>/dev/null | head -1)"
	note "[D] target's sessions: $(grep -c 'msg="session closed' "$W/serve.D.log") closed; $(grep -o 'msg="session closed.*' "$W/serve.D.log" | head -1 | cut -c1-200)"
	stop_target D
fi

if dmesg >/dev/null 2>&1; then
	dmesg | tail -n +$((DMESG0 + 1)) >"$W/dmesg"
	grep -E 'WARNING:|BUG:' "$W/dmesg" >/dev/null && { fail "the kernel complained:"; grep -E -A3 'WARNING:|BUG:' "$W/dmesg" | head -20; }
	grep -iE 'rxe|rdma' "$W/dmesg" | sed -E 's/^\[[ 0-9.]*\] //' | sort | uniq -c | sort -rn | head -8 | cut -c1-200 | sed 's/^/roce-interop:   dmesg /'
fi
note "$DEV counters: $(cd /sys/class/infiniband/$DEV/ports/1/hw_counters 2>/dev/null && for c in sent_pkts rcvd_pkts duplicate_request out_of_seq_request rcvd_seq_err ack_deferred retry_exceeded_err rcvd_rnr_err send_rnr_err completer_retry_err link_downed; do [ -f $c ] && printf '%s %s; ' $c "$(cat $c)"; done)"
if [ $FAILS = 0 ]; then
	echo "roce-interop: PASS on $KERNEL in $(since "$T0")s"
	exit 0
fi
echo "roce-interop: $FAILS check(s) FAILED on $KERNEL in $(since "$T0")s"
exit 1
