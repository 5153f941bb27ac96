#!/usr/bin/env bash
# A/B of rdmacp builds on `cp` of one page-cached file, interleaved in one
# run with the baselines: cat | nc into a file (with and without fsync)
# and the plain Go multi-stream file copier (bench/tcpstream, 4 streams,
# with and without fsync). Prints, per method, the median MB/s (min-max)
# and the receiving side's CPU seconds per GB (user+system), then ratios.
#
#   bench/ab.sh [-s SIZE_MiB] [-n RUNS] [-d DIR] [-a "CP FLAGS"] [-x] NAME=BINARY...
#
# With -x it also runs, each round, dd bs=4M of the file into DIR (the
# one-copy ceiling: page cache to new page cache, and its fsync) and
# rdmacp bench of the first binary (READs alone, nothing landed; its rate
# and CPU are the bench's own report).
#
#   bench/ab.sh -n 5 main=/tmp/rdmacp-main direct=/tmp/rdmacp-direct
#
# The first binary serves (iwarp-soft, loopback). Each round runs every
# method once, in order, after one untimed warm-up round; the destination
# is removed and the file system synced before each copy.
set -euo pipefail
size=1024 runs=5 dir= cpflags= extra=0
while getopts s:n:d:a:x o; do
  case $o in s) size=$OPTARG ;; n) runs=$OPTARG ;; d) dir=$OPTARG ;; a) cpflags=$OPTARG ;; x) extra=1 ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-s MiB] [-n RUNS] [-d DIR] NAME=BINARY..." >&2; exit 2; }
cd "$(dirname "$0")/.."
. bench/lib.sh
names=() bins=()
for a in "$@"; do names+=("${a%%=*}"); bins+=("$(realpath "${a#*=}")"); done
[ -n "$dir" ] || dir=$(mktemp -d /var/tmp/rdmacp-ab.XXXXXX)
cleanup() {
  for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/export" "$dir/out"
go build -o "$dir/tcpstream" ./bench/tcpstream
src=$dir/export/file dst=$dir/out/copy
bytes=$((size << 20))
head -c $bytes /dev/urandom >"$src"
cat "$src" >/dev/null


port=$(free_port)
"${bins[0]}" serve --transport iwarp-soft --listen 127.0.0.1:$port --export data="$dir/export" --log-level warn 2>"$dir/serve.log" &
wait_port $port

# Each copy sets t0 t1 (wall clock) and ci (receiving side's CPU s).
copy_rdmacp() { # binary
  t0=$(now)
  # shellcheck disable=SC2086
  /usr/bin/time -o "$dir/time" -f '%U %S' "$1" cp -q --transport iwarp-soft $cpflags 127.0.0.1:$port:data/file "$dst" >/dev/null 2>"$dir/cp.err" ||
    { cat "$dir/cp.err" >&2; exit 1; }
  t1=$(now)
  ci=$(tcpu "$dir/time")
}
copy_nc() { # fsync: 0 or 1
  local np lpid
  for _ in 1 2 3 4 5; do # a port picked as free may be taken by the time nc binds it
    np=$(free_port)
    /usr/bin/time -o "$dir/time" -f '%U %S' nc -l 127.0.0.1 $np >"$dst" 2>"$dir/nc.err" &
    lpid=$!
    for _ in $(seq 100); do ss -ltn 2>/dev/null | grep -q "127.0.0.1:$np " && break; kill -0 $lpid 2>/dev/null || break; sleep 0.02; done
    kill -0 $lpid 2>/dev/null && break
    wait $lpid || true
  done
  t0=$(now)
  cat "$src" | nc -N 127.0.0.1 $np
  wait $lpid
  [ "$1" = 0 ] || sync "$dst"
  t1=$(now)
  ci=$(tcpu "$dir/time")
}
copy_go() { # fsync: true or false
  local np rpid
  for _ in 1 2 3 4 5; do
    np=$(free_port)
    rm -f "$dir/recv.err"
    "$dir/tcpstream" recv -listen 127.0.0.1:$np -n 4 -o "$dst" -fsync="$1" >"$dir/recv.json" 2>"$dir/recv.err" &
    rpid=$!
    for _ in $(seq 500); do grep -q listening "$dir/recv.err" 2>/dev/null && break; kill -0 $rpid 2>/dev/null || break; sleep 0.02; done
    grep -q listening "$dir/recv.err" 2>/dev/null && break
    kill $rpid 2>/dev/null || true
    wait $rpid || true
  done
  t0=$(now)
  "$dir/tcpstream" send -connect 127.0.0.1:$np -n 4 -i "$src" >/dev/null
  wait $rpid
  t1=$(now)
  ci=$(jget cpu_seconds "$dir/recv.json")
}

copy_dd() {
  t0=$(now)
  /usr/bin/time -o "$dir/time" -f '%U %S' dd if="$src" of="$dst" bs=4M conv=fsync status=none
  t1=$(now)
  ci=$(tcpu "$dir/time")
}
bench_rdmacp() { # binary: no landing; t0 t1 stand for the bench's own rate
  "$1" bench --transport iwarp-soft --json -D 3 127.0.0.1:$port:data/file >"$dir/bench.json" 2>"$dir/bench.err" ||
    { cat "$dir/bench.err" >&2; exit 1; }
  t0=0 t1=$(awk -v b=$bytes -v r="$(jget avg_mb_per_s "$dir/bench.json")" 'BEGIN { printf "%.6f", b / (r * 1e6) }')
  ci=$(awk -v c="$(jget cpu_seconds_per_gb "$dir/bench.json")" -v b=$bytes 'BEGIN { printf "%.3f", c * b / 1e9 }')
  cp "$src" "$dst" # nothing landed: for the check below
}

methods=()
for n in "${names[@]}"; do methods+=("rdmacp $n"); done
methods+=("cat | nc" "cat | nc + fsync" "tcpstream" "tcpstream no fsync")
[ $extra = 0 ] || methods+=("dd + fsync" "bench, no landing")
declare -A mb cpu this ratio
for i in $(seq 0 "$runs"); do
  for m in "${methods[@]}"; do
    rm -f "$dst"
    sync
    sleep 0.3
    case $m in
    "rdmacp "*)
      for k in "${!names[@]}"; do [ "rdmacp ${names[$k]}" = "$m" ] && copy_rdmacp "${bins[$k]}"; done ;;
    "cat | nc") copy_nc 0 ;;
    "cat | nc + fsync") copy_nc 1 ;;
    "tcpstream") copy_go true ;;
    "tcpstream no fsync") copy_go false ;;
    "dd + fsync") copy_dd ;;
    "bench, no landing") bench_rdmacp "${bins[0]}" ;;
    esac
    cmp -s "$src" "$dst" || { echo "$m: copy differs" >&2; exit 1; }
    [ "$i" -gt 0 ] || continue # warm-up: digests cached, page cache settled
    r=$(awk -v b=$bytes -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.0f", b / (t1 - t0) / 1e6 }')
    mb[$m]="${mb[$m]:-} $r" this[$m]=$r
    cpu[$m]="${cpu[$m]:-} $(awk -v c="$ci" -v b=$bytes 'BEGIN { printf "%.3f", c / (b / 1e9) }')"
  done
  [ "$i" -gt 0 ] || continue
  # this round's ratios, of every rdmacp build to every other method
  for n in "${names[@]}"; do
    for b in "${methods[@]}"; do
      [ "$b" = "rdmacp $n" ] && continue
      ratio["rdmacp $n|$b"]="${ratio["rdmacp $n|$b"]:-} $(awk -v a="${this["rdmacp $n"]}" -v b="${this[$b]}" 'BEGIN { printf "%.3f", a / b }')"
    done
  done
  echo "round $i/$runs done" >&2
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; print m, a[1] "-" a[NR]}'; }
declare -A med
echo
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), kernel $(uname -r); ${size} MiB page-cached file into $(df -T "$dir" | awk 'NR==2 {print $2}') ($dir); median of $runs rounds"
printf '%-22s %7s %11s %10s %13s   %s\n' method MB/s min-max "CPU s/GB" min-max "samples MB/s"
for m in "${methods[@]}"; do
  read -r a ar <<<"$(echo "${mb[$m]}" | median)"
  read -r c cr <<<"$(echo "${cpu[$m]}" | median)"
  med[$m]=$a
  printf '%-22s %7s %11s %10s %13s  %s\n' "$m" "$a" "$ar" "$c" "$cr" "${mb[$m]}"
done
echo
echo "ratios: of the medians; and the median (min-max) of the ratios within each round"
for n in "${names[@]}"; do
  for b in "${methods[@]}"; do
    [ "$b" = "rdmacp $n" ] && continue
    read -r rm rr <<<"$(echo "${ratio["rdmacp $n|$b"]}" | median)"
    awk -v a="${med["rdmacp $n"]}" -v b="${med[$b]}" -v x="rdmacp $n" -v y="$b" -v rm="$rm" -v rr="$rr" 'BEGIN { printf "%-16s / %-20s = %.2f   per round %.2f (%s)\n", x, y, a / b, rm, rr }'
  done
done
