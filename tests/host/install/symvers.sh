#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# shellcheck disable=SC2154  # ok, notok, scratch: from run.sh
# scripts/find-symvers.sh against fake trees, one per layout that
# MLNX_OFED/DOCA-OFED and NVIDIA's packages leave (docs/install.md), plus the
# Makefile's use of it (`make symvers`). Sourced by run.sh (uses its ok/notok
# and $scratch); needs a C compiler for the fake modules, python3, xz, zstd.

fs=$PEERMEM_ROOT/scripts/find-symvers.sh
rel=7.3.99-fake
other=7.3.98-fake

# mkkdir DIR ARCH [MODVERSIONS] [CORE]: a fake kernel build tree.
mkkdir() {
	mkdir -p "$1/include/config"
	echo "$rel" >"$1/include/config/kernel.release"
	case $2 in
	x86_64) echo CONFIG_X86_64=y >"$1/.config" ;;
	arm64) echo CONFIG_ARM64=y >"$1/.config" ;;
	esac
	[ "${3:-n}" = y ] && echo CONFIG_MODVERSIONS=y >>"$1/.config"
	printf '0x00000000\tprintk\tvmlinux\tEXPORT_SYMBOL\t\n' >"$1/Module.symvers"
	[ "${4:-n}" = y ] && printf '0x00000000\tib_register_peer_memory_client\tvmlinux\tEXPORT_SYMBOL\t\n0x00000000\tib_unregister_peer_memory_client\tvmlinux\tEXPORT_SYMBOL\t\n' >>"$1/Module.symvers"
	return 0
}
# symvers FILE MODULE CRC SYM...: a Module.symvers exporting SYMs.
symvers() {
	local f=$1 m=$2 c=$3 s; shift 3
	mkdir -p "$(dirname "$f")"
	: >"$f"
	for s; do printf '%s\t%s\t%s\tEXPORT_SYMBOL\t\n' "$c" "$s" "$m" >>"$f"; done
}
ofed_syms=(ib_register_peer_memory_client ib_unregister_peer_memory_client)
nv_syms=(nvidia_p2p_get_pages nvidia_p2p_put_pages nvidia_p2p_dma_map_pages)
# fakeko FILE VERSION CRC SYM...: a relocatable ELF object shaped like an
# installed module: __ksymtab_<sym>, __crc_<sym> in __kcrctab (5.19+ style)
# and .modinfo version=. Compressed by the FILE's suffix.
fakeko() {
	local f=$1 v=$2 c=$3 s src; shift 3
	src=$scratch/fake.c
	: >"$src"
	for s; do
		printf 'int %s(void) { return 0; }\n' "$s"
		printf 'const unsigned long __ksymtab_%s __attribute__((section("__ksymtab"),used)) = 0;\n' "$s"
		printf 'const unsigned int __crc_%s __attribute__((section("__kcrctab"),used)) = %s;\n' "$s" "$c"
	done >>"$src"
	printf 'static const char mi[] __attribute__((section(".modinfo"),used)) = "version=%s";\n' "$v" >>"$src"
	mkdir -p "$(dirname "$f")"
	local o=${f%.xz}; o=${o%.zst}
	cc -c -o "$o" "$src" || return 1
	case $f in
	*.xz) xz -f "$o" ;;
	*.zst) zstd -q --rm -f "$o" ;;
	esac
}

# case_run NAME: a fresh root and kdir in $t, $k.
newcase() {
	t=$scratch/c$((++caseno)); k=$t/kdir
	mkdir -p "$t"
}
caseno=0
# find WHAT [ARGS]: run the script; sets $o (stdout), $e (stderr), $rc.
find_() {
	o=$(bash "$fs" --root "$t" --kdir "$k" --out "$t/out" "$@" 2>"$t/err"); rc=$?
	e=$(cat "$t/err")
}
expect_path() { # DESC PATH
	if [ "$rc" = 0 ] && [ "$o" = "$2" ]; then ok "$1"; else
		notok "$1 (rc $rc, got '$o', want '$2')"; sed 's/^/#   /' "$t/err"; fi
}
expect_error() { # DESC REGEX...
	local d=$1 r; shift
	if [ "$rc" != 1 ]; then notok "$d (rc $rc, out '$o')"; return; fi
	for r; do
		if ! grep -qE -- "$r" <<<"$o"; then notok "$d (error lacks /$r/: $o)"; return; fi
	done
	ok "$d"
}

# ---- OFED
newcase; mkkdir "$k" x86_64 n y
find_ ofed; expect_path "ofed: core in the kernel's own Module.symvers -> kernel" kernel

newcase; mkkdir "$k" x86_64
symvers "$t/usr/src/ofa_kernel-dkms/x86_64/$rel/Module.symvers" drivers/infiniband/core/ib_uverbs 0x0 "${ofed_syms[@]}"
mkdir -p "$t/usr/src/ofa_kernel/x86_64"
ln -s "../../ofa_kernel-dkms/x86_64/$rel" "$t/usr/src/ofa_kernel/x86_64/$rel"
ln -s "x86_64/$rel" "$t/usr/src/ofa_kernel/default"
find_ ofed
expect_path "ofed: DOCA layout /usr/src/ofa_kernel-dkms/<arch>/<release>" "$t/usr/src/ofa_kernel-dkms/x86_64/$rel/Module.symvers"
if grep -q 'exported by ib_uverbs' <<<"$e"; then ok "ofed: says the core comes from ib_uverbs (OFED 24.10 on)"; else notok "ofed: names ib_uverbs ($e)"; fi

newcase; mkkdir "$k" x86_64
symvers "$t/usr/src/ofa_kernel/x86_64/$rel/Module.symvers" drivers/infiniband/core/ib_core 0x0 "${ofed_syms[@]}"
find_ ofed
expect_path "ofed: /usr/src/ofa_kernel/<arch>/<release>" "$t/usr/src/ofa_kernel/x86_64/$rel/Module.symvers"
if grep -q 'exported by ib_core' <<<"$e"; then ok "ofed: says the core comes from ib_core (before 24.10)"; else notok "ofed: names ib_core ($e)"; fi

newcase; mkkdir "$k" x86_64
symvers "$t/usr/src/ofa_kernel/$rel/Module.symvers" ib_core 0x0 "${ofed_syms[@]}"
find_ ofed; expect_path "ofed: /usr/src/ofa_kernel/<release>" "$t/usr/src/ofa_kernel/$rel/Module.symvers"

newcase; mkkdir "$k" x86_64
symvers "$t/usr/src/ofa_kernel/x86_64/$other/Module.symvers" ib_uverbs 0x0 "${ofed_syms[@]}"
ln -s "x86_64/$other" "$t/usr/src/ofa_kernel/default"
find_ ofed
expect_error "ofed: a stale default pointing at another kernel is rejected, naming it and the fix" \
	"default.*built for kernel $other, not $rel" "dkms autoinstall -k $rel" "OFED_SYMVERS="

newcase; mkkdir "$k" x86_64
symvers "$t/usr/src/ofa_kernel/x86_64/$rel/Module.symvers" ib_uverbs 0x0 ib_other_symbol
find_ ofed
expect_error "ofed: a Module.symvers without the peer-memory core is rejected" "does not export ib_register_peer_memory_client"

newcase; mkkdir "$k" x86_64
mkdir -p "$t/usr/src/ofa_kernel/default"
symvers "$t/usr/src/ofa_kernel/default/Module.symvers" ib_core 0x0 "${ofed_syms[@]}"
echo "KVERSION=$rel" >"$t/usr/src/ofa_kernel/default/configure.mk.kernel"
find_ ofed; expect_path "ofed: a default directory whose configure.mk.kernel names this release" "$t/usr/src/ofa_kernel/default/Module.symvers"
echo "KVERSION=$other" >"$t/usr/src/ofa_kernel/default/configure.mk.kernel"
find_ ofed; expect_error "ofed: ... and is rejected when it names another" "built for kernel $other"

newcase; mkkdir "$k" arm64
symvers "$t/usr/src/ofa_kernel/x86_64/$rel/Module.symvers" ib_uverbs 0x0 "${ofed_syms[@]}"
symvers "$t/usr/src/ofa_kernel/aarch64/$rel/Module.symvers" ib_uverbs 0x0 "${ofed_syms[@]}"
find_ ofed; expect_path "ofed: an arm64 kernel takes MOFED's aarch64 directory, not x86_64's" "$t/usr/src/ofa_kernel/aarch64/$rel/Module.symvers"
rm -r "$t/usr/src/ofa_kernel/aarch64"
find_ ofed; expect_error "ofed: ... and never another architecture's" "no peer-memory core for kernel $rel \(aarch64\)"

newcase; mkkdir "$k" x86_64
symvers "$t/var/lib/dkms/mlnx-ofed-kernel/5.8/build/Module.symvers" ib_core 0x0 "${ofed_syms[@]}"
mkdir -p "$t/var/lib/dkms/mlnx-ofed-kernel/5.8/$other/x86_64"
find_ ofed; expect_error "ofed: an old /var/lib/dkms/mlnx-ofed-kernel build for another kernel is rejected" "has not built mlnx-ofed-kernel/5.8 for $rel"
mkdir -p "$t/var/lib/dkms/mlnx-ofed-kernel/5.8/$rel/x86_64"
find_ ofed; expect_path "ofed: ... and taken when dkms built it for this kernel" "$t/var/lib/dkms/mlnx-ofed-kernel/5.8/build/Module.symvers"

newcase; mkkdir "$k" x86_64 y
fakeko "$t/lib/modules/$rel/updates/dkms/ib_uverbs.ko.xz" 25.04 0x5eed1234 "${ofed_syms[@]}" ib_uverbs_other
find_ ofed
if [ "$rc" = 0 ] && [ "$o" = "$t/out/ib_uverbs.symvers" ] &&
	[ "$(awk -F'\t' '$2 == "ib_register_peer_memory_client" { print $1 "," $3 }' "$o")" = "0x5eed1234,ib_uverbs" ] &&
	! grep -q ib_uverbs_other "$o"; then
	ok "ofed: no Module.symvers (Canonical's DOCA DKMS): entries derived from the installed ib_uverbs.ko.xz, with its CRC"
else notok "ofed: derived from ib_uverbs.ko.xz (rc $rc, out '$o': $(cat "$o" 2>/dev/null))"; sed 's/^/#   /' "$t/err"; fi

symvers "$t/usr/src/ofa_kernel/x86_64/$rel/Module.symvers" ib_uverbs 0x11111111 "${ofed_syms[@]}"
find_ ofed
if [ "$o" = "$t/out/ib_uverbs.symvers" ] && grep -q 'CRC of ib_register_peer_memory_client is 0x11111111 but the installed' <<<"$e"; then
	ok "ofed: MODVERSIONS: a Module.symvers whose CRC disagrees with the installed module is rejected as stale"
else notok "ofed: stale CRC (out '$o'; $e)"; fi

newcase; mkkdir "$k" x86_64
fakeko "$t/lib/modules/$rel/kernel/drivers/infiniband/core/ib_core.ko" 1 0 ib_register_client
find_ ofed
expect_error "ofed: nothing for this kernel (the distro's ib_core has no peer-memory core): names what is missing and the fix" \
	"no peer-memory core for kernel $rel \(x86_64\)" "ib_uverbs.ko or ib_core.ko" "apt install doca-ofed" "OFED_SYMVERS="

# ---- NVIDIA
newcase; mkkdir "$k" x86_64
symvers "$t/var/lib/dkms/nvidia/570.9/build/Module.symvers" nvidia 0x0 "${nv_syms[@]}"
mkdir -p "$t/var/lib/dkms/nvidia/570.9/$other/x86_64"
find_ nvidia
expect_error "nvidia: a DKMS build dir of a driver version not built for this kernel is rejected" "has not built nvidia/570.9 for $rel" "NV_SYMVERS="
symvers "$t/var/lib/dkms/nvidia/580.1/build/Module.symvers" nvidia 0x0 "${nv_syms[@]}"
mkdir -p "$t/var/lib/dkms/nvidia/580.1/$rel/x86_64"
find_ nvidia; expect_path "nvidia: Debian/Ubuntu DKMS /var/lib/dkms/nvidia/<ver>/build of the version built for this kernel" "$t/var/lib/dkms/nvidia/580.1/build/Module.symvers"

newcase; mkkdir "$k" x86_64
fakeko "$t/lib/modules/$rel/updates/dkms/nvidia.ko" 580.1 0 "${nv_syms[@]}"
symvers "$t/usr/src/nvidia-570.9/kernel-open/Module.symvers" nvidia 0x0 "${nv_syms[@]}"
symvers "$t/usr/src/nvidia-580.1/kernel-open/Module.symvers" nvidia 0x0 "${nv_syms[@]}"
find_ nvidia
if [ "$rc" = 0 ] && [ "$o" = "$t/usr/src/nvidia-580.1/kernel-open/Module.symvers" ] && grep -q 'driver 570.9, but the nvidia.ko installed' <<<"$e"; then
	ok "nvidia: /usr/src/nvidia-<ver>/kernel-open of the installed driver's version, not another's"
else notok "nvidia: /usr/src/nvidia-<ver> (rc $rc, '$o'; $e)"; fi

newcase; mkkdir "$k" x86_64 y
fakeko "$t/lib/modules/$rel/kernel/drivers/video/nvidia.ko.zst" 580.1 0xabcdef01 "${nv_syms[@]}" nvidia_p2p_free_page_table
find_ nvidia
if [ "$rc" = 0 ] && [ "$o" = "$t/out/nvidia.symvers" ] && [ "$(wc -l <"$o")" = 4 ] &&
	[ "$(awk -F'\t' '$2 == "nvidia_p2p_get_pages" { print $1 "," $3 }' "$o")" = "0xabcdef01,nvidia" ]; then
	ok "nvidia: .run installer / precompiled package (no Module.symvers): derived from the installed nvidia.ko.zst, 4 nvidia_p2p_* with CRCs"
else notok "nvidia: derived from nvidia.ko.zst (rc $rc, '$o': $(cat "$o" 2>/dev/null))"; sed 's/^/#   /' "$t/err"; fi

newcase; mkkdir "$k" x86_64
find_ nvidia
expect_error "nvidia: nothing installed: names what is missing and the fix" \
	"no NVIDIA driver exports for kernel $rel" "dkms autoinstall -k $rel" "NV_SYMVERS="

newcase
find_ nvidia
expect_error "a --kdir that is no kernel tree: says so" "is not a prepared kernel build tree"

# ---- The Makefile uses it (`make symvers`, a scratch copy without gpusim).
if [ -n "${KDIR:-}" ] && [ -f "$KDIR/include/config/kernel.release" ]; then
	krel=$(cat "$KDIR/include/config/kernel.release")
	mk=$scratch/src; mkdir -p "$mk"
	(cd "$PEERMEM_ROOT" && cp -r Kbuild Makefile rust include scripts "$mk"/)
	newcase
	mout=$(PEERMEM_SYSROOT=$t make -s -C "$mk" KDIR="$KDIR" symvers 2>&1); mrc=$?
	if [ "$mrc" != 0 ] && grep -q "no NVIDIA driver exports for kernel $krel" <<<"$mout"; then
		ok "make symvers without a GPU driver stops with find-symvers' message"
	else notok "make symvers without a driver (rc $mrc: $mout)"; fi
	fakeko "$t/lib/modules/$krel/updates/dkms/nvidia.ko" 580.1 0 "${nv_syms[@]}"
	mout=$(PEERMEM_SYSROOT=$t make -s -C "$mk" KDIR="$KDIR" symvers 2>&1); mrc=$?
	if [ "$mrc" = 0 ] && grep -q "nvidia_p2p_\* from $mk/.symvers/$krel/nvidia.symvers" <<<"$mout" &&
		grep -q 'from the kernel' <<<"$mout"; then
		ok "make symvers takes the entries derived from an installed nvidia.ko (and the rig kernel's own core)"
	else notok "make symvers with an installed nvidia.ko (rc $mrc: $mout)"; fi
else
	ok "make symvers # SKIP no KDIR given"
	ok "make symvers (installed nvidia.ko) # SKIP no KDIR given"
fi
