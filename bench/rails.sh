#!/usr/bin/env bash
# Rails: one cp of a file over one rail, then over two, between two
# network namespaces joined by two veth pairs, each limited with tbf on
# the target's side (READ responses flow target -> initiator). Rounds
# alternate one rail / two rails, side by side; prints each copy's MB/s,
# the medians, the ratio, and the bytes each rail carried.
#
#   bench/rails.sh [-s SIZE_MiB] [-n RUNS] [-r RATE] [-R RATE2] [-a "CP FLAGS"] [BINARY]
#
#   sudo bench/rails.sh -n 5                   # two 1 Gbit/s rails
#   sudo bench/rails.sh -R 300mbit             # a 1 Gbit/s and a 300 Mbit/s rail
#
# Needs root and iproute2 (ip, tc). BINARY defaults to a build of
# ./cmd/rdmacp. The namespaces are removed on exit, whatever happens.
set -euo pipefail
size=512 runs=3 rate=1gbit rate2= cpflags=
while getopts s:n:r:R:a: o; do
  case $o in s) size=$OPTARG ;; n) runs=$OPTARG ;; r) rate=$OPTARG ;; R) rate2=$OPTARG ;; a) cpflags=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
rate2=${rate2:-$rate}
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "SKIP: bench/rails.sh needs root (ip netns, veth, tc)"; exit 0; }
for t in ip tc python3; do command -v $t >/dev/null || { echo "SKIP: no $t"; exit 0; }; done
work=$(mktemp -d /tmp/rdmacp-rails.XXXXXX)
bin=${1:-}
if [ -z "$bin" ]; then bin=$work/rdmacp; go build -o "$bin" ./cmd/rdmacp; fi
bin=$(realpath "$bin")
t=rbt$$ i=rbi$$
cleanup() {
  for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del $t 2>/dev/null || true
  ip netns del $i 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# burst: 10 ms of the rate, at least 64 KiB (as test/netlab)
burst() { python3 -c "import re,sys; m=re.match(r'(\d+)([gmk])bit','$1'); b=int(m[1])*{'g':10**9,'m':10**6,'k':10**3}[m[2]]//800; print(max(b,65536))"; }
ip netns add $t; ip netns add $i
ip -n $t link set lo up; ip -n $i link set lo up
k=1
for r in "$rate" "$rate2"; do
  ip link add bt$k netns $t type veth peer name bi$k netns $i
  ip -n $t addr add 10.86.$k.1/24 dev bt$k; ip -n $i addr add 10.86.$k.2/24 dev bi$k
  ip -n $t link set bt$k up; ip -n $i link set bi$k up
  ip netns exec $t tc qdisc replace dev bt$k root tbf rate "$r" burst "$(burst "$r")b" latency 50ms
  k=$((k + 1))
done
{ yes rdmacp || true; } | head -c "${size}M" >"$work/f" # data, not holes: a target sends no holes
echo rails-bench-secret >"$work/secret"; chmod 600 "$work/secret"
ip netns exec $t "$bin" serve --export data="$work" --secret-file "$work/secret" --listen 10.86.1.1:7362 2>"$work/s1.log" &
ip netns exec $t "$bin" serve --export data="$work" --secret-file "$work/secret" --listen 10.86.1.1:7363 --listen 10.86.2.1:7363 2>"$work/s2.log" &
sleep 1
copy() { # addr -> prints "MBps rails"
  ip netns exec $i "$bin" cp --json --secret-file "$work/secret" $cpflags "$1:data/f" /dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    d=json.loads(l)
    if d.get("message_type")=="summary":
        print("%.1f" % d["mb_per_s"], " ".join("%s=%dMiB" % (r["remote"], r["bytes"]>>20) for r in d.get("rails") or []))'
}
one=() two=()
echo "rails: ${size} MiB file, rails $rate and $rate2, $runs rounds"
for n in $(seq "$runs"); do
  a=$(copy 10.86.1.1:7362); b=$(copy 10.86.1.1:7363)
  echo "round $n: one rail ${a%% *} MB/s; two rails $b"
  one+=("${a%% *}"); two+=("${b%% *}")
done
med() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
m1=$(med "${one[@]}") m2=$(med "${two[@]}")
echo "median: one rail $m1 MB/s, two rails $m2 MB/s: $(awk "BEGIN { printf \"%.2f\", $m2 / $m1 }")x"
