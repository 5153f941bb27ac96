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
