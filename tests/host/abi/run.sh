#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# ABI fidelity test (host, no VM): checks that include/peer_mem_abi.h and
# include/nv_p2p_abi.h declare exactly the ABI of the reference peer_mem.h
# and nv-p2p.h shipped in Debian's nvidia-open-kernel-dkms (550 series):
# every struct size, alignment, field offset/size/type, enumerator, typedef,
# function signature and macro (function-like ones evaluated on inputs).
# And include/uapi/peermem.h (/dev/peermem's records and page): it compiles
# alone under the kernel's flags, and tests/host/abi/uapi_layout.c's static
# asserts (every size, offset and number of version 1) hold for user space.
# And what newer drivers (570..595) changed in nv-p2p.h, recorded once as
# facts in tests/host/abi/nv_p2p_newer.tsv: each is checked against
# include/nv_p2p_abi.h (compiled for that driver's page-table layout), and
# the names our header has beyond the 550 reference must be among them.
# Prints TAP; exits non-zero on any failure.
#
#   tests/host/abi/run.sh            # KDIR from scripts/kernel.sh --print-kdir
#   KDIR=/path/to/kernel/build tests/host/abi/run.sh
#
# Environment: KDIR (a built kernel tree), NV_REF_VERSION (upstream version
# of the reference package, default 550.163.01), PEERMEM_CACHE,
# ABI_INCLUDE_DIR (where our two headers are, default include/: point it at
# a modified copy to see the test catch a change without touching the tree),
# ABI_NEWER_FACTS (the facts file, default tests/host/abi/nv_p2p_newer.tsv).
# The reference package is downloaded with apt-get into $PEERMEM_CACHE/debs
# if it is not there yet; its headers are extracted under $PEERMEM_CACHE/src.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../../scripts/lib.sh"
. "$PEERMEM_ROOT/scripts/nvidia-deb.sh"

NV_REF_VERSION=${NV_REF_VERSION:-550.163.01}
ABI_INCLUDE_DIR=${ABI_INCLUDE_DIR:-$PEERMEM_ROOT/include}
pkg=$NV_DEB_PKG

# Setup failures are one TAP failure plus one line on stderr saying what to do.
setup_fail() { # what how-to-fix
	echo "1..1"
	echo "not ok 1 - ABI fidelity test setup: $1"
	echo "# fix: $2"
	echo "peermem: error: $1; $2" >&2
	exit 1
}

for c in python3 make dpkg-deb tar sha256sum; do
	command -v "$c" >/dev/null 2>&1 || setup_fail "'$c' not found" "run scripts/setup-host.sh"
done

# --- the reference headers (scripts/nvidia-deb.sh finds or downloads the .deb)
pm_nvidia_deb "$NV_REF_VERSION" || setup_fail "$NV_DEB_ERR" "$NV_DEB_FIX"
deb=$NV_DEB debver=$NV_DEBVER
ref=$PEERMEM_CACHE/src/${pkg}_$debver
if [ ! -f "$ref/.peermem-extracted" ]; then
	rm -rf "$ref" "$ref.tmp"; mkdir -p "$ref.tmp"
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$ref.tmp" --wildcards \
		'./usr/src/*/nvidia-peermem/*' './usr/src/*/nvidia/nv-p2p.h' ||
		setup_fail "cannot extract the headers from $deb" "delete $deb and rerun"
	mv "$ref.tmp" "$ref" && touch "$ref/.peermem-extracted"
fi
peer_mem_h=$(ls "$ref"/usr/src/*/nvidia-peermem/peer_mem.h 2>/dev/null | head -n1)
nv_p2p_h=$(ls "$ref"/usr/src/*/nvidia/nv-p2p.h 2>/dev/null | head -n1)
[ -n "$peer_mem_h" ] && [ -n "$nv_p2p_h" ] ||
	setup_fail "peer_mem.h or nv-p2p.h missing from $deb" "the package layout changed; update tests/host/abi/run.sh"

# --- the kernel tree and the compiler command line kbuild uses for a module
if [ -z "${KDIR:-}" ]; then
	KDIR=$("$PEERMEM_ROOT/scripts/kernel.sh" --print-kdir 2>/dev/null) ||
		setup_fail "no built rig kernel" "run scripts/kernel.sh first (or set KDIR to a built kernel tree)"
fi
[ -f "$KDIR/Makefile" ] && [ -f "$KDIR/include/generated/autoconf.h" ] && [ -f "$KDIR/.config" ] ||
	setup_fail "KDIR=$KDIR is not a configured kernel build tree" "run scripts/kernel.sh, or point KDIR at a built tree"
KDIR=$(cd "$KDIR" && pwd -P)
llvm=$(sed -n 's/^LLVM=//p' "$KDIR/.peermem-make-args" 2>/dev/null)
llvm=${llvm:--19}

key=$( { echo "$KDIR $llvm"; cat "$KDIR/.config"; } | sha256sum | cut -c1-12)
fdir=$PEERMEM_CACHE/abi-test/kbuild-$key
cmdfile=$fdir/.peermem_abiflags.o.cmd
if [ ! -s "$cmdfile" ]; then
	rm -rf "$fdir"; mkdir -p "$fdir"
	echo 'obj-m := peermem_abiflags.o' > "$fdir/Kbuild"
	printf '/* compiled once so that kbuild records its command line */\nint peermem_abiflags;\n' > "$fdir/peermem_abiflags.c"
	if ! make -s -C "$KDIR" M="$fdir" LLVM="$llvm" peermem_abiflags.o >"$fdir/make.log" 2>&1 || [ ! -s "$cmdfile" ]; then
		sed 's/^/# /' "$fdir/make.log" | tail -n 15
		rm -rf "$fdir"
		setup_fail "cannot build a test object against $KDIR (log above)" \
			"make sure the tree is fully built (scripts/kernel.sh) and LLVM=$llvm is the compiler it was built with"
	fi
fi

# --- the comparison
work=$(mktemp -d "${TMPDIR:-/tmp}/peermem-abi.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 "$here/abicheck.py" --kdir "$KDIR" --kbuild-cmd "$cmdfile" --stubs "$here/stubs" --work "$work" \
	--pair peer_mem "$peer_mem_h" "$ABI_INCLUDE_DIR/peer_mem_abi.h" \
	--pair nv_p2p "$nv_p2p_h" "$ABI_INCLUDE_DIR/nv_p2p_abi.h" \
	--newer "${ABI_NEWER_FACTS:-$here/nv_p2p_newer.tsv}" \
	--uapi peermem_uapi "$ABI_INCLUDE_DIR/uapi/peermem.h" "$here/uapi_layout.c"
