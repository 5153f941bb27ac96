#!/usr/bin/env bash
# bench/longlink.sh - what a long link does to a copy: one `rdmacp cp` of a
# SIZE file (to /dev/null, verified chunk by chunk) across test/linkemu
# between two network namespaces (test/longlink/topo.sh), with no added
# delay and with RTT_MS of round trip, side by side in one run, RUNS times
# each (alternating), and the ratio of the medians. Root only.
#
# usage: bench/longlink.sh [RUNS [RTT_MS [SIZE]]]     defaults: 3 200 512M
#   CP_FLAGS="--qps 4 --depth 4"   extra flags for cp (e.g. the old fixed figures)
#   SERVE_FLAGS="--max-window 256MiB"  extra flags for serve
#   EMU_FLAGS="-rate 100"          extra flags for both links' emulator (rate in MB/s)
#   TBF=800mbit                    a tbf rate limit on the target's egress
#   COMPETE_MBPS=5                 a competing TCP flow, target to initiator, paced at this rate
#   RDMACP_BIN=/path/to/rdmacp     measure that binary (both ends) instead of building ./cmd/rdmacp
#   WMEM_MAX=16777216              raise net.ipv4.tcp_wmem's maximum in the target's namespace
set -euo pipefail
runs=${1:-3}
rtt=${2:-200}
size=${3:-512M}
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (network namespaces)"; exit 0; }
work=$(mktemp -d /tmp/rdmacp-longlink.XXXXXX)
name=llb$$
cleanup() {
  test/longlink/topo.sh down "$name" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
if [ -n "${RDMACP_BIN:-}" ]; then cp "$RDMACP_BIN" "$work/rdmacp"; else go build -o "$work/rdmacp" ./cmd/rdmacp; fi
go build -o "$work/linkemu" ./test/linkemu
go build -o "$work/compete" ./test/longlink/compete
mkdir -p "$work/src"
{ yes rdmacp || true; } | head -c "$size" >"$work/src/f" # data, not holes: a target sends no holes
(umask 077; head -c 32 /dev/urandom | base64 >"$work/secret")
chmod 0600 "$work/secret"

# one DELAY_MS: prints the copy's MB/s and its settled RTT / in-flight
one() {
  local delay=$1
  test/longlink/topo.sh up "$name" "$work/linkemu" -delay "${delay}ms" ${EMU_FLAGS:-}
  [ -z "${TBF:-}" ] || test/longlink/topo.sh tbf "$name" "$TBF"
  [ -z "${WMEM_MAX:-}" ] || ip netns exec "$name-b" sysctl -qw net.ipv4.tcp_wmem="4096 16384 $WMEM_MAX"
  ip netns exec "$name-b" "$work/rdmacp" serve --listen 10.77.0.2:7362 --secret-file "$work/secret" \
    --export x="$work/src" ${SERVE_FLAGS:-} >"$work/serve.log" 2>&1 &
  local spid=$!
  local cpid=
  for _ in $(seq 100); do
    ip netns exec "$name-a" bash -c 'echo >/dev/tcp/10.77.0.2/7362' 2>/dev/null && break
    sleep 0.1
  done
  if [ -n "${COMPETE_MBPS:-}" ]; then
    ip netns exec "$name-a" "$work/compete" recv -listen 10.77.0.1:9100 >/dev/null 2>&1 &
    cpid=$!
    sleep 0.2
    ip netns exec "$name-b" "$work/compete" send -connect 10.77.0.1:9100 -rate "$COMPETE_MBPS" -duration 600s >/dev/null 2>&1 &
    sleep 1
  fi
  ip netns exec "$name-a" "$work/rdmacp" cp --json --secret-file "$work/secret" ${CP_FLAGS:-} \
    10.77.0.2:x/f /dev/null >"$work/cp.json" 2>"$work/cp.err" || true; cat "$work/cp.err" >&2
  [ -n "$cpid" ] && kill "$cpid" 2>/dev/null
  kill "$spid" 2>/dev/null
  wait "$spid" 2>/dev/null || true
  test/longlink/topo.sh down "$name"
  grep '"summary"' "$work/cp.json" | grep -o '"mb_per_s":[0-9.]*' | cut -d: -f2
}

median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
near=() far=()
for i in $(seq "$runs"); do
  a=$(one 0); b=$(one $((rtt / 2)))
  echo "run $i: no delay ${a} MB/s, ${rtt} ms RTT ${b} MB/s"
  near+=("$a") far+=("$b")
done
m0=$(printf '%s\n' "${near[@]}" | median)
m1=$(printf '%s\n' "${far[@]}" | median)
echo "median of $runs: no delay $m0 MB/s, $rtt ms RTT $m1 MB/s, ratio $(awk -v a="$m1" -v b="$m0" 'BEGIN { printf "%.2f", a / b }')"
