# Helpers the bench scripts share: source it, don't run it.

# free_port prints a loopback TCP port nothing listens on.
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 30000))
    (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo $p; return; }
  done
}
# wait_port waits up to 15 s for something to listen on loopback port $1.
wait_port() {
  for _ in $(seq 300); do
    (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on $1" >&2
  return 1
}
now() { date +%s.%N; }
# tcpu: user + system seconds from a `time -f "%U %S ..."` file.
tcpu() { awk '{ printf "%.3f", $1 + $2 }' "$1"; }
# jget: the first numeric JSON field $1 in file $2.
jget() { grep -o "\"$1\":[-0-9.e+]*" "$2" | head -1 | cut -d: -f2; }
# pcpu: CPU seconds (user + system) live process $1 has used so far.
pcpu() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.3f", ($12 + $13) / hz }' "/proc/$1/stat"; }
# median_range: the median of the numbers on stdin, then "(min-max)".
median_range() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%s (%s-%s)", m, a[1], a[NR]}'; }
# recv_start OUT ERR TCPSTREAM [ARGS...]: starts `TCPSTREAM recv -listen
# 127.0.0.1:0 ARGS...` in the background, stdout to OUT, stderr to ERR,
# and sets recv_pid and recv_addr from its "listening" line. Port 0: a
# port found free beforehand can be taken (as an ephemeral port) before
# the receiver binds it, and the run then measured nothing.
recv_start() {
  local out=$1 err=$2 ts=$3
  shift 3
  rm -f "$err"
  "$ts" recv -listen 127.0.0.1:0 "$@" >"$out" 2>"$err" &
  recv_pid=$! recv_addr=
  for _ in $(seq 500); do
    recv_addr=$(awk '/^listening/ { print $2 }' "$err" 2>/dev/null)
    [ -n "$recv_addr" ] || ! kill -0 $recv_pid 2>/dev/null && break
    sleep 0.02
  done
  [ -n "$recv_addr" ] || { echo "tcpstream recv did not listen: $(cat "$err")" >&2; return 1; }
}
