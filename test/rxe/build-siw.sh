#!/usr/bin/env bash
# test/rxe/build-siw.sh - build the kernel's soft-iWARP driver (siw.ko) out
# of tree for one Debian kernel, from Debian packages only, and cache it.
#
# usage: test/rxe/build-siw.sh KVER OUTDIR
#   KVER    the kernel release the guest boots (uname -r, e.g. 6.1.0-57-amd64)
#   OUTDIR  where siw.ko is kept (cached: nothing is done when OUTDIR/siw.ko
#           was built from the same headers version)
#
# Debian does not build siw (CONFIG_RDMA_SIW is not set). This needs
# linux-headers-KVER (installed with apt-get when missing: it brings the
# matching linux-kbuild and compiler) and linux-source-<major.minor> of the
# same Debian version (only downloaded; drivers/infiniband/sw/siw is taken
# out of it). The headers' version must be the one of the guest's image.
# Prints the path of siw.ko as the last line of stdout; notes go to stderr.
# exit: 0 built or cached; 2 cannot (a reason on stderr: no such headers).
set -euo pipefail
say() { echo "siw: $*" >&2; }
cant() { echo "siw: cannot build: $*" >&2; exit 2; }

KVER=${1:?usage: build-siw.sh KVER OUTDIR}
OUT=${2:?usage: build-siw.sh KVER OUTDIR}
SUDO=
[ "$(id -u)" = 0 ] || SUDO="sudo -n"
HPKG=linux-headers-$KVER
LOG=$OUT/build.log
mkdir -p "$OUT"

installed() { dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed$'; }
if ! installed "$HPKG"; then
	apt-cache show "$HPKG" >/dev/null 2>&1 || $SUDO apt-get update -q >>"$LOG" 2>&1 || true
	apt-cache show "$HPKG" >/dev/null 2>&1 || cant "no package $HPKG in the host's apt sources"
	say "installing $HPKG"
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "$HPKG" make gcc >>"$LOG" 2>&1 ||
		cant "apt-get install $HPKG failed (see $LOG)"
fi
HVER=$(dpkg-query -W -f='${Version}' "$HPKG")
HDIR=/usr/src/$HPKG
[ -d "$HDIR" ] || cant "$HPKG has no $HDIR"

KO=$OUT/siw.ko
if [ -f "$KO" ] && [ "$(cat "$OUT/.version" 2>/dev/null)" = "$HVER" ]; then
	echo "$KO"
	exit 0
fi

# linux-source-X.Y at exactly the headers' version.
MM=$(echo "$HVER" | cut -d. -f1-2)
SPKG=linux-source-$MM
SRC=$OUT/src-$HVER
if [ ! -f "$SRC/.done" ]; then
	t=$(mktemp -d "$OUT/.dl.XXXXXX")
	say "downloading $SPKG=$HVER"
	(cd "$t" && apt-get download -q "$SPKG=$HVER") >>"$LOG" 2>&1 ||
		{ $SUDO apt-get update -q >>"$LOG" 2>&1 || true; (cd "$t" && apt-get download -q "$SPKG=$HVER") >>"$LOG" 2>&1; } ||
		{ rm -rf "$t"; cant "cannot download $SPKG=$HVER (see $LOG)"; }
	rm -rf "$SRC"
	mkdir -p "$SRC"
	# The .deb holds /usr/src/linux-source-X.Y.tar.xz; take siw and the top Makefile.
	dpkg-deb --fsys-tarfile "$t"/*.deb | tar -xO "./usr/src/$SPKG.tar.xz" |
		tar -xJ -C "$SRC" --strip-components=1 "$SPKG/Makefile" "$SPKG/drivers/infiniband/sw/siw"
	rm -rf "$t"
	touch "$SRC/.done"
fi
v=$(awk '$1 == "VERSION" { a = $3 } $1 == "PATCHLEVEL" { b = $3 } $1 == "SUBLEVEL" { c = $3 } END { print a "." b "." c }' "$SRC/Makefile")
[ "$v" = "${HVER%%-*}" ] || say "note: source is $v, headers are $HVER"

B=$OUT/build
rm -rf "$B"
mkdir -p "$B"
cp "$SRC"/drivers/infiniband/sw/siw/*.[ch] "$B/"
cp "$SRC"/drivers/infiniband/sw/siw/Makefile "$B/Kbuild" # obj-$(CONFIG_RDMA_SIW) += siw.o ...
say "building siw.ko against $HDIR"
make -C "$HDIR" M="$B" CONFIG_RDMA_SIW=m -j"$(nproc)" modules >>"$LOG" 2>&1 || cant "make failed (see $LOG)"
vm=$(modinfo -F vermagic "$B/siw.ko")
case $vm in "$KVER "*) ;; *) cant "siw.ko vermagic '$vm' is not $KVER" ;; esac
cp "$B/siw.ko" "$KO"
echo "$HVER" >"$OUT/.version"
say "built $KO ($HVER, depends: $(modinfo -F depends "$KO"))"
echo "$KO"
