#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Build compatibility (host, no VM): peermem must also build against the
# other kernels of its supported range whose source Debian's archive has
# (README, "Supported kernels"): 6.12 LTS (linux-source-6.12, the oldest:
# its Rust `kernel` crate is the oldest peermem builds against) and 7.2
# (linux-source-7.2, trixie-backports); 7.3, the rig's, is the whole
# suite's. For each it prepares a plain (no debug options) Rust-enabled tree
# with `scripts/kernel.sh --kver K --prepare-only` (cached like the rig
# kernel): `make modules_prepare`, which builds the Rust crates a module
# compiles against but no vmlinux, a fraction of a whole kernel build. Then
# it builds peermem against it in a scratch copy of the sources, as the
# DKMS package builds it (PEERMEM_RIG=n), so the 7.3 objects in the
# checkout are not touched, and checks that every kernel symbol the module
# imports is exported by that source (there is no vmlinux, so modpost
# cannot: see exports below). Prints TAP.
#
#   tests/host/compat/run.sh
#
# Environment: PEERMEM_SKIP_COMPAT=1 skips it (one `ok # SKIP` line), e.g.
# for a quick local run; PEERMEM_COMPAT_KVERS (default "6.12 7.2");
# PEERMEM_CACHE.
#
# These kernels have no peer-memory core (no upstream kernel has), so the
# build cannot resolve ib_register_peer_memory_client there; the Makefile's
# PEERMEM_UNRESOLVED_OK=1 lets modpost leave it unresolved (the module would
# not load on these kernels, which is expected: we check it compiles and links).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../../scripts/lib.sh"

kvers=${PEERMEM_COMPAT_KVERS:-6.12 7.2}
if [ "${PEERMEM_SKIP_COMPAT:-0}" = 1 ]; then
	echo "1..1"
	echo "ok 1 - peermem builds against linux $kvers # SKIP PEERMEM_SKIP_COMPAT=1"
	exit 0
fi

set -- $kvers
echo "1..$((5 * $#))"
n=0 fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }

# One kernel version: its five results.
compat() {
local kv=$1 log=$PEERMEM_CACHE/logs/compat-$1 kdir scratch extra
mkdir -p "$log" || { echo "Bail out! cannot create $log"; exit 1; }

if kdir=$("$PEERMEM_ROOT/scripts/kernel.sh" --variant plain --kver "$kv" --prepare-only 2>"$log/kernel.log" | tail -n 1) && [ -f "$kdir/.peermem-prepared" ]; then
	ok "linux $kv (plain, Rust) prepared for modules: $kdir"
else
	notok "linux $kv modules_prepare (log: $log/kernel.log)"
	tail -n 15 "$log/kernel.log" | sed 's/^/#   /'
	echo "# skipping the module build: no $kv tree"
	notok "peermem builds against linux $kv (no kernel)"
	notok "the $kv module names its kernel (no kernel)"
	notok "the PEERMEM_RIG=n module has none of the rig's knobs (no kernel)"
	notok "every kernel symbol the $kv module imports is exported by $kv (no kernel)"
	return
fi

scratch=$(mktemp -d -p "$tmpdir")
# The module's sources only: what `make` in a fresh clone would see.
(cd "$PEERMEM_ROOT" && cp -r Kbuild Makefile rust include scripts "$scratch"/)
rm -f "$scratch"/rust/ffi_generated.rs
extra=()
[ -f "$kdir/.peermem-make-args" ] && read -ra extra <"$kdir/.peermem-make-args"
# As the DKMS and package builds make it: PEERMEM_RIG=n, no rig knobs.
if make -C "$scratch" -j3 KDIR="$kdir" "${extra[@]}" PEERMEM_UNRESOLVED_OK=1 PEERMEM_RIG=n >"$log/module.log" 2>&1 && [ -f "$scratch/peermem.ko" ]; then
	ok "peermem builds against linux $kv (PEERMEM_RIG=n, as DKMS builds it)"
else
	notok "peermem builds against linux $kv (log: $log/module.log)"
	grep -E -m 20 'error|Error' "$log/module.log" | sed 's/^/#   /'
fi

if [ -f "$scratch/peermem.ko" ]; then
	vm=$(modinfo -F vermagic "$scratch/peermem.ko" 2>/dev/null)
	case "$vm" in
	"$kv".*) ok "the $kv module names its kernel (vermagic $vm)" ;;
	*) notok "the $kv module names its kernel (vermagic '$vm')" ;;
	esac
	knobs=$(strings "$scratch/peermem.ko" | grep -c 'inject_delay_')
	if [ "$knobs" = 0 ]; then
		ok "the PEERMEM_RIG=n module has none of the rig's fault-injection knobs (no inject_delay_* name in it)"
	else
		notok "the PEERMEM_RIG=n module still has $knobs inject_delay_* names (the rig's knobs ship)"
	fi
else
	notok "the $kv module names its kernel (no peermem.ko)"
	notok "the PEERMEM_RIG=n module has none of the rig's knobs (no peermem.ko)"
fi

# Exports: modpost has no vmlinux symbol list in a prepared tree, so check
# the module's undefined symbols against what that source exports
# (EXPORT_SYMBOL* in C and assembly, the Rust crates' generated export lists).
# The peer-memory core's and NVIDIA's symbols are not the kernel's.
if [ -f "$scratch/peermem.ko" ]; then
	src=$(readlink -f "$kdir/source" 2>/dev/null || sed -n 's/^# *SRCDIR *:= *//p' "$kdir/Makefile" 2>/dev/null)
	[ -d "$src" ] || src=$(sed -n 's/^include \(.*\)\/Makefile$/\1/p' "$kdir/Makefile" | head -n1)
	exports=$kdir/.peermem-exports
	# Made again when this script is newer (it may name more macro exports).
	if { [ ! -s "$exports" ] || [ "$here/run.sh" -nt "$exports" ]; } && [ -d "$src" ]; then
		dirs=(arch/x86 kernel mm lib fs drivers/base drivers/pci drivers/iommu drivers/char
			drivers/infiniband/core net/core security block rust init)
		{ (cd "$src" && grep -rhoE --include='*.c' --include='*.h' --include='*.S' \
			'EXPORT_[A-Z_]*(SYMBOL|THUNK)[A-Z_]*\( *[A-Za-z_][A-Za-z0-9_]*' "${dirs[@]}" 2>/dev/null)
		  cat "$kdir"/rust/exports_*_generated.h 2>/dev/null | grep -oE 'EXPORT_SYMBOL[A-Z_]*\( *[A-Za-z_][A-Za-z0-9_]*'
		  # Exports made inside a macro, under the name the macro is given:
		  # dev_err() & co (drivers/base/core.c), param_ops_<type> (kernel/params.c)
		  grep -hoE '^define_dev_printk_level\( *[A-Za-z_][A-Za-z0-9_]*' "$src/drivers/base/core.c"
		  grep -hoE '^STANDARD_PARAM_DEF\( *[a-z]+' "$src/kernel/params.c" | sed -E 's/\( */(param_ops_/'
		  # and kstrto*_from_user() (lib/kstrtox.c).
		  grep -hoE '^kstrto_from_user\( *[A-Za-z_][A-Za-z0-9_]*' "$src/lib/kstrtox.c"
		} | sed -E 's/.*\( *//' | sort -u > "$exports.tmp" && mv "$exports.tmp" "$exports"
	fi
	und=$(nm -u "$scratch/peermem.ko" | awk '{print $2}' |
		grep -vE '^(nvidia_p2p_|ib_(un)?register_peer_memory_client$|__this_module$)' | sort -u)
	missing=$(comm -23 <(printf '%s\n' $und) "$exports" 2>/dev/null)
	nund=$(printf '%s\n' $und | grep -c .)
	if [ ! -s "$exports" ]; then
		notok "every kernel symbol the $kv module imports is exported by $kv (no export list from '$src')"
	elif [ -z "$missing" ]; then
		ok "every kernel symbol the $kv module imports ($nund) is exported by $kv's source"
	else
		notok "every kernel symbol the $kv module imports is exported by $kv's source; not exported: $(echo $missing | cut -c1-300)"
	fi
else
	notok "every kernel symbol the $kv module imports is exported by $kv (no peermem.ko)"
fi
}

tmpdir=$(mktemp -d); trap 'rm -rf "$tmpdir"' EXIT
for kv in "$@"; do
	compat "$kv"
done
[ "$fails" = 0 ]
