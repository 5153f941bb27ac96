#!/usr/bin/env bash
# What the MPA CRC costs `rdmacp cp` of a file the target hashes afresh
# (#27 item 3), builds side by side in one run: each round, for each
# build, a new copy of the source (so that the target hashes it, and with
# span sums keeps each 4 KiB span's CRC from that pass) is copied with
# --mpa-crc on into tmpfs; then the plain Go 4-stream copier
# (bench/tcpstream) copies the same bytes the same way. Prints, per
# method, the median MB/s (min-max), the target's and the initiator's
# CPU seconds per GB (the streamer: sender and receiver), and each
# build's ratio to the streamer, by MB/s and by CPU of both ends.
#
#   bench/spancrc.sh [-s SIZE_MiB] [-n ROUNDS] [-d TMPFS_DIR] [-a "CP FLAGS"] NAME=BINARY...
#
# Each build serves itself (its target's CPU is its own); builds run in
# reverse order every other round. Without binaries it builds this tree.
set -euo pipefail
size=1024 rounds=5 tmp=/dev/shm cpflags="--mpa-crc on"
while getopts s:n:d:a: o; do
  case $o in s) size=$OPTARG ;; n) rounds=$OPTARG ;; d) tmp=$OPTARG ;; a) cpflags=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
cd "$(dirname "$0")/.."
. bench/lib.sh
dir=$(mktemp -d "$tmp/rdmacp-spancrc.XXXXXX")
cleanup() {
  for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
if [ $# -eq 0 ]; then
  go build -o "$dir/rdmacp" ./cmd/rdmacp
  set -- this="$dir/rdmacp"
fi
names=() bins=()
for a in "$@"; do names+=("${a%%=*}"); bins+=("$(realpath "${a#*=}")"); done
go build -o "$dir/tcpstream" ./bench/tcpstream
mkdir -p "$dir/export" "$dir/out"
src=$dir/src bytes=$((size << 20))
head -c $bytes /dev/urandom >"$src"
perGB() { awk -v c="$1" -v b=$bytes 'BEGIN { printf "%.3f", c / (b / 1e9) }'; }
declare -A port spid
for k in "${!names[@]}"; do
  port[$k]=$(free_port)
  "${bins[$k]}" serve --transport iwarp-soft --listen 127.0.0.1:${port[$k]} --export data="$dir/export" --log-level warn 2>"$dir/serve.$k.log" &
  spid[$k]=$!
  wait_port "${port[$k]}"
done

declare -A mb tcpu icpu ratio cratio
stream() { # sets t0 t1 rc sc (receiver, sender CPU s)
  recv_start "$dir/recv.json" "$dir/recv.err" "$dir/tcpstream" -n 4 -o "$dir/out/f" -fsync=false || exit 1
  t0=$(now)
  /usr/bin/time -o "$dir/time" -f '%U %S' "$dir/tcpstream" send -connect "$recv_addr" -n 4 -i "$dir/export/f" >/dev/null
  wait $recv_pid
  t1=$(now)
  rc=$(jget cpu_seconds "$dir/recv.json") sc=$(tcpu "$dir/time")
}
for r in $(seq 0 "$rounds"); do
  order=("${!names[@]}")
  [ $((r % 2)) = 0 ] || order=($(printf '%s\n' "${!names[@]}" | sort -rn))
  declare -A this=()
  for k in "${order[@]}"; do
    rm -f "$dir/out/f" "$dir"/export/*
    cp "$src" "$dir/export/f.$r.$k" # new: hashed afresh
    s0=$(pcpu "${spid[$k]}")
    t0=$(now)
    # shellcheck disable=SC2086
    /usr/bin/time -o "$dir/time" -f '%U %S' "${bins[$k]}" cp -q --transport iwarp-soft $cpflags \
      "127.0.0.1:${port[$k]}:data/f.$r.$k" "$dir/out/f" >/dev/null 2>"$dir/cp.err" || { cat "$dir/cp.err" >&2; exit 1; }
    t1=$(now)
    sleep 0.2 # the target's last bookkeeping
    s1=$(pcpu "${spid[$k]}")
    cmp -s "$src" "$dir/out/f" || { echo "${names[$k]}: copy differs" >&2; exit 1; }
    [ "$r" -gt 0 ] || continue # warm-up
    m="rdmacp ${names[$k]}"
    this[$m]=$(awk -v b=$bytes -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.0f", b / (t1 - t0) / 1e6 }')
    this["$m cpu"]=$(awk -v a="$(perGB "$(awk -v a="$s1" -v b="$s0" 'BEGIN { print a - b }')")" -v b="$(perGB "$(tcpu "$dir/time")")" 'BEGIN { print a + b }')
    mb[$m]="${mb[$m]:-} ${this[$m]}"
    tcpu[$m]="${tcpu[$m]:-} $(perGB "$(awk -v a="$s1" -v b="$s0" 'BEGIN { print a - b }')")"
    icpu[$m]="${icpu[$m]:-} $(perGB "$(tcpu "$dir/time")")"
  done
  rm -f "$dir/out/f" "$dir"/export/*
  cp "$src" "$dir/export/f"
  stream
  cmp -s "$src" "$dir/out/f" || { echo "tcpstream: copy differs" >&2; exit 1; }
  [ "$r" -gt 0 ] || continue
  m=tcpstream
  this[$m]=$(awk -v b=$bytes -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.0f", b / (t1 - t0) / 1e6 }')
  mb[$m]="${mb[$m]:-} ${this[$m]}"
  tcpu[$m]="${tcpu[$m]:-} $(perGB "$sc")"
  icpu[$m]="${icpu[$m]:-} $(perGB "$rc")"
  scpu=$(awk -v a="$(perGB "$sc")" -v b="$(perGB "$rc")" 'BEGIN { print a + b }')
  line="round $r:"
  for n in "${names[@]}"; do
    m="rdmacp $n"
    ratio[$m]="${ratio[$m]:-} $(awk -v a="${this[$m]}" -v b="${this[tcpstream]}" 'BEGIN { printf "%.3f", a / b }')"
    cratio[$m]="${cratio[$m]:-} $(awk -v a="$scpu" -v b="${this["$m cpu"]}" 'BEGIN { printf "%.3f", a / b }')"
    line+=" $n ${this[$m]} MB/s ($(echo "${ratio[$m]}" | awk '{ print $NF }')x)"
  done
  echo "$line; tcpstream ${this[tcpstream]} MB/s; load $(cut -d' ' -f1 /proc/loadavg)"
done
echo "medians of $rounds, $size MiB, cp flags: $cpflags"
printf '%-22s %-24s %-22s %-22s\n' method "MB/s" "target (sender) s/GB" "initiator (receiver) s/GB"
for m in "${!mb[@]}"; do
  printf '%-22s %-24s %-22s %-22s\n' "$m" "$(echo "${mb[$m]}" | median_range)" "$(echo "${tcpu[$m]}" | median_range)" "$(echo "${icpu[$m]}" | median_range)"
done | sort
for n in "${names[@]}"; do
  m="rdmacp $n"
  echo "$m / tcpstream: MB/s $(echo "${ratio[$m]}" | median_range), by CPU of both ends $(echo "${cratio[$m]}" | median_range)"
done
