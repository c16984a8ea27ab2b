#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Find the Module.symvers peermem links against, for one target kernel.
#
#   scripts/find-symvers.sh [options] nvidia|ofed
#
# nvidia: the GPU driver's exports (nvidia_p2p_get_pages ...).
# ofed:   the peer-memory core's (ib_register_peer_memory_client), from
#         MLNX_OFED/DOCA-OFED's ib_uverbs (OFED 24.10 on) or ib_core (before).
#
# Options:
#   --kdir DIR      the target kernel's build tree (default
#                   /lib/modules/$(uname -r)/build); its release and
#                   architecture are read from it
#   --release R     the target kernel release (default: from --kdir)
#   --arch A        its architecture (default: from --kdir's .config)
#   --out DIR       where a Module.symvers derived from installed modules is
#                   written (default: a new temporary directory)
#   --root DIR      prefix for /usr/src, /var/lib/dkms and /lib/modules
#                   (the host tests use fake trees); env PEERMEM_SYSROOT
#
# Output: one line on stdout. On success the path of a Module.symvers that
# exports the symbols for that kernel (for ofed: the word `kernel` when the
# kernel's own Module.symvers exports the core, as the rig kernel's does); exit
# 0. On failure `error: <what is missing; the command that fixes it>`; exit 1.
# Notes (which candidate was taken, which were rejected and why) go to stderr.
#
# Where it looks, in order (what MLNX_OFED/DOCA-OFED and NVIDIA's packages
# leave; docs/install.md):
#   ofed:   KDIR/Module.symvers; /usr/src/ofa_kernel-dkms/<arch>/<release>;
#           /usr/src/ofa_kernel/<arch>/<release>; /usr/src/ofa_kernel/<release>;
#           /usr/src/ofa_kernel/default (only if it belongs to <release>: its
#           link target or its configure.mk.kernel names that release);
#           /var/lib/dkms/mlnx-ofed-kernel/<ver>/build (only a <ver> that
#           dkms built for <release>/<arch>); then the installed
#           ib_uverbs.ko / ib_core.ko under /lib/modules/<release>.
#   nvidia: /var/lib/dkms/nvidia*/<ver>/build (only a <ver> built for
#           <release>/<arch>); /usr/src/nvidia-<ver>/{,kernel-open/,kernel/}
#           (only the <ver> of the installed nvidia.ko when one is
#           installed); then the installed nvidia.ko under /lib/modules/<release>.
# <arch> is tried as MOFED spells it (aarch64, x86_64, ppc64le) and as the
# kernel does (arm64). A file must export every symbol checked below. When
# the kernel has CONFIG_MODVERSIONS and the module is installed, a file whose
# CRC disagrees with the installed module's is rejected as stale (that is
# the "disagrees about version of symbol" users see at load).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=${PEERMEM_SYSROOT:-}
kdir='' release='' arch='' out='' what=''
fs_usage='scripts/find-symvers.sh [nvidia|ofed] [--kdir DIR] [--release REL] [--arch ARCH] [--out FILE] [--root DIR] [--help]'
while [ $# -gt 0 ]; do
	case $1 in
	--kdir|--release|--arch|--out|--root)
		[ $# -ge 2 ] && [ -n "$2" ] && [[ $2 != --* ]] ||
			{ printf 'error: find-symvers.sh: option %s needs a value\nusage: %s\n' "$1" "$fs_usage" >&2; exit 2; }
		case $1 in --kdir) kdir=$2 ;; --release) release=$2 ;; --arch) arch=$2 ;; --out) out=$2 ;; --root) root=$2 ;; esac
		shift 2 ;;
	-h|--help) printf 'usage: scripts/find-symvers.sh [options] nvidia|ofed\n\n'; sed -n '3,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//p}' "$0"; exit 0 ;;
	nvidia|ofed) what=$1; shift ;;
	*) printf "error: find-symvers.sh: unknown argument '%s'\nusage: %s\n" "$1" "$fs_usage" >&2; exit 2 ;;
	esac
done
[ -n "$what" ] || { echo "error: find-symvers.sh: say nvidia or ofed (--help)"; exit 1; }
root=${root%/}
[ -n "$kdir" ] || kdir=$root/lib/modules/$(uname -r)/build
if [ -z "$release" ]; then
	release=$(cat "$kdir/include/config/kernel.release" 2>/dev/null) ||
		{ echo "error: $kdir is not a prepared kernel build tree (no include/config/kernel.release); install that kernel's headers or pass --release"; exit 1; }
fi
kconfig() { sed -n "s/^$1=//p" "$kdir/.config" 2>/dev/null; }
if [ -z "$arch" ]; then
	if [ "$(kconfig CONFIG_X86_64)" = y ]; then arch=x86_64
	elif [ "$(kconfig CONFIG_ARM64)" = y ]; then arch=aarch64
	elif [ "$(kconfig CONFIG_PPC64)" = y ]; then
		if [ "$(kconfig CONFIG_CPU_LITTLE_ENDIAN)" = y ]; then arch=ppc64le; else arch=ppc64; fi
	elif [ "$(kconfig CONFIG_S390)" = y ]; then arch=s390x
	elif [ "$(kconfig CONFIG_RISCV)" = y ]; then arch=riscv64
	else arch=$(uname -m)
	fi
fi
# MOFED and dkms write uname -m names; the kernel says arm64 for aarch64.
case $arch in
arm64|aarch64) arches="aarch64 arm64" ;;
*) arches=$arch ;;
esac
modversions=$(kconfig CONFIG_MODVERSIONS)

note() { echo "peermem: $*" >&2; }
rejected=()
reject() { rejected+=("$1 ($2)"); note "not using $1: $2"; }

# exports FILE SYM...: FILE is a Module.symvers exporting every SYM.
exports() {
	local f=$1 s; shift
	[ -f "$f" ] || return 1
	for s; do grep -qs "^[^	]*	$s	" "$f" || return 1; done
}
# exporter FILE SYM: the module FILE says exports SYM (its basename).
exporter() { awk -F'\t' -v s="$2" '$2 == s { n = $3; sub(".*/", "", n); print n; exit }' "$1"; }
crc_of() { awk -F'\t' -v s="$2" '$2 == s { print $1; exit }' "$1"; }

# installed_ko NAME: the installed modules called NAME for the target kernel,
# in depmod's usual priority (updates/, extra/, then the rest).
installed_ko() {
	local d=$root/lib/modules/$release
	[ -d "$d" ] || return 0
	find "$d" \( -name "$1.ko" -o -name "$1.ko.xz" -o -name "$1.ko.zst" -o -name "$1.ko.gz" \) 2>/dev/null |
		awk '{ p = 3; if ($0 ~ /\/updates\//) p = 1; else if ($0 ~ /\/extra\//) p = 2; print p "\t" $0 }' |
		sort | cut -f2-
}

# (created only when something is derived)
[ -n "$out" ] || out=${TMPDIR:-/tmp}/peermem-symvers.$$
# derive NAME PREFIXES SYM...: a Module.symvers of the exports starting with
# one of PREFIXES (a space-separated list) of the first installed NAME that
# exports every SYM; prints its path.
derive() {
	local name=$1 prefix=$2 ko f; shift 2
	f=$out/$name.symvers
	while read -r ko; do
		[ -n "$ko" ] || continue
		mkdir -p "$out" || return 1
		# shellcheck disable=SC2086  # a list of prefixes
		if ! python3 "$here/ko-exports.py" "$ko" "$name" $prefix >"$f.tmp" 2>"$f.err"; then
			reject "$ko" "$(tr '\n' ' ' <"$f.err")no $prefix* exports read"
			continue
		fi
		if exports "$f.tmp" "$@"; then
			mv "$f.tmp" "$f"; rm -f "$f.err"
			note "derived $f from the installed $ko"
			echo "$f"
			return 0
		fi
		reject "$ko" "does not export $*"
	done < <(installed_ko "$name")
	rm -f "$f.tmp" "$f.err"
	return 1
}

# crc_ok FILE SYM NAME: under MODVERSIONS, FILE's CRC of SYM equals the one
# the installed module NAME carries (true when there is nothing to compare).
crc_ok() {
	local f=$1 sym=$2 name=$3 ko want have
	[ "$modversions" = y ] || return 0
	ko=$(installed_ko "$name" | head -n 1)
	[ -n "$ko" ] || return 0
	want=$(python3 "$here/ko-exports.py" "$ko" "$name" "$sym" 2>/dev/null | cut -f1)
	[ -n "$want" ] || return 0
	have=$(crc_of "$f" "$sym")
	[ "$((have))" = "$((want))" ] && return 0
	reject "$f" "CRC of $sym is $have but the installed $ko has $want: it was built for another kernel or driver version"
	return 1
}

# dkms_built NAME VER: dkms built NAME/VER for the target kernel.
dkms_built() {
	local a
	for a in $arches; do
		[ -d "$root/var/lib/dkms/$1/$2/$release/$a" ] && return 0
	done
	return 1
}

# release_of DIR: the kernel release an OFED build directory belongs to
# (its resolved path, else its configure.mk.kernel); empty if unknown.
release_of() {
	local d=$1 real r
	real=$(readlink -f "$d")
	# .../ofa_kernel[-dkms]/<arch>/<release> or .../ofa_kernel/<release>
	case $real in
	*/ofa_kernel/*|*/ofa_kernel-dkms/*)
		r=${real##*/}
		if [ "$r" != default ] && [ -n "$r" ]; then echo "$r"; return; fi ;;
	esac
	sed -n 's/^KVERSION[ :?]*=[ ]*//p' "$real/configure.mk.kernel" 2>/dev/null | head -n 1
}

emit() { echo "$1"; exit 0; }

if [ "$what" = ofed ]; then
	syms=(ib_register_peer_memory_client ib_unregister_peer_memory_client)
	if exports "$kdir/Module.symvers" "${syms[@]}"; then
		note "the peer-memory core is in the kernel itself ($kdir/Module.symvers)"
		emit kernel
	fi
	# shellcheck disable=SC2086  # $arches is a list of words
	for d in $(for a in $arches; do echo "$root/usr/src/ofa_kernel-dkms/$a/$release"; done) \
		$(for a in $arches; do echo "$root/usr/src/ofa_kernel/$a/$release"; done) \
		"$root/usr/src/ofa_kernel/$release" "$root/usr/src/ofa_kernel/default"; do
		f=$d/Module.symvers
		[ -e "$d" ] || continue
		if [ ! -f "$f" ]; then reject "$d" "has no Module.symvers"; continue; fi
		if [ "${d##*/}" = default ]; then
			r=$(release_of "$d")
			if [ -z "$r" ]; then
				reject "$d" "cannot tell which kernel it was built for (its target $(readlink -f "$d") names none and it has no configure.mk.kernel)"
				continue
			fi
			if [ "$r" != "$release" ]; then
				reject "$d" "it points at $(readlink -f "$d"), built for kernel $r, not $release (a stale link left by an OFED install for another kernel)"
				continue
			fi
		fi
		if ! exports "$f" "${syms[@]}"; then reject "$f" "does not export ${syms[*]} (an OFED without the peer-memory core?)"; continue; fi
		crc_ok "$f" "${syms[0]}" "$(exporter "$f" "${syms[0]}")" || continue
		note "ib_register_peer_memory_client from $f (exported by $(exporter "$f" "${syms[0]}"))"
		emit "$f"
	done
	for b in "$root"/var/lib/dkms/mlnx-ofed-kernel/*/build; do
		[ -d "$b" ] || continue
		v=${b%/build}; v=${v##*/}
		if ! dkms_built mlnx-ofed-kernel "$v"; then reject "$b" "dkms has not built mlnx-ofed-kernel/$v for $release/$arch"; continue; fi
		f=$b/Module.symvers
		if ! exports "$f" "${syms[@]}"; then reject "$f" "missing or does not export ${syms[*]}"; continue; fi
		crc_ok "$f" "${syms[0]}" "$(exporter "$f" "${syms[0]}")" || continue
		note "ib_register_peer_memory_client from $f (exported by $(exporter "$f" "${syms[0]}"))"
		emit "$f"
	done
	for m in ib_uverbs ib_core; do
		f=$(derive "$m" "${syms[*]}" "${syms[@]}") && emit "$f"
	done
	msg="no peer-memory core for kernel $release ($arch): ${syms[0]} is not in $kdir/Module.symvers, in no OFED Module.symvers built for this kernel, and no installed ib_uverbs.ko or ib_core.ko under $root/lib/modules/$release exports it"
	[ ${#rejected[@]} -gt 0 ] && msg+=" (rejected: $(IFS=';'; echo "${rejected[*]}"))"
	msg+=". Install MLNX_OFED/DOCA-OFED's kernel modules for this kernel (DOCA: 'apt install doca-ofed' or 'dkms autoinstall -k $release' when mlnx-ofed-kernel-dkms is installed; MLNX_OFED: 'mlnxofedinstall --add-kernel-support'), or pass OFED_SYMVERS=<the Module.symvers of OFED's ib_uverbs/ib_core for $release>"
	echo "error: $msg"
	exit 1
fi

# nvidia
syms=(nvidia_p2p_get_pages nvidia_p2p_put_pages nvidia_p2p_dma_map_pages)
inst=$(installed_ko nvidia | head -n 1)
inst_ver=
[ -n "$inst" ] && inst_ver=$(modinfo -F version "$inst" 2>/dev/null)
for b in "$root"/var/lib/dkms/nvidia*/*/build; do
	[ -d "$b" ] || continue
	v=${b%/build}; v=${v##*/}
	n=${b%/*/build}; n=${n##*/}
	if ! dkms_built "$n" "$v"; then reject "$b" "dkms has not built $n/$v for $release/$arch"; continue; fi
	f=$b/Module.symvers
	if ! exports "$f" "${syms[@]}"; then reject "$f" "missing or does not export ${syms[*]}"; continue; fi
	crc_ok "$f" "${syms[0]}" nvidia || continue
	note "nvidia_p2p_* from $f ($n $v)"
	emit "$f"
done
for f in "$root"/usr/src/nvidia-*/Module.symvers "$root"/usr/src/nvidia-*/kernel-open/Module.symvers \
	"$root"/usr/src/nvidia-*/kernel/Module.symvers; do
	[ -f "$f" ] || continue
	d=${f#"$root"/usr/src/}; d=${d%%/*}; v=${d##*-}
	if [ -n "$inst_ver" ] && [ "$v" != "$inst_ver" ]; then
		reject "$f" "driver $v, but the nvidia.ko installed for $release is $inst_ver"
		continue
	fi
	if ! exports "$f" "${syms[@]}"; then reject "$f" "does not export ${syms[*]}"; continue; fi
	crc_ok "$f" "${syms[0]}" nvidia || continue
	note "nvidia_p2p_* from $f"
	emit "$f"
done
f=$(derive nvidia nvidia_p2p_ "${syms[@]}") && emit "$f"
msg="no NVIDIA driver exports for kernel $release ($arch): no Module.symvers exporting ${syms[0]} built for this kernel (/var/lib/dkms/nvidia*/<ver>/build, /usr/src/nvidia-<ver>) and no installed nvidia.ko under $root/lib/modules/$release"
[ ${#rejected[@]} -gt 0 ] && msg+=" (rejected: $(IFS=';'; echo "${rejected[*]}"))"
msg+=". Install the NVIDIA driver's kernel modules for this kernel first (its DKMS package: 'dkms autoinstall -k $release'; Ubuntu: 'apt install linux-modules-nvidia-<branch>-$release' or nvidia-dkms-<branch>), or pass NV_SYMVERS=<the driver's Module.symvers>"
echo "error: $msg"
exit 1
