#!/usr/bin/env bash
# test/rxe/rails.sh - rails over real verbs (rdma_rxe), inside the guest
# of run.sh:
#
#   test/rxe/run.sh --e2e --no-tests -- test/rxe/rails.sh
#
# 1. One rxe device, two addresses: a second address on the device's
#    netdev (so a second RoCE v2 GID), `serve --transport ibverbs`
#    listening on both, `cp --bind` both: byte-exact, the summary names
#    two rails, each carried bytes, and rxe0's sent packets rise.
# 2. Two rxe devices on two dummy netdevs: `serve --listen ADDR0
#    --listen ADDR1` (each address on the device that owns it) and
#    `cp -d rxe0,rxe1`: byte-exact, the summary names two device rails,
#    each carried bytes, and both devices' sent packets rise.
# Every command runs under timeout(1).
set -u
: "${RXE_DEV:?run this inside test/rxe/run.sh}" "${RXE_ADDR:?}" "${RXE_NETDEV:?}"
RDMACP=${RDMACP:-/run/rxe-job/bin/rdmacp}
fail=0
W=$(mktemp -d /tmp/rdmacp-rails.XXXXXX)
(umask 077; echo "rails-secret-$$-$RANDOM-$RANDOM" >"$W/secret") # serve refuses a secret others can read
mkdir -p "$W/src" "$W/dst"
head -c $((64 << 20)) /dev/urandom >"$W/src/f"
ADDR2=198.51.100.2
ip addr add $ADDR2/24 dev "$RXE_NETDEV" || { echo "rails: FAIL: second address"; exit 1; }
for _ in $(seq 50); do grep -qs "ffff:c633:6402" /sys/class/infiniband/"$RXE_DEV"/ports/1/gids/* && break; sleep 0.1; done
T=(--transport ibverbs -d "$RXE_DEV" --secret-file "$W/secret")
counter() { cat /sys/class/infiniband/"$RXE_DEV"/ports/1/hw_counters/sent_pkts 2>/dev/null || echo 0; }
timeout 60 "$RDMACP" serve "${T[@]}" --export data="$W/src" --listen "$RXE_ADDR:7480" --listen "$ADDR2:7480" 2>"$W/serve.log" &
spid=$!
for _ in $(seq 100); do grep -q "msg=serving" "$W/serve.log" && break; sleep 0.1; done
before=$(counter)
if ! timeout 60 "$RDMACP" cp "${T[@]}" --bind "$RXE_ADDR,$ADDR2" "$RXE_ADDR:7480:data/f" "$W/dst/f" >"$W/cp.out" 2>"$W/cp.err"; then
	echo "rails: FAIL: cp over two addresses: $(cat "$W/cp.err")"; fail=1
fi
after=$(counter)
cat "$W/cp.out"
if cmp -s "$W/src/f" "$W/dst/f"; then echo "rails: ok: byte-exact over two addresses of $RXE_DEV"; else echo "rails: FAIL: copy differs"; fail=1; fi
if grep -Eq "^rails: $RXE_ADDR->$RXE_ADDR:7480 [0-9.]+ [kMG]?B \(2 QPs\), $ADDR2->$ADDR2:7480 [0-9.]+ [kMG]?B \(2 QPs\)" "$W/cp.out" && ! grep -q " 0 B (" "$W/cp.out"; then
	echo "rails: ok: two rails, each carried bytes"
else
	echo "rails: FAIL: no two-rail line"; fail=1
fi
if [ "$after" -gt "$before" ]; then echo "rails: ok: $RXE_DEV sent_pkts $before -> $after"; else echo "rails: FAIL: $RXE_DEV sent_pkts $before -> $after"; fail=1; fi
kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null

# Two devices: rxe1 on a second dummy netdev. rxe loops a packet back
# only within one device (its own netdev's MAC): rxe0 to an address of
# rxe1 goes out a dummy netdev and is lost (probed: rping from
# 198.51.100.1 to 203.0.113.1 times out; on each device alone it works).
# So each rail loops within its device: cp's device i goes to serve's
# address i, which serve (no -d) binds on the device that owns it.
ADDR1=203.0.113.1
ip link add rxenet1 type dummy && ip link set rxenet1 mtu 9000 up && ip addr add $ADDR1/24 dev rxenet1 &&
	rdma link add rxe1 type rxe netdev rxenet1 2>"$W/rxe1.err" || { echo "rails: FAIL: no second rxe device: $(cat "$W/rxe1.err" 2>/dev/null)"; exit 1; }
for _ in $(seq 50); do grep -qs "ffff:cb00:7101" /sys/class/infiniband/rxe1/ports/1/gids/* && break; sleep 0.1; done
sent() { cat /sys/class/infiniband/"$1"/ports/1/hw_counters/sent_pkts 2>/dev/null || echo 0; }
timeout 90 "$RDMACP" serve --transport ibverbs --secret-file "$W/secret" --export data="$W/src" --listen "$RXE_ADDR:7481" --listen "$ADDR1:7481" 2>"$W/serve2.log" &
spid=$!
for _ in $(seq 100); do grep -q "msg=serving" "$W/serve2.log" && break; sleep 0.1; done
grep "msg=serving" "$W/serve2.log" || { echo "rails: FAIL: serve on two devices: $(cat "$W/serve2.log")"; fail=1; }
b0=$(sent "$RXE_DEV") b1=$(sent rxe1)
rm -f "$W/dst/g"
if ! timeout 90 "$RDMACP" cp --transport ibverbs -d "$RXE_DEV,rxe1" --secret-file "$W/secret" "$RXE_ADDR:7481:data/f" "$W/dst/g" >"$W/cp2.out" 2>"$W/cp2.err"; then
	echo "rails: FAIL: cp -d $RXE_DEV,rxe1: $(cat "$W/cp2.err")"; fail=1
fi
a0=$(sent "$RXE_DEV") a1=$(sent rxe1)
cat "$W/cp2.out"
if cmp -s "$W/src/f" "$W/dst/g"; then echo "rails: ok: byte-exact over $RXE_DEV and rxe1"; else echo "rails: FAIL: copy over two devices differs"; fail=1; fi
if grep -Eq "^rails: $RXE_DEV->$RXE_ADDR:7481 [0-9.]+ [kMG]?B \(2 QPs\), rxe1->$ADDR1:7481 [0-9.]+ [kMG]?B \(2 QPs\)" "$W/cp2.out" && ! grep -q " 0 B (" "$W/cp2.out"; then
	echo "rails: ok: two device rails, each carried bytes"
else
	echo "rails: FAIL: no two-device rails line"; fail=1
fi
if [ "$a0" -gt "$b0" ] && [ "$a1" -gt "$b1" ]; then
	echo "rails: ok: sent_pkts $RXE_DEV $b0 -> $a0, rxe1 $b1 -> $a1"
else
	echo "rails: FAIL: sent_pkts $RXE_DEV $b0 -> $a0, rxe1 $b1 -> $a1: not both rose"; fail=1
fi
kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
rm -rf "$W"
exit $fail
