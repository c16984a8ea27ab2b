#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# shellcheck disable=SC2154  # ok, notok, scratch: from run.sh
# scripts/doctor.sh against fake machines (--root): a good set-up passes
# every check; then one thing at a time is broken and the check for it must
# turn FAIL or WARN with its fix, and the exit status must follow. Fake
# rustc-1.92 / bindgen-0.71 (Ubuntu's versioned names) come first in PATH.
# Sourced by run.sh.

doc=$PEERMEM_ROOT/scripts/doctor.sh
drel=7.0.0-10-generic
bin=$scratch/doctor-bin
mkdir -p "$bin"
printf '#!/bin/sh\necho "rustc 1.92.0 (ded5c06cf 2025-12-08)"\n' >"$bin/rustc-1.92"
printf '#!/bin/sh\necho "bindgen 0.71.1"\n' >"$bin/bindgen-0.71"
chmod +x "$bin"/*

# good DIR: a machine where everything is right (drop-in loaded, registered).
good() {
	local r=$1
	rm -rf "$r"; mkdir -p "$r/proc/sys/kernel" "$r/boot" "$r/lib/modules/$drel/build/rust" \
		"$r/sys/module/mlx_compat" "$r/sys/module/nvidia" "$r/sys/module/nvidia_peermem/parameters" \
		"$r/sys/kernel/debug/nvidia_peermem" "$r/sys/firmware/efi/efivars" "$r/proc/driver/nvidia" \
		"$r/lib/modules/$drel/updates/dkms"
	echo "$drel" >"$r/proc/sys/kernel/osrelease"
	printf 'CONFIG_RUST=y\nCONFIG_RUSTC_VERSION_TEXT="rustc 1.92.0 (ded5c06cf 2025-12-08)"\nCONFIG_BINDGEN_VERSION_TEXT="bindgen 0.71.1"\nCONFIG_DMA_SHARED_BUFFER=y\n' >"$r/boot/config-$drel"
	cp "$r/boot/config-$drel" "$r/lib/modules/$drel/build/.config"
	: >"$r/lib/modules/$drel/build/rust/libkernel.rmeta"
	printf 'ffffffffc1000000 T ib_register_peer_memory_client\t[ib_uverbs]\nffffffffc2000000 T nvidia_p2p_get_pages\t[nvidia]\n' >"$r/proc/kallsyms"
	echo "25.04-0.6.1" >"$r/sys/module/mlx_compat/version"
	echo "580.95.05" >"$r/sys/module/nvidia/version"
	echo "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05" >"$r/proc/driver/nvidia/version"
	echo 0.2.0 >"$r/sys/module/nvidia_peermem/version"
	echo Y >"$r/sys/module/nvidia_peermem/parameters/enable_nc"
	echo nv_mem >"$r/sys/module/nvidia_peermem/parameters/peer_name"
	echo 5 >"$r/sys/kernel/debug/nvidia_peermem/registrations_acquired"
	echo 3 >"$r/sys/kernel/debug/nvidia_peermem/registrations_released"
	echo 0 >"$r/sys/kernel/debug/nvidia_peermem/errors"
	echo 0x00020000 >"$r/sys/kernel/debug/nvidia_peermem/last_pin_version"
	printf '\x07\x00\x00\x00\x00' >"$r/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
	printf 'static const char v[] __attribute__((section(".modinfo"),used)) = "version=0.2.0\\0parm=enable_nc:Register nv_mem_nc";\n' >"$scratch/dm.c"
	cc -c -o "$r/lib/modules/$drel/updates/dkms/nvidia_peermem.ko" "$scratch/dm.c"
	mkdir -p "$r/lib/modules/$drel/updates/peermem" "$r/usr/src/peermem-0.2.0"
	ln -s ../dkms/nvidia_peermem.ko "$r/lib/modules/$drel/updates/peermem/nvidia_peermem.ko"
	printf 'updates/peermem/nvidia_peermem.ko:\nupdates/dkms/nvidia-uvm.ko:\n' >"$r/lib/modules/$drel/modules.dep"
	# NVIDIA's DKMS nvidia-peermem.ko beside it (what depmod must not take).
	printf 'static const char v[] __attribute__((section(".modinfo"),used)) = "version=580.95.05";\n' >"$scratch/dn.c"
	cc -c -o "$r/lib/modules/$drel/updates/dkms/nvidia-peermem.ko" "$scratch/dn.c"
}
dr=$scratch/doctor-root
rundoc() { dout=$(PATH="$bin:$PATH" bash "$doc" --root "$dr" 2>&1); drc=$?; }
# line CHECK: the doctor's line for CHECK.
line() { grep -E "^[A-Z]+ +$1: " <<<"$dout"; }

good "$dr"; rundoc
if [ "$drc" = 0 ] && ! grep -qE '^(FAIL|WARN)' <<<"$dout" && [ "$(grep -c '^PASS' <<<"$dout")" = 15 ]; then
	ok "doctor: a good set-up passes all 15 checks (exit 0)"
else
	notok "doctor: good set-up (exit $drc)"; printf "%s\n" "$dout" | sed "s/^/#   /"
fi
if line rustc | grep -q 'rustc-1.92 is the kernel' && line bindgen | grep -q 'bindgen-0.71 is the kernel'; then
	ok "doctor: finds the kernel's rustc and bindgen under Ubuntu's versioned names"
else notok "doctor: versioned toolchain ($(line rustc); $(line bindgen))"; fi
if line peermem | grep -q 'nvidia_peermem 0.2.0 loaded and registered (nv_mem, nv_mem_nc); live registrations 2, errors 0'; then
	ok "doctor: peermem line reads the drop-in's version, clients and debugfs counters"
else notok "doctor: peermem line: $(line peermem)"; fi
# peermem.ko (not the drop-in) loaded: its own name in the peermem line,
# and UCX finds none of the files it looks for.
good "$dr"
mv "$dr/sys/module/nvidia_peermem" "$dr/sys/module/peermem"
mv "$dr/sys/kernel/debug/nvidia_peermem" "$dr/sys/kernel/debug/peermem"
rundoc
if line peermem | grep -qE '^PASS +peermem: peermem 0\.2\.0 loaded and registered \(nv_mem, nv_mem_nc\)' &&
	line stack-UCX | grep -q '^WARN .*finds none'; then
	ok "doctor: peermem.ko loaded: PASS peermem with its own name, WARN stack-UCX (finds none)"
else notok "doctor: peermem.ko loaded: $(line peermem); $(line stack-UCX)"; fi

# broken CHECK WANT(FAIL|WARN) REGEX DESC: break with the commands on stdin.
broken() {
	local check=$1 want=$2 re=$3 desc=$4
	good "$dr"
	(cd "$dr" && bash -e) || { notok "doctor: $desc (could not break the set-up)"; return; }
	rundoc
	local l; l=$(line "$check")
	local exp=0
	[ "$want" = FAIL ] && exp=1
	if [[ $l == "$want "* ]] && grep -qE -- "$re" <<<"$l" && [ "$drc" = "$exp" ]; then
		ok "doctor: $desc -> $want $check (exit $drc)"
	else
		notok "doctor: $desc: want $want /$re/, got '$l' (exit $drc)"
	fi
}
broken kernel-rust FAIL 'built without Rust' "a kernel without CONFIG_RUST" <<<"sed -i /CONFIG_RUST=/d boot/config-$drel"
broken kernel-headers FAIL "apt install linux-lib-rust-$drel" "headers without the Rust metadata" <<<"rm lib/modules/$drel/build/rust/libkernel.rmeta"
broken kernel-headers FAIL "apt install linux-headers-$drel" "no headers at all" <<<"rm -r lib/modules/$drel/build"
broken rustc FAIL 'apt install rustc-1.99' "the kernel's rustc is not installed" <<<"sed -i 's/rustc 1.92.0 (ded5c06cf 2025-12-08)/rustc 1.99.0 (abc 2027-01-01)/' lib/modules/$drel/build/.config"
broken bindgen FAIL 'apt install bindgen-0.99' "the kernel's bindgen is not installed" <<<"sed -i 's/bindgen 0.71.1/bindgen 0.99.0/' lib/modules/$drel/build/.config"
broken peer-memory-core FAIL 'install DOCA-OFED' "OFED's core not loaded (a distribution ib_core)" <<<"sed -i /ib_register_peer_memory_client/d proc/kallsyms"
broken ofed-version WARN 'can hang' "OFED 24.10" <<<"echo 24.10-1.1.4 >sys/module/mlx_compat/version"
broken ofed-version WARN 'can hang' "OFED 25.01" <<<"echo 25.01-0.6.0 >sys/module/mlx_compat/version"
broken gpu-driver FAIL 'modprobe nvidia' "no NVIDIA driver" <<<"rm -r sys/module/nvidia; sed -i /nvidia_p2p_get_pages/d proc/kallsyms"
broken gpu-driver FAIL 'without GPUDirect RDMA' "a driver that does not export nvidia_p2p_get_pages" <<<"sed -i /nvidia_p2p_get_pages/d proc/kallsyms"
broken conflict FAIL "NVIDIA's nvidia-peermem 580.95.05" "NVIDIA's nvidia-peermem loaded (no peermem parameters)" <<<"rm -r sys/module/nvidia_peermem/parameters sys/kernel/debug/nvidia_peermem; echo 580.95.05 >sys/module/nvidia_peermem/version"
broken conflict FAIL "nv_peer_mem" "Mellanox's nv_peer_mem loaded" <<<"mkdir -p sys/module/nv_peer_mem"
broken peermem FAIL 'peermem is not loaded' "peermem not loaded" <<<"rm -r sys/module/nvidia_peermem sys/kernel/debug/nvidia_peermem"
broken peermem WARN 'debugfs' "loaded but debugfs not mounted" <<<"rm -r sys/kernel/debug/nvidia_peermem"
# Without debugfs but with /proc/driver/peermem (a doctor run as a user): its counters.
good "$dr"; rm -r "$dr/sys/kernel/debug/nvidia_peermem"; mkdir -p "$dr/proc/driver"
printf 'client registrations_acquired 7\nclient registrations_released 4\nclient errors 1\nclient_nc registrations_acquired 9\n' >"$dr/proc/driver/peermem"
rundoc
if line peermem | grep -q '^PASS .*live registrations 3, errors 1 (from /proc/driver/peermem)'; then
	ok "doctor: no debugfs, /proc/driver/peermem there: PASS peermem with its client counters"
else notok "doctor: /proc/driver/peermem fallback: $(line peermem)"; fi
broken stack-NCCL WARN 'GPU Direct RDMA Disabled' "peermem (not the drop-in) on an OFED without memory_peers: NCCL" <<<"mv sys/module/nvidia_peermem sys/module/peermem; mv sys/kernel/debug/nvidia_peermem sys/kernel/debug/peermem"
broken stack-UCX WARN 'GPUDirect RDMA disabled' "... UCX" <<<"mv sys/module/nvidia_peermem sys/module/peermem"
broken stack-NVSHMEM WARN 'GPUDirect RDMA disabled' "... NVSHMEM" <<<"mv sys/module/nvidia_peermem sys/module/peermem"
broken secure-boot FAIL 'unsigned: /lib/modules/.*/nvidia_peermem.ko will not load' "Secure Boot on and the module unsigned" <<<"printf '\\x07\\x00\\x00\\x00\\x01' >sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
broken module-file FAIL 'loads /lib/modules/.*/updates/dkms/nvidia-peermem.ko, which is not peermem' "NVIDIA's DKMS nvidia-peermem.ko taken by depmod over the installed peermem" <<<"printf 'updates/dkms/nvidia-peermem.ko:\\n' >lib/modules/$drel/modules.dep"
broken module-file FAIL 'lists no peermem module' "peermem installed, its build for the kernel missing" <<<"printf 'updates/dkms/nvidia-uvm.ko:\\n' >lib/modules/$drel/modules.dep"
broken module-file WARN 'sudo depmod' "no modules.dep" <<<"rm lib/modules/$drel/modules.dep"
broken module-file WARN 'no peermem module installed' "nothing of peermem installed" <<<"rm -r usr/src/peermem-0.2.0; printf 'updates/dkms/nvidia-peermem.ko:\\n' >lib/modules/$drel/modules.dep"
broken page-tables FAIL 'older peermem that refuses them' "a 595 driver with an older peermem (no last_pin_version)" <<<"echo 595.45.04 >sys/module/nvidia/version; rm sys/kernel/debug/nvidia_peermem/last_pin_version"
broken page-tables WARN 'older than 550' "a 535 driver" <<<"echo 535.274.02 >sys/module/nvidia/version"
# pt VERSION-FIXTURES... REGEX DESC: the page-tables line for a set-up.
pt() {
	local re=$2 desc=$3
	good "$dr"; (cd "$dr" && bash -e <<<"$1"); rundoc
	local l; l=$(line page-tables)
	if grep -qE -- "$re" <<<"$l" && [ "$drc" = 0 ]; then ok "doctor: $desc -> $l"
	else notok "doctor: $desc: want /$re/, got '$l' (exit $drc)"; fi
}
pt "echo 550.163.01 >sys/module/nvidia/version" '^PASS .*nvidia 550.163.01 \(branch 550\) hands out v1.2 page tables \(0x00010002\); this peermem reads them' "a 550 driver"
pt "echo 595.45.04 >sys/module/nvidia/version" '^PASS .*nvidia 595.45.04 \(branch 595\) hands out v2.0 page tables \(0x00020000, with flags\); this peermem reads them' "a 595 driver"
pt "rm -r sys/module/nvidia; mkdir -p sys/module/gpusim/parameters; echo 595.45.04 >sys/module/gpusim/parameters/branch" '^PASS .*gpusim emulating 595.45.04 \(branch 595\) hands out v2.0' "gpusim emulating 595"
pt "rm -r sys/module/nvidia; mkdir -p sys/module/gpusim" '^INFO .*gpusim does not say which driver branch' "gpusim without a branch parameter"
good "$dr"
echo 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05' >"$dr/proc/driver/nvidia/version"; rundoc
a=$(line dma-buf); good "$dr"; rundoc; b=$(line dma-buf)
if grep -q 'proprietary kernel modules: no DMA-BUF' <<<"$a" && grep -q 'open kernel modules: DMA-BUF MRs' <<<"$b"; then
	ok "doctor: DMA-BUF line tells the proprietary driver (peer memory only) from the open one (DMA-BUF MRs too)"
else notok "doctor: dma-buf lines ('$a' / '$b')"; fi
# Read-only: the fake root is unchanged by a run.
good "$dr"; before=$(cd "$dr" && find . -type f -exec md5sum {} + | sort); rundoc
after=$(cd "$dr" && find . -type f -exec md5sum {} + | sort)
if [ "$before" = "$after" ]; then ok "doctor: changes nothing under its root"; else notok "doctor: wrote under its root"; fi
# --bundle: one .tar.gz with the doctor's own lines (for the same --root)
# and the facts around it, each in its file.
good "$dr"
bout=$(PATH="$bin:$PATH" bash "$doc" --root "$dr" --bundle "$scratch/report" 2>&1); brc=$?
blist=$(tar -tzf "$scratch/report.tar.gz" 2>/dev/null | sort | tr '\n' ' ')
want='peermem-report/ peermem-report/counters.txt peermem-report/dkms-make.log peermem-report/dkms-status.txt peermem-report/doctor.txt peermem-report/kernel-log.txt peermem-report/modules.txt peermem-report/system.txt peermem-report/versions.txt '
bdoc=$(tar -xzOf "$scratch/report.tar.gz" peermem-report/doctor.txt 2>/dev/null)
if [ "$brc" = 0 ] && [ "$blist" = "$want" ] && grep -q "wrote $scratch/report.tar.gz" <<<"$bout" &&
	grep -q '^PASS .*rustc' <<<"$bdoc" && grep -q '^== nvidia_peermem: modprobe would load' <(tar -xzOf "$scratch/report.tar.gz" peermem-report/modules.txt); then
	ok "doctor: --bundle FILE writes FILE.tar.gz with the doctor's lines for its --root, modinfo, dkms status and build logs, kernel log, counters and versions"
else
	notok "doctor: --bundle (exit $brc; files: $blist; $(head -n 2 <<<"$bout" | tr '\n' '|'))"
fi
