#!/usr/bin/env bash
# test/rxe/run.sh - run rdmacp's RDMA tests on kernel Soft-RoCE (rdma_rxe)
# inside a throw-away qemu guest (TCG software emulation), on hosts whose
# own kernel has no RDMA.
#
# usage:
#   test/rxe/run.sh [options]                 # build and run the ibverbs tests
#   test/rxe/run.sh --e2e [options]           # ... then rdmacp end to end (e2e.sh)
#   test/rxe/run.sh [options] -- CMD [ARG...] # run CMD in the guest instead
#   test/rxe/run.sh --interop [options]       # ... then iWARP interop with siw (interop.sh)
#
# The test binaries are built on the host (go test -c -tags rdma) and run
# in the guest, one after another, each in its package directory, with
# -test.v and the options below. The guest boots a stock Debian kernel
# (the extracted vmlinux; bookworm's 6.1 by default) with the host's root
# file system shared read-only over 9p and tmpfs on /tmp and /run; it sets
# up rdma_rxe device rxe0 on a dummy netdev and exports:
#   RXE_DEV=rxe0 RXE_ADDR=<IPv4 of rxe0> RXE_GID_INDEX=<its RoCE v2 GID>
#   RXE_NETDEV RXE_KERNEL=<uname -r>
# Output comes back over a virtio serial port (live), and so does the exit
# status. The host's /tmp, /run and /var/tmp are not visible in the guest
# (tmpfs there); everything else is, read-only.
#
# options:
#   --suite NAME     Debian suite whose kernel to boot: bookworm (default,
#                    Linux 6.1) or trixie (6.12); any suite the host's
#                    Debian archive serves works
#   --pkg PKG        Go package to build and run (repeatable; default
#                    ./verbs/ibverbs when neither --bin nor CMD is given)
#   --bin FILE       run this prebuilt test binary too (repeatable)
#                    With CMD, the binaries are not run but passed to it:
#                    $RXE_TEST_BINS lists their paths in the guest.
#   --run REGEX      passed as -test.run
#   --bench REGEX    passed as -test.bench (with -test.run '^$' unless --run)
#   --args "ARGS"    more arguments for every test binary
#   --race           build the test binaries with the race detector
#   --e2e            also build rdmacp (go build -tags rdma) and, after the
#                    test binaries, run test/rxe/e2e.sh in the same guest:
#                    serve/cp/ls over ibverbs, sha256-verified copies. With
#                    CMD, only build it: $RDMACP is its path in the guest.
#   --perf           --e2e, and then ib_read_bw vs rdmacp cp bandwidth
#   --no-tests       with --e2e or --interop: skip the test binaries (build
#                    none by default)
#   --siw            also load the kernel's soft-iWARP driver: siw.ko is built
#                    on the host from Debian's linux-headers-<kver> and
#                    linux-source-<x.y> of the same version (build-siw.sh,
#                    cached), and the guest creates siw0 on its own dummy
#                    netdev siwnet0 (203.0.113.1/24, so that rdma_cm never
#                    confuses it with rxe0) and exports SIW_DEV=siw0
#                    SIW_ADDR=203.0.113.1 SIW_NETDEV=siwnet0. When siw.ko
#                    cannot be built: "SKIP: siw: <reason>" (exit 0)
#   --interop        --siw, build rdmacp and the pure-Go iWARP provider's
#                    tests (./verbs/iwarp), and after the test binaries and
#                    e2e run test/rxe/interop.sh: rdmacp iwarp-soft <-> siw
#                    both ways, rping against the pure-Go provider, a tshark
#                    capture. With CMD, only build: $RDMACP, $IWARP_TEST
#   --out DIR        a writable directory the guest sees as $RXE_OUT
#                    (/run/rxe-out); what it leaves there is copied to DIR
#   --env K=V        set K in the guest (repeatable)
#   --timeout SECS   stop the guest after SECS (default 1500)
#   --smp N          guest vCPUs (default 1: TCG eats a host core per vCPU)
#   --mem SIZE       guest memory (default 2G)
#   --setup          only install and prepare (packages, kernel, initramfs)
#   --refresh        look up the suite's current kernel again
#   -v               print the guest's kernel console afterwards
#
# environment:
#   RDMACP_RXE_CACHE    cache directory (default ${XDG_CACHE_HOME:-~/.cache}/rdmacp-rxe)
#   RDMACP_RXE_REQUIRE  1: a SKIP becomes a failure (exit 3)
#
# exit status: the tests' (or CMD's; with --e2e, the first failure of
# tests and e2e); 0 after "SKIP: <reason>" when qemu cannot run here; 124
# the guest timed out; 125 the guest failed to report.
set -euo pipefail

ME=rxe
say() { echo "$ME: $*" >&2; }
die() { echo "$ME: error: $*" >&2; exit 125; }
skip() {
	echo "SKIP: $*"
	if [ "${RDMACP_RXE_REQUIRE:-0}" = 1 ]; then
		say "RDMACP_RXE_REQUIRE=1: treating the skip as a failure"
		exit 3
	fi
	exit 0
}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd "$HERE/../.." && pwd -P)
CACHE=${RDMACP_RXE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdmacp-rxe}
SUITE= PKGS=() BINS=() RUN= BENCH= ARGS= ENVS=() TIMEOUT=1500 SMP=1 MEM=2G
SETUP_ONLY=0 REFRESH=0 VERBOSE=0 RACE=() E2E=0 PERF=0 NOTESTS=0 SIW=0 INTEROP=0 OUTDIR=

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
while [ $# -gt 0 ]; do
	case $1 in
	--suite) SUITE=${2:?--suite needs a name}; shift 2 ;;
	--pkg) PKGS+=("${2:?--pkg needs a package}"); shift 2 ;;
	--bin) BINS+=("$(cd "$(dirname "${2:?}")" && pwd -P)/$(basename "$2")"); shift 2 ;;
	--run) RUN=${2?}; shift 2 ;;
	--bench) BENCH=${2?}; shift 2 ;;
	--args) ARGS=${2?}; shift 2 ;;
	--race) RACE=(-race); shift ;;
	--e2e) E2E=1; shift ;;
	--perf) PERF=1; E2E=1; shift ;;
	--no-tests) NOTESTS=1; shift ;;
	--siw) SIW=1; shift ;;
	--interop) INTEROP=1; SIW=1; shift ;;
	--out) OUTDIR=${2:?--out needs a directory}; shift 2 ;;
	--env) ENVS+=("${2:?}"); shift 2 ;;
	--timeout) TIMEOUT=${2:?}; shift 2 ;;
	--smp) SMP=${2:?}; shift 2 ;;
	--mem) MEM=${2:?}; shift 2 ;;
	--setup) SETUP_ONLY=1; shift ;;
	--refresh) REFRESH=1; shift ;;
	-v) VERBOSE=1; shift ;;
	-h | --help) usage; exit 0 ;;
	--) shift; break ;;
	*) usage >&2; exit 2 ;;
	esac
done
CMD=("$@")

# ------------------------------------------------------------ can it run?
[ "$(uname -s)" = Linux ] || skip "not Linux"
[ "$(uname -m)" = x86_64 ] || skip "not an x86_64 host ($(uname -m))"
SUDO=
if [ "$(id -u)" != 0 ]; then
	if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=NONE; fi
fi
HOST_SUITE=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
SUITE=${SUITE:-${HOST_SUITE:-bookworm}}

mkdir -p "$CACHE"
LOG=$CACHE/setup.log
exec 8>"$CACHE/.lock"
flock 8 # one setup at a time; released once the guest starts

# Host packages: qemu and the guest's tools, plus what building the tests needs.
NEED=(qemu-system-x86 busybox-static kmod cpio xz-utils zstd iproute2
	libibverbs1 ibverbs-providers ibverbs-utils librdmacm1 rdmacm-utils perftest
	libibverbs-dev librdmacm-dev)
missing=()
for p in "${NEED[@]}"; do
	dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
APT_UPDATED=0
apt_update() {
	[ $APT_UPDATED = 1 ] && return 0
	APT_UPDATED=1
	$SUDO apt-get update -q >>"$LOG" 2>&1
}
if [ ${#missing[@]} -gt 0 ]; then
	command -v apt-get >/dev/null || skip "no apt-get to install ${missing[*]}"
	[ "$SUDO" != NONE ] || skip "not root and no sudo to install ${missing[*]}"
	say "installing ${missing[*]}"
	if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1; then
		apt_update || skip "apt-get update failed (see $LOG)"
		DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1 ||
			skip "cannot install ${missing[*]} (see $LOG)"
	fi
fi
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 not found"
qemu-system-x86_64 -accel help 2>/dev/null | grep -qx tcg || skip "this qemu has no TCG accelerator"
BUSYBOX=$(command -v busybox || true)
[ -n "$BUSYBOX" ] && file -L "$BUSYBOX" 2>/dev/null | grep -q 'statically linked' ||
	{ [ -x /bin/busybox ] && BUSYBOX=/bin/busybox; }

# ------------------------------------------------------------ kernel
# The Debian archive the host already uses, from its apt sources (deb822
# or one-line), for fetching another suite's kernel.
debian_archive() {
	local f
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		awk -v s="$HOST_SUITE" '
			/^[ \t]*$/ { if (u != "" && ok) { print u; exit } u = ""; ok = 0; next }
			/^URIs:/ { u = $2 }
			/^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) ok = 1 }
			END { if (u != "" && ok) print u }' "$f"
	done | head -1
	[ -f /etc/apt/sources.list ] &&
		awk -v s="$HOST_SUITE" '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) { if ($(i+1) == s) print $i; break } }' /etc/apt/sources.list | head -1
	return 0
}

# apt options for a private view of one suite (nothing gets installed).
suite_apt() {
	local d=$CACHE/apt/$SUITE
	APT=(-o Dir::Etc::sourcelist="$d/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$d/lists"
		-o Dir::Cache="$d/cache" -o Dir::State::status=/dev/null -o APT::Sandbox::User=root)
	if [ ! -f "$d/sources.list" ] || [ $REFRESH = 1 ]; then
		local uri
		uri=$(debian_archive | head -1)
		[ -n "$uri" ] || return 1
		mkdir -p "$d/lists/partial" "$d/cache/archives/partial"
		echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $SUITE main" >"$d/sources.list"
		apt-get "${APT[@]}" update -q >>"$LOG" 2>&1 || return 1
	fi
}

kernel_pkg() { # prints linux-image-<abi> for SUITE
	if [ "$SUITE" = "$HOST_SUITE" ]; then
		apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
	else
		apt-cache "${APT[@]}" depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
	fi
}

# siw is built on the host from linux-headers-<abi>, so the guest must boot
# a kernel whose headers the host's apt index has now. A kernel chosen
# from an older index (cached in suite-$SUITE.pkg) can lose its headers
# when the index moves on (a security update replaces the ABI): then the
# kernel is chosen again, with the headers, from the index as it is now.
headers_in_index() { apt-cache show "linux-headers-${1#linux-image-}" >/dev/null 2>&1; }
kernel_with_headers() { # VAR: keeps $VAR, or sets it to the index's current kernel that has its headers
	local -n kp=$1
	local now
	[ "$SUITE" = "$HOST_SUITE" ] || skip "siw: the guest's suite $SUITE is not the host's ($HOST_SUITE): its headers can't be installed here"
	headers_in_index "$kp" && return
	apt_update || true
	headers_in_index "$kp" && return
	now=$(kernel_pkg)
	[ -n "$now" ] && headers_in_index "$now" ||
		skip "siw: neither $kp nor the index's current kernel (${now:-none}) has linux-headers in the host's apt sources"
	say "kernel $kp has no headers in the apt index any more: the guest boots $now"
	kp=$now
}

# Uncompressed ELF from a bzImage: find a compressed stream that decodes to one.
extract_vmlinux() {
	local in=$1 out=$2 magic tool off
	for magic in 'fd377a585a00:xz -dcq' '28b52ffd:zstd -dcq' '1f8b0800:gzip -dcq'; do
		tool=${magic#*:}
		command -v "${tool%% *}" >/dev/null || continue
		local pat
		pat=$(echo "${magic%%:*}" | sed 's/../\\x&/g')
		for off in $(LC_ALL=C grep -obUaP "$pat" "$in" 2>/dev/null | cut -d: -f1 | head -20); do
			tail -c +$((off + 1)) "$in" | $tool >"$out" 2>/dev/null || true
			if [ "$(head -c 4 "$out" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
				return 0
			fi
		done
	done
	return 1
}

# Modules the guest loads, in this order, with their dependencies.
# crc32_generic must precede rdma_rxe: rxe needs the crypto crc32 and the
# guest has no modprobe to fetch it.
# crc32c_generic + libcrc32c: siw (when --siw loads it) needs the crypto crc32c.
# veth, sch_netem: roce-interop.sh joins two network namespaces with a
# veth pair, and damages it (loss, duplicates, reordering) for a while.
MODS=(virtio_pci virtio_console 9pnet_virtio 9p crc32_generic crc32c_generic libcrc32c dummy veth sch_netem ib_uverbs rdma_rxe rdma_ucm)

prepare_kernel() { # sets KDIR
	local pfile=$CACHE/suite-$SUITE.pkg pkg=
	[ $REFRESH = 0 ] && [ -s "$pfile" ] && pkg=$(cat "$pfile")
	if [ -z "$pkg" ]; then
		if [ "$SUITE" != "$HOST_SUITE" ]; then
			suite_apt || skip "cannot read suite $SUITE from the host's Debian archive (see $LOG)"
		fi
		pkg=$(kernel_pkg)
		if [ -z "$pkg" ] && [ "$SUITE" = "$HOST_SUITE" ]; then
			apt_update || true
			pkg=$(kernel_pkg)
		fi
		[ -n "$pkg" ] || skip "cannot resolve the kernel package of suite $SUITE (see $LOG)"
	fi
	[ $SIW = 0 ] || kernel_with_headers pkg
	KDIR=$CACHE/kernel/$pkg
	local stamp
	stamp=$(printf '%s\n' "${MODS[@]}" | sha256sum | cut -c1-12)
	if [ ! -f "$KDIR/ready" ] || [ "$(cat "$KDIR/ready")" != "$stamp" ]; then
		say "preparing kernel $pkg ($SUITE)"
		local t
		t=$(mktemp -d "$CACHE/.kernel.XXXXXX")
		(
			cd "$t"
			if [ "$SUITE" = "$HOST_SUITE" ]; then
				apt-get download -q "$pkg" >>"$LOG" 2>&1 || { apt_update && apt-get download -q "$pkg" >>"$LOG" 2>&1; }
			else
				[ -n "${APT+x}" ] || suite_apt
				apt-get "${APT[@]}" download -q "$pkg" >>"$LOG" 2>&1
			fi
		) || { rm -rf "$t"; skip "cannot download $pkg (see $LOG)"; }
		dpkg-deb -x "$t"/*.deb "$t/root"
		local mroot=$t/root
		[ -d "$mroot/lib/modules" ] || mroot=$t/root/usr # merged /usr
		local kver
		kver=$(ls "$mroot/lib/modules" | head -1)
		[ -n "$kver" ] || die "$pkg has no modules"
		depmod -b "$mroot" "$kver"
		rm -rf "$KDIR"
		mkdir -p "$KDIR/modules"
		extract_vmlinux "$t/root/boot/vmlinuz-$kver" "$KDIR/vmlinux" || die "cannot extract vmlinux from $pkg"
		local m f b
		: >"$KDIR/modules/order"
		for m in "${MODS[@]}"; do
			modprobe -d "$mroot" -S "$kver" --show-depends "$m" 2>>"$LOG" | awk '$1 == "insmod" { print $2 }' ||
				say "note: no module $m in $kver"
		done | awk '!seen[$0]++' | while read -r f; do
			b=$(basename "$f")
			case $b in
			*.ko.xz) xz -dc "$f" >"$KDIR/modules/${b%.xz}"; b=${b%.xz} ;;
			*.ko.zst) zstd -dcq "$f" >"$KDIR/modules/${b%.zst}"; b=${b%.zst} ;;
			*.ko.gz) gzip -dc "$f" >"$KDIR/modules/${b%.gz}"; b=${b%.gz} ;;
			*) cp "$f" "$KDIR/modules/$b" ;;
			esac
			echo "${b%.ko}" >>"$KDIR/modules/order"
		done
		grep -qx rdma_rxe "$KDIR/modules/order" || die "$pkg has no rdma_rxe module"
		echo "$kver" >"$KDIR/kver"
		rm -rf "$t"
		echo "$stamp" >"$KDIR/ready"
	fi
	echo "$pkg" >"$pfile"
}

# The initramfs: load modules, mount the host's root read-only, tmpfs on
# the writable places, then hand over to the job's guest.sh.
INIT=$(
	cat <<'EOF'
#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /sys /dev /newroot
$B mount -t proc proc /proc
$B mount -t sysfs sysfs /sys
$B mount -t devtmpfs devtmpfs /dev
die() { echo "rxe-init: $*" >/dev/ttyS0; $B poweroff -f; $B sleep 60; }
while read -r m; do
	$B insmod "/modules/$m.ko" || die "insmod $m failed"
done </modules/order
O=trans=virtio,version=9p2000.L,msize=262144
$B mount -t 9p -o $O,ro,cache=loose host /newroot || die "cannot mount the host root"
for d in tmp run var/tmp; do
	$B mount -t tmpfs -o mode=1777 tmpfs /newroot/$d || die "tmpfs on /$d"
done
$B mkdir -p /newroot/run/rxe-job
$B mount -t 9p -o $O,ro,cache=none job /newroot/run/rxe-job || die "cannot mount the job"
$B mount --move /dev /newroot/dev
$B mount --move /proc /newroot/proc
$B mount --move /sys /newroot/sys
exec $B switch_root /newroot /bin/bash /run/rxe-job/guest.sh
die "switch_root failed"
EOF
)

prepare_initrd() {
	local stamp
	stamp=$({ echo "$INIT"; cat "$KDIR/modules/order"; sha256sum <"$BUSYBOX"; } | sha256sum | cut -c1-12)
	[ -f "$KDIR/initrd.gz" ] && [ "$(cat "$KDIR/initrd.stamp" 2>/dev/null)" = "$stamp" ] && return 0
	local r
	r=$(mktemp -d "$CACHE/.initrd.XXXXXX")
	mkdir -p "$r/bin" "$r/modules"
	cp "$BUSYBOX" "$r/bin/busybox"
	cp "$KDIR"/modules/*.ko "$KDIR/modules/order" "$r/modules/"
	printf '%s\n' "$INIT" >"$r/init"
	chmod 755 "$r/init"
	(cd "$r" && find . | cpio -o -H newc --quiet | gzip -1) >"$KDIR/initrd.gz.new"
	mv "$KDIR/initrd.gz.new" "$KDIR/initrd.gz"
	echo "$stamp" >"$KDIR/initrd.stamp"
	rm -rf "$r"
}

T0=$(date +%s.%N)
[ -n "$BUSYBOX" ] || skip "no static busybox for the initramfs"
prepare_kernel
prepare_initrd
KVER=$(cat "$KDIR/kver")
SIWKO=
if [ $SIW = 1 ]; then
	# siw.ko for exactly this kernel; build-siw.sh exits 2 when it can't.
	src=0
	SIWKO=$("$HERE/build-siw.sh" "$KVER" "$CACHE/siw/$KVER" 2>"$CACHE/siw-$KVER.err" | tail -1) || src=$?
	cat "$CACHE/siw-$KVER.err" >&2
	if [ $src != 0 ] || [ ! -f "$SIWKO" ]; then
		skip "siw: $(grep -o 'cannot build: .*' "$CACHE/siw-$KVER.err" | tail -1 || echo "build-siw.sh failed ($src)")"
	fi
fi
if [ $SETUP_ONLY = 1 ]; then
	say "ready: kernel $KVER in $KDIR"
	exit 0
fi

# ------------------------------------------------------------ the job
for d in "${TMPDIR:-/tmp}"/rdmacp-rxe.*; do # left by runs that were killed
	[ -f "$d/pid" ] && ! kill -0 "$(cat "$d/pid")" 2>/dev/null && rm -rf "$d"
done
RUNDIR=$(mktemp -d "${TMPDIR:-/tmp}/rdmacp-rxe.XXXXXX")
echo $$ >"$RUNDIR/pid"
QPID= TAILPID=
cleanup() {
	[ -n "$QPID" ] && kill "$QPID" 2>/dev/null || true
	[ -n "$TAILPID" ] && { sleep 0.2; kill "$TAILPID" 2>/dev/null || true; }
	rm -rf "$RUNDIR"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
JOB=$RUNDIR/job
mkdir -p "$JOB"

# Test binaries, built here (the guest is far too slow to compile) and
# copied into the job: the guest's tmpfs hides the host's /tmp.
[ ${#CMD[@]} -gt 0 ] || [ ${#PKGS[@]} -gt 0 ] || [ ${#BINS[@]} -gt 0 ] || [ $NOTESTS = 1 ] || PKGS=(./verbs/ibverbs)
mkdir -p "$JOB/bin"
: >"$JOB/tests"
GUESTBINS=()
if [ ${#PKGS[@]} -gt 0 ] || [ $E2E = 1 ] || [ $INTEROP = 1 ]; then
	command -v go >/dev/null || die "go is needed to build the test binaries"
fi
if [ $E2E = 1 ] || [ $INTEROP = 1 ]; then
	say "building rdmacp (go build -tags rdma${RACE[*]:+ ${RACE[*]}})"
	(cd "$REPO" && CGO_ENABLED=1 go build -tags rdma "${RACE[@]}" -o "$JOB/bin/rdmacp" ./cmd/rdmacp) || exit 1
	cp "$HERE/e2e.sh" "$JOB/e2e.sh"
fi
if [ $INTEROP = 1 ]; then
	say "building ./verbs/iwarp tests (go test -c${RACE[*]:+ ${RACE[*]}})"
	(cd "$REPO" && go test -c "${RACE[@]}" -o "$JOB/bin/iwarp.test" ./verbs/iwarp) || exit 1
	cp "$HERE/interop.sh" "$JOB/interop.sh"
fi
[ -n "$SIWKO" ] && cp "$SIWKO" "$JOB/siw.ko"
mkdir -p "$RUNDIR/outdir"
for p in "${PKGS[@]}"; do
	name=$(echo "${p#./}" | tr / _).test
	say "building $p (go test -c -tags rdma${RACE[*]:+ ${RACE[*]}})"
	(cd "$REPO" && CGO_ENABLED=1 go test -c -tags rdma "${RACE[@]}" -o "$JOB/bin/$name" "$p") || exit 1
	[ -x "$JOB/bin/$name" ] || { say "$p has no tests"; continue; }
	dir=$(cd "$REPO" && go list -tags rdma -f '{{.Dir}}' "$p")
	printf '%s\t%s\n' "/run/rxe-job/bin/$name" "$dir" >>"$JOB/tests"
	GUESTBINS+=("/run/rxe-job/bin/$name")
done
for b in "${BINS[@]}"; do
	[ -x "$b" ] || die "not an executable: $b"
	name=$(basename "$b")
	cp "$b" "$JOB/bin/$name"
	printf '%s\t%s\n' "/run/rxe-job/bin/$name" "$(pwd -P)" >>"$JOB/tests"
	GUESTBINS+=("/run/rxe-job/bin/$name")
done
if [ ${#CMD[@]} -eq 0 ]; then
	targs=(-test.v)
	[ -n "$RUN" ] && targs+=(-test.run "$RUN")
	if [ -n "$BENCH" ]; then
		targs+=(-test.bench "$BENCH" -test.benchmem)
		[ -n "$RUN" ] || targs+=(-test.run '^$')
	fi
	targs+=(-test.timeout "$((TIMEOUT > 120 ? TIMEOUT - 60 : TIMEOUT))s")
	# shellcheck disable=SC2206
	targs+=($ARGS)
	{
		echo 'rc=0'
		echo 'while IFS="	" read -r bin dir; do'
		echo '  echo "=== $(basename "$bin") (in $dir)"'
		# A checkout under /tmp, /run or /var/tmp is hidden by the guest's
		# tmpfs: run from the job then (the tests read no package files).
		printf '  (cd "$dir" 2>/dev/null || cd /run/rxe-job; "$bin"'
		printf ' %q' "${targs[@]}"
		echo ') </dev/null || { r=$?; echo "=== $(basename "$bin"): exit status $r"; rc=$r; }'
		echo 'done </run/rxe-job/tests'
		if [ $E2E = 1 ]; then
			echo 'echo "=== e2e (rdmacp serve/cp/ls over ibverbs)"'
			printf 'bash /run/rxe-job/e2e.sh%s </dev/null || { r=$?; [ $rc = 0 ] && rc=$r; }\n' "$([ $PERF = 1 ] && echo ' --perf')"
		fi
		if [ $INTEROP = 1 ]; then
			echo 'echo "=== interop (pure-Go iWARP <-> kernel siw)"'
			echo 'bash /run/rxe-job/interop.sh </dev/null || { r=$?; [ $rc = 0 ] && rc=$r; }'
		fi
		echo 'exit $rc'
	} >"$JOB/cmd.sh"
else
	{
		printf 'cd %q || exit 126\n' "$(pwd -P)"
		printf 'exec'
		printf ' %q' "${CMD[@]}"
		echo
	} >"$JOB/cmd.sh"
fi

# Environment for the job: a clean one, plus what the caller forwards.
{
	echo 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8'
	[ -d /usr/local/go/bin ] && echo 'PATH=$PATH:/usr/local/go/bin'
	{ env | grep -E '^(RDMACP_|IBVERBS_|GOTRACEBACK=|GODEBUG=|GOMAXPROCS=|GORACE=)' | grep -v '^RDMACP_RXE_' || true; } | while IFS= read -r kv; do
		printf 'export %q\n' "$kv"
	done
	for kv in "${ENVS[@]}"; do printf 'export %q\n' "$kv"; done
	printf 'export RXE_TEST_BINS=%q\n' "${GUESTBINS[*]}"
	if [ $E2E = 1 ] || [ $INTEROP = 1 ]; then echo 'export RDMACP=/run/rxe-job/bin/rdmacp'; fi
	if [ $INTEROP = 1 ]; then echo 'export IWARP_TEST=/run/rxe-job/bin/iwarp.test'; fi
	printf 'export RXE_SRCDIR=%q\n' "$REPO"
} >"$JOB/env.sh"

# Runs as PID 1 in the guest, on the host's root.
cat >"$JOB/guest.sh" <<'EOF'
#!/bin/bash
for p in /sys/class/virtio-ports/*; do
	case $(cat "$p/name" 2>/dev/null) in
	out) OUT=/dev/${p##*/} ;;
	status) STATUS=/dev/${p##*/} ;;
	esac
done
exec >"${OUT:-/dev/ttyS0}" 2>&1
finish() {
	echo "rc=$1" >"${STATUS:-/dev/ttyS0}"
	sync
	/bin/busybox poweroff -f
	sleep 60
}
bad() { echo "rxe-guest: $*"; dmesg | tail -5; finish 125; }
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts 2>/dev/null
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
ln -sf /proc/self/fd /dev/fd
ulimit -l unlimited
ulimit -n 65536 2>/dev/null
NETDEV=rxenet0 ADDR=198.51.100.1 DEV=rxe0
ip link set lo up
ip link add $NETDEV type dummy || bad "cannot create $NETDEV"
ip link set $NETDEV mtu 9000 up
ip addr add $ADDR/24 dev $NETDEV
rdma link add $DEV type rxe netdev $NETDEV || bad "rdma link add $DEV failed"
P=/sys/class/infiniband/$DEV/ports/1
WANT=0000:0000:0000:0000:0000:ffff:c633:6401 # ::ffff:198.51.100.1
GIDX=
for _ in $(seq 200); do
	if grep -q ACTIVE $P/state 2>/dev/null; then
		for g in $P/gids/*; do
			if [ "$(cat "$g" 2>/dev/null)" = $WANT ] && grep -q 'v2' "$P/gid_attrs/types/${g##*/}" 2>/dev/null; then
				GIDX=${g##*/}
				break 2
			fi
		done
	fi
	sleep 0.05
done
[ -n "$GIDX" ] || bad "$DEV has no active port with a RoCE v2 GID for $ADDR"
. /run/rxe-job/env.sh
export RXE_DEV=$DEV RXE_ADDR=$ADDR RXE_GID_INDEX=$GIDX RXE_NETDEV=$NETDEV RXE_KERNEL=$(uname -r) RXE_VM=1
echo "rxe: guest $(uname -r): $DEV up on $NETDEV $ADDR (RoCE v2 gid $GIDX, mtu $(cat /sys/class/net/$NETDEV/mtu)) after $(cut -d' ' -f1 /proc/uptime)s"
if mkdir -p /run/rxe-out && mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none out /run/rxe-out 2>/dev/null; then
	export RXE_OUT=/run/rxe-out
fi
if [ -f /run/rxe-job/siw.ko ]; then
	# soft-iWARP on its own dummy netdev and subnet, so that rdma_cm's
	# address resolution never picks rxe0 for it (nor siw0 for rxe0's).
	SNET=siwnet0 SADDR=203.0.113.1 SDEV=siw0
	insmod /run/rxe-job/siw.ko || bad "insmod siw.ko failed"
	ip link add $SNET type dummy || bad "cannot create $SNET"
	ip link set $SNET mtu 9000 up
	ip addr add $SADDR/24 dev $SNET
	rdma link add $SDEV type siw netdev $SNET || bad "rdma link add $SDEV failed"
	for _ in $(seq 200); do
		grep -q ACTIVE /sys/class/infiniband/$SDEV/ports/1/state 2>/dev/null && break
		sleep 0.05
	done
	grep -q ACTIVE /sys/class/infiniband/$SDEV/ports/1/state 2>/dev/null || bad "$SDEV port not active"
	export SIW_DEV=$SDEV SIW_ADDR=$SADDR SIW_NETDEV=$SNET
	echo "rxe: $SDEV (iWARP, $(modinfo -F vermagic /run/rxe-job/siw.ko | cut -d' ' -f1)) up on $SNET $SADDR after $(cut -d' ' -f1 /proc/uptime)s"
fi
bash /run/rxe-job/cmd.sh </dev/null
finish $?
EOF

: >"$RUNDIR/out"
: >"$RUNDIR/status"
flock -u 8
say "booting $KVER under TCG (smp $SMP, mem $MEM, timeout ${TIMEOUT}s)"
tail -n +1 -f --pid=$$ "$RUNDIR/out" &
TAILPID=$!
# setpriv: if this script dies unprepared, timeout(1) gets a TERM and
# passes it on to qemu.
PDEATH=()
command -v setpriv >/dev/null && PDEATH=(setpriv --pdeathsig TERM --)
"${PDEATH[@]}" timeout -k 5 "$TIMEOUT" qemu-system-x86_64 -name rdmacp-rxe -nodefaults -no-user-config -machine pc,accel=tcg \
	-cpu max,-erms,-fsrm -smp "$SMP" -m "$MEM" -display none -monitor none -no-reboot -nic none \
	-kernel "$KDIR/vmlinux" -initrd "$KDIR/initrd.gz" -append "console=ttyS0 quiet panic=-1 oops=panic" \
	-serial "file:$RUNDIR/console" \
	-fsdev local,id=hostfs,path=/,security_model=none,readonly=on,multidevs=remap -device virtio-9p-pci,fsdev=hostfs,mount_tag=host \
	-fsdev local,id=jobfs,path="$JOB",security_model=none,readonly=on -device virtio-9p-pci,fsdev=jobfs,mount_tag=job \
	-fsdev local,id=outfs,path="$RUNDIR/outdir",security_model=none -device virtio-9p-pci,fsdev=outfs,mount_tag=out \
	-device virtio-serial-pci \
	-chardev file,id=out,path="$RUNDIR/out" -device virtserialport,chardev=out,name=out \
	-chardev file,id=status,path="$RUNDIR/status" -device virtserialport,chardev=status,name=status \
	</dev/null >"$RUNDIR/qemu.log" 2>&1 &
QPID=$! # timeout(1) passes a kill on to qemu
QRC=0
wait "$QPID" || QRC=$?
QPID=
sleep 0.3
kill "$TAILPID" 2>/dev/null || true
wait "$TAILPID" 2>/dev/null || true
TAILPID=
T1=$(date +%s.%N)
WALL=$(awk -v a="$T0" -v b="$T1" 'BEGIN { printf "%.1f", b - a }')
[ $VERBOSE = 1 ] && { say "--- guest console"; tr -d '\r' <"$RUNDIR/console" >&2 || true; }
if [ -n "$OUTDIR" ] && [ -n "$(ls -A "$RUNDIR/outdir" 2>/dev/null)" ]; then
	mkdir -p "$OUTDIR" && cp -r "$RUNDIR/outdir/." "$OUTDIR/" && say "guest output copied to $OUTDIR"
fi
RC=$(sed -n 's/^rc=\([0-9]*\).*/\1/p' "$RUNDIR/status" | tail -1)
if [ -n "$RC" ]; then
	say "guest $KVER: exit status $RC after ${WALL}s"
	exit "$RC"
fi
if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
	say "guest timed out after ${TIMEOUT}s"
	tr -d '\r' <"$RUNDIR/console" | tail -5 >&2 || true
	exit 124
fi
say "guest reported no status (qemu exit $QRC) after ${WALL}s"
tail -5 "$RUNDIR/qemu.log" >&2 || true
tr -d '\r' <"$RUNDIR/console" | tail -20 >&2 || true
exit 125
