#!/usr/bin/env bash
# test/longlink/topo.sh - a long link between two network namespaces:
#
#   NAME-a (10.77.0.1, initiator) veth a0 == a1  NAME-m  b1 == b0 veth (10.77.0.2, target) NAME-b
#
# with test/linkemu in NAME-m joining a1 and b1 frame by frame (delay,
# optional rate and loss). Veth MTU 65000 and GSO super-frames kept by the
# emulator: a few thousand frames a second carry hundreds of MB/s.
#
# $LONGLINK_CC, if set (cubic, reno, bbr), is the TCP congestion control
# of both ends' namespaces (net.ipv4.tcp_congestion_control is per
# namespace): the host's default otherwise (bbr on the CI hosts).
#
# The veths' MTU is $LONGLINK_MTU, 65000 unless set: a receiver of a
# lone flow paced below its share may then never open its window past
# one 64948-byte segment (TestCompetingFlow sets 9000; see there).
#
# usage: topo.sh up NAME LINKEMU_BIN [linkemu flags...]   (prints nothing; emulator's log in /tmp/NAME-linkemu.log)
#        topo.sh down NAME                                (stops the emulator, removes the namespaces and its log)
#        topo.sh tbf NAME RATE                            (tbf at RATE, e.g. 1gbit, on the target's egress b0)
set -euo pipefail
cmd=${1:?usage: topo.sh up|down|tbf NAME ...}
name=${2:?name}
case "$cmd" in
up)
  emu=${3:?linkemu binary}
  shift 3
  for ns in a m b; do ip netns add "$name-$ns"; done
  for ns in a m b; do
    ip -n "$name-$ns" link set lo up
    ip netns exec "$name-$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  done
  if [ -n "${LONGLINK_CC:-}" ]; then
    for ns in a b; do ip netns exec "$name-$ns" sysctl -qw net.ipv4.tcp_congestion_control="$LONGLINK_CC"; done
  fi
  ip link add "$name-a0" netns "$name-a" type veth peer name "$name-a1" netns "$name-m"
  ip link add "$name-b0" netns "$name-b" type veth peer name "$name-b1" netns "$name-m"
  for x in a b; do
    for end in 0 1; do
      ns=$name-$x; [ $end = 1 ] && ns=$name-m
      ip -n "$ns" link set "$name-$x$end" mtu "${LONGLINK_MTU:-65000}" up
    done
  done
  ip -n "$name-a" addr add 10.77.0.1/24 dev "$name-a0"
  ip -n "$name-b" addr add 10.77.0.2/24 dev "$name-b0"
  # The emulator's log; it ends with the namespaces (down kills it).
  ip netns exec "$name-m" "$emu" -a "$name-a1" -b "$name-b1" "$@" >"/tmp/$name-linkemu.log" 2>&1 &
  echo $! >"/tmp/$name-linkemu.pid"
  for _ in $(seq 50); do
    grep -q '^linkemu: .* <-> ' "/tmp/$name-linkemu.log" && exit 0
    kill -0 "$(cat "/tmp/$name-linkemu.pid")" 2>/dev/null || break
    sleep 0.1
  done
  cat "/tmp/$name-linkemu.log" >&2
  exit 1
  ;;
tbf)
  rate=${3:?rate}
  # burst: a few 64 KiB frames; latency: room for a full TCP window.
  ip netns exec "$name-b" tc qdisc replace dev "$name-b0" root tbf rate "$rate" burst 512kb latency 400ms
  ;;
down)
  if [ -f "/tmp/$name-linkemu.pid" ]; then
    pid=$(cat "/tmp/$name-linkemu.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "/tmp/$name-linkemu.pid"
  fi
  for ns in a m b; do ip netns del "$name-$ns" 2>/dev/null || true; done
  rm -f "/tmp/$name-linkemu.log"
  ;;
*)
  echo "usage: topo.sh up|down|tbf NAME ..." >&2
  exit 2
  ;;
esac
