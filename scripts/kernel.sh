#!/usr/bin/env bash
# Fetch, configure, patch and build the rig kernel; print its build dir (KDIR).
#
#   scripts/kernel.sh [--variant debug|plain|NAME] [--kver 7.3|7.2|6.12] [--prepare-only] [--print-kdir]
#
# --prepare-only stops after `make modules_prepare` (which, with CONFIG_RUST,
# also builds the Rust crates an out-of-tree Rust module compiles against)
# instead of building the whole kernel: enough to prove a module compiles
# there, not to boot it or resolve its symbols. Such a tree lives in its own
# directory (linux-<kver>-<variant>-prep-<hash>), stamped .peermem-prepared,
# and has an empty Module.symvers (there is no vmlinux to take one from), so a
# module build against it must allow unresolved symbols (KBUILD_MODPOST_WARN).
#
# The source is Debian's linux-source-$KVER package. Trees live in
# $PEERMEM_CACHE (default ~/.cache/peermem), one build dir per kernel version,
# variant and config hash, so a warm run only re-makes what changed. The
# patch series under tests/rig/patches is applied to the source tree and
# tracked by a stamp: a changed series is reverted and re-applied in place.
set -euo pipefail
# Read whole before running (the braces below): a script edited while it
# runs, or waits for a lock, must not change under the running shell.
{
. "$(dirname "$0")/lib.sh"

variant=debug
print_only=0 prepare_only=0
usage='scripts/kernel.sh [--variant debug|plain|NAME] [--kver 7.3|7.2|6.12] [--prepare-only] [--print-kdir] [--help]'
while [ $# -gt 0 ]; do
	case "$1" in
	--variant) pm_need_value "$usage" "$@"; variant=$2; shift 2 ;;
	--kver) pm_need_value "$usage" "$@"; RIG_KVER=$2; shift 2 ;;
	--print-kdir) print_only=1; shift ;;
	--prepare-only) prepare_only=1; shift ;;
	-h|--help) pm_help "$0" '^set -euo'; exit 0 ;;
	*) pm_usage_die "unknown argument '$1'" "$usage" ;;
	esac
done
# debug (the rig's: KASAN, lockdep, kmemleak, DMA-API debug, fault
# injection), plain (no debug options: benchmarks, the 6.12 build check), or
# NAME for tests/rig/variant-NAME.config on top of the base (kernel variants
# built and run on request, never by CI: tests/run-all.sh --variant NAME).
case "$variant" in
debug|plain) ;;
*) [[ $variant =~ ^[a-z0-9-]+$ ]] && [ -f "$PEERMEM_ROOT/tests/rig/variant-$variant.config" ] ||
	pm_die "unknown variant '$variant'; use debug, plain or a name with a tests/rig/variant-NAME.config (there: $(cd "$PEERMEM_ROOT/tests/rig" && ls variant-*.config 2>/dev/null | tr '\n' ' '))" ;;
esac

rig=$PEERMEM_ROOT/tests/rig
frags=("$rig/base.config")
[ "$variant" = debug ] && frags+=("$rig/debug.config")
[ -f "$rig/variant-$variant.config" ] && frags+=("$rig/variant-$variant.config")
[ -f "$rig/kernel-$RIG_KVER.config" ] && frags+=("$rig/kernel-$RIG_KVER.config")
# The plain 7.3 kernel (the benchmarks') has its own few lines; the plain 6.12
# build-compatibility kernel has none.
[ "$variant" = plain ] && [ -f "$rig/plain-$RIG_KVER.config" ] && frags+=("$rig/plain-$RIG_KVER.config")
patchdir=$rig/patches/$RIG_KVER
cfg_hash=$(cat "${frags[@]}" | sha256sum | cut -c1-12)

srcroot=$PEERMEM_CACHE/src
if [ "$prepare_only" = 1 ]; then
	objdir=$PEERMEM_CACHE/build/linux-$RIG_KVER-$variant-prep-$cfg_hash stamp=.peermem-prepared
else
	objdir=$PEERMEM_CACHE/build/linux-$RIG_KVER-$variant-$cfg_hash stamp=.peermem-built
fi
if [ "$print_only" = 1 ]; then
	[ -f "$objdir/$stamp" ] || pm_die "no $([ "$prepare_only" = 1 ] && echo prepared || echo built) $variant kernel $RIG_KVER in $objdir; run scripts/kernel.sh first"
	echo "$objdir"; exit 0
fi

# One kernel.sh per kernel version at a time: two would patch, revert and build the
# same source tree at once.
mkdir -p "$PEERMEM_CACHE"
exec 9>"$PEERMEM_CACHE/kernel-$RIG_KVER.lock"
if ! flock -n 9; then
	pm_log "another scripts/kernel.sh is running on $PEERMEM_CACHE; waiting for it"
	flock 9
fi

pm_stage "kernel $RIG_KVER ($variant, config $cfg_hash): toolchain check"
for c in make clang-19 ld.lld-19 flex bison bc cpio rustc bindgen dpkg-deb; do
	pm_need_cmd "$c" "run scripts/setup-host.sh (or the README's setup) first"
done
# gendwarfksyms (MODVERSIONS with Rust: the ubuntu variant) links libdw.
if cat "${frags[@]}" | grep -qx 'CONFIG_GENDWARFKSYMS=y' && [ ! -f /usr/include/elfutils/libdw.h ]; then
	pm_die "this variant has CONFIG_GENDWARFKSYMS, whose host tool needs libdw: apt-get install libdw-dev"
fi
export LIBCLANG_PATH=${LIBCLANG_PATH:-/usr/lib/llvm-19/lib}
[ -d "$LIBCLANG_PATH" ] || pm_die "libclang not found at $LIBCLANG_PATH; apt-get install libclang-19-dev or set LIBCLANG_PATH"

pm_stage "kernel: fetch linux-source-$RIG_KVER"
debdir=$PEERMEM_CACHE/debs
mkdir -p "$debdir" "$srcroot" "$PEERMEM_CACHE/build"
deb=$(ls "$debdir"/linux-source-"$RIG_KVER"_*.deb 2>/dev/null | sort -V | tail -n1 || true)
if [ -z "$deb" ]; then
	cand=$(apt-cache policy "linux-source-$RIG_KVER" 2>/dev/null | awk '/Candidate:/ {print $2}')
	if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
		pm_die "apt knows no linux-source-$RIG_KVER; run scripts/setup-host.sh (it adds trixie-backports for 7.3) and apt-get update"
	fi
	pm_log "wanted linux-source-$RIG_KVER, apt offers version $cand"
	(cd "$debdir" && apt-get download -q -o APT::Sandbox::User=root "linux-source-$RIG_KVER=$cand" >/dev/null) ||
		pm_die "apt-get download linux-source-$RIG_KVER=$cand failed; check the network and apt sources"
	deb=$(ls "$debdir"/linux-source-"$RIG_KVER"_*.deb | sort -V | tail -n1)
fi
debver=$(dpkg-deb -f "$deb" Version)
pm_log "using $(basename "$deb") (Debian version $debver)"

src=$srcroot/linux-source-$RIG_KVER-$debver
if [ ! -f "$src/.peermem-extracted" ]; then
	pm_stage "kernel: extract source"
	rm -rf "$src" "$src.tmp"; mkdir -p "$src.tmp"
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$src.tmp" --wildcards './usr/src/linux-source-*.tar.xz'
	tarball=$(ls "$src.tmp"/usr/src/linux-source-*.tar.xz)
	tar -xJf "$tarball" -C "$src.tmp"
	mv "$src.tmp"/linux-source-"$RIG_KVER" "$src"
	rm -rf "$src.tmp"
	touch "$src/.peermem-extracted"
fi

pm_stage "kernel: patch series"
# The series is every *.patch in $patchdir, in name order. The stamp holds a
# copy of what is applied. A changed series keeps the patches both have in
# common at its start; the rest is reverted (newest first) and the new tail
# applied, so an added patch does not rebuild what the earlier ones touched.
applied=$src/.peermem-patches
want=$(mktemp -d); trap 'rm -rf "$want"' EXIT
if [ -d "$patchdir" ]; then cp "$patchdir"/*.patch "$want"/ 2>/dev/null || true; fi
if [ -d "$applied" ] && diff -rq "$applied" "$want" >/dev/null; then
	pm_log "series unchanged ($(ls "$want" | wc -l) patches)"
else
	mapfile -t have < <(ls "$applied" 2>/dev/null | grep '\.patch$' | sort)
	mapfile -t need < <(ls "$want" | grep '\.patch$' | sort)
	keep=0
	while [ "$keep" -lt "${#have[@]}" ] && [ "$keep" -lt "${#need[@]}" ] &&
		[ "${have[$keep]}" = "${need[$keep]}" ] && cmp -s "$applied/${have[$keep]}" "$want/${need[$keep]}"; do
		keep=$((keep + 1))
	done
	mkdir -p "$applied"
	for ((i = ${#have[@]} - 1; i >= keep; i--)); do
		pm_log "revert ${have[$i]}"
		patch -d "$src" -p1 -R -s -f < "$applied/${have[$i]}" || pm_die "could not revert ${have[$i]} from $src; delete $src to start clean"
		rm -f "$applied/${have[$i]}"
	done
	for ((i = keep; i < ${#need[@]}; i++)); do
		pm_log "apply ${need[$i]}"
		patch -d "$src" -p1 -s -f -N < "$want/${need[$i]}" || pm_die "patch ${need[$i]} does not apply to linux $RIG_KVER ($debver); rebase it"
		cp "$want/${need[$i]}" "$applied"/
	done
fi

pm_stage "kernel: configure $objdir"
mkdir -p "$objdir"
# Clang/LLVM 19: KASAN together with Rust needs a clang-built kernel
# (init/Kconfig: RUST depends on !KASAN || CC_IS_CLANG). Modules built
# against this tree must use the same LLVM= (the Makefile reads it back).
export LLVM=${LLVM:--19}
kmake() { make -C "$src" O="$objdir" LLVM="$LLVM" "$@"; }
echo "LLVM=$LLVM" > "$objdir/.peermem-make-args"
if ! kmake -s rustavailable >"$objdir/rustavailable.log" 2>&1; then
	cat "$objdir/rustavailable.log" >&2
	pm_die "Rust is not available for linux $RIG_KVER (see above); run scripts/setup-host.sh, or set LIBCLANG_PATH"
fi
if [ ! -f "$objdir/.config" ] || [ "$(cat "$objdir/.peermem-config-hash" 2>/dev/null)" != "$cfg_hash" ]; then
	kmake -s tinyconfig >/dev/null
	"$src"/scripts/kconfig/merge_config.sh -m -O "$objdir" "$objdir/.config" "${frags[@]}" >/dev/null
	kmake -s olddefconfig >/dev/null
	echo "$cfg_hash" > "$objdir/.peermem-config-hash"
fi
# Each option is checked for the value its last fragment gives it (as
# merge_config.sh applies them): a variant may override a base line, e.g.
# the ubuntu variant's CONFIG_INFINIBAND=m over base.config's =y.
bad=0
while IFS= read -r line; do
	case "$line" in CONFIG_*=n) opt=${line%%=*}; grep -q "^$opt=" "$objdir/.config" && { pm_log "config: $opt should be off"; bad=1; } ;;
	CONFIG_*) grep -qx "$line" "$objdir/.config" || { pm_log "config: '$line' did not stick (a dependency is missing?)"; bad=1; } ;;
	esac
done < <(cat "${frags[@]}" | grep -v '^#' | sed 's/[[:space:]]*$//' | grep '^CONFIG_' |
	awk -F= '{ if (!($1 in v)) o[n++] = $1; v[$1] = $0 } END { for (i = 0; i < n; i++) print v[o[i]] }')
[ "$bad" = 0 ] || { rm -f "$objdir/.peermem-config-hash"; pm_die "kernel config fragment does not apply cleanly to $RIG_KVER (lines above); fix tests/rig/*.config"; }

target=all
[ "$prepare_only" = 1 ] && target=modules_prepare
# PEERMEM_KERNEL_JOBS: make's -j (default: CPUs + 1); a build beside other
# work on a shared machine asks for fewer.
jobs=${PEERMEM_KERNEL_JOBS:-$(( $(nproc) + 1 ))}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || pm_die "PEERMEM_KERNEL_JOBS wants a positive number, got '$jobs'"
pm_stage "kernel: make $target (-j$jobs, log in $objdir/build.log)"
rm -f "$objdir/$stamp"
if ! kmake -j"$jobs" "$target" >"$objdir/build.log" 2>&1; then
	grep -E 'error|Error' "$objdir/build.log" | head -20 >&2
	tail -n 20 "$objdir/build.log" >&2
	pm_die "kernel build failed; full log: $objdir/build.log"
fi
if [ "$prepare_only" = 1 ]; then
	[ -f "$objdir/rust/libkernel.rmeta" ] || pm_die "make modules_prepare built no Rust kernel crate (rust/libkernel.rmeta) in $objdir; see $objdir/build.log"
	# No vmlinux, so no symbol list: an empty one (see --prepare-only above).
	[ -f "$objdir/Module.symvers" ] || : > "$objdir/Module.symvers"
	touch "$objdir/$stamp"
else
	# A kernel with loadable modules (the ubuntu variant: RDMA as modules,
	# signed and compressed at install) also gets them installed, as a
	# distribution ships them, under $objdir/modroot/lib/modules/<release>;
	# scripts/vm.sh shows that directory to the guest as /lib/modules.
	if grep -q '^CONFIG_MODULES=y' "$objdir/.config" && grep -q '=m$' "$objdir/.config"; then
		pm_stage "kernel: modules_install into $objdir/modroot"
		rm -rf "$objdir/modroot"
		kmake INSTALL_MOD_PATH="$objdir/modroot" modules_install >"$objdir/modules_install.log" 2>&1 ||
			{ tail -n 20 "$objdir/modules_install.log" >&2; pm_die "make modules_install failed; log: $objdir/modules_install.log"; }
	fi
	touch "$objdir/$stamp"
	ln -sfn "$objdir" "$PEERMEM_CACHE/linux-$RIG_KVER-$variant"
fi
pm_stage "kernel: ready"
echo "$objdir"
exit
}
