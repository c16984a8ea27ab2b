#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# The guest half of tests/host/ubuntu (run by its run.sh through
# scripts/vm.sh, on the ubuntu rig kernel, never alone): what a user's
# machine does with the installed package after a reboot.
#
# The guest sees the host's root read-only, so the package, the kernel's
# modules under /lib/modules/$UB_KREL and the /etc files run.sh installed
# are what this boot has. There is no systemd here (guest-init.sh is PID
# 1): "at boot" is emulated by running what the package's peermem.service
# runs (its ExecStart, read from the installed unit; systemd runs it after
# openibd.service), on a fresh boot in which
# nothing RDMA or GPU is loaded yet. udev's part (loading the HCA driver for
# the device) is emulated by modprobe rdma_rxe afterwards.
#
# Environment (from run.sh): UB_KREL (kernel release), UB_STAGE (signed and
# unsigned test modules), UB_VERSION (peermem's version). Prints TAP.
set -u

root=${PEERMEM_ROOT:?}
stage=${UB_STAGE:?}
n=0 failed=0
ok()  { n=$((n + 1)); echo "ok $n - $1"; }
nok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; shift; [ $# -eq 0 ] || printf '%s\n' "$@" | sed 's/^/#   /'; }
check() { local d=$1; shift; if "$@"; then ok "$d"; else nok "$d"; fi; }
expect_eq() { if [ "$2" = "$3" ]; then ok "$1"; else nok "$1" "got '$2', expected '$3'"; fi; }
rd() { local v; if read -r v < "$1"; then printf '%s' "$v"; else printf 'unreadable'; fi 2>/dev/null; }
loaded() { [ -d "/sys/module/$1" ]; }
finish() { echo "1..$n"; [ "$failed" = 0 ]; exit $?; }
# relay LABEL CMD...: run a TAP test program, its results renumbered into
# ours (a "# SKIP cause" directive stays with its result).
relay() {
	local label=$1 out rc line d st; shift
	out=$("$@" 2>&1); rc=$?
	while IFS= read -r line; do
		if [[ $line =~ ^(not\ ok|ok)\ [0-9]+(\ -)?\ ?(.*)$ ]]; then
			d=${BASH_REMATCH[3]} st=${BASH_REMATCH[1]}
			if [ "$st" = ok ]; then ok "$label: $d"; else nok "$label: $d"; fi
		elif [[ $line =~ ^# ]]; then echo "$line"
		elif [[ $line =~ ^1\.\. ]]; then :
		else echo "#   $line"; fi
	done <<<"$out"
	if [ "$rc" != 0 ]; then nok "$label exited with status $rc"; fi
}
core=/sys/kernel/debug/peer_memory

expect_eq "the booted kernel is the ubuntu variant" "$(uname -r)" "$UB_KREL"
expect_eq "module signatures are enforced (sig_enforce)" "$(rd /sys/module/module/parameters/sig_enforce)" "Y"
left=
for m in gpusim ib_core ib_uverbs rdma_rxe nvidia_peermem peermem; do loaded $m && left+=" $m"; done
expect_eq "a fresh boot: no GPU driver, RDMA core or peer client loaded yet" "${left# }" ""

# --- "at boot": the package's unit, with the installed configuration ----------
# What modprobe would do, in order (a dry run on the fresh boot).
plan=$(modprobe -n -v nvidia_peermem 2>&1 | sed -n 's|^insmod \([^ ]*\).*|\1|p' | sed 's|.*/||; s|\.ko.*||')
echo "# modprobe -n -v nvidia_peermem would insert, in order: $(echo $plan)"
pos() { grep -nx "$1" <<<"$plan" | head -n 1 | cut -d: -f1; }
pg=$(pos gpusim) pc=$(pos ib_core) pp=$(pos nvidia_peermem)
if [ -n "$pg" ] && [ -n "$pc" ] && [ -n "$pp" ] && [ "$pg" -lt "$pp" ] && [ "$pc" -lt "$pp" ] && [ "$pp" = "$(wc -l <<<"$plan")" ]; then
	ok "modprobe's plan: the GPU driver (gpusim) and the core (ib_core) before nvidia_peermem, which comes last"
else nok "modprobe's plan for nvidia_peermem" "$plan"; fi
# ib_uverbs is no link dependency here (the core is ib_core's): only the
# package's softdep (/usr/lib/modprobe.d/peermem-softdep.conf) puts it in the plan.
pu=$(pos ib_uverbs)
if [ -n "$pu" ] && [ -n "$pp" ] && [ "$pu" -lt "$pp" ] && ! modinfo -F depends nvidia_peermem | tr ',' '\n' | grep -qx ib_uverbs; then
	ok "the package's softdep is read: ib_uverbs (no link dependency of nvidia_peermem) is in the plan before it"
else nok "the softdep in /usr/lib/modprobe.d/peermem-softdep.conf is read (ib_uverbs in modprobe's plan)" "$plan" "depends: $(modinfo -F depends nvidia_peermem 2>&1)"; fi
unit=/usr/lib/systemd/system/peermem.service
# unit_start: what systemd runs to start the unit (its ExecStart lines).
unit_start() {
	local cmd rc=0
	while IFS= read -r cmd; do
		# shellcheck disable=SC2086  # the unit's command line, split as systemd does (no quotes in it)
		$cmd || rc=$?
	done < <(sed -n 's/^ExecStart=-\{0,1\}//p' "$unit")
	return $rc
}
if [ -f "$unit" ] && grep -q '^ExecStart=' "$unit"; then
	out=$(unit_start 2>&1); rc=$?
	[ -z "$out" ] || printf '%s\n' "$out" | head -n 8 | sed 's/^/# peermem.service: /'
	expect_eq "peermem.service's ExecStart (what systemd runs at boot, after openibd.service) exits 0" "$rc" "0"
else
	nok "the package's $unit with an ExecStart"
fi
for m in gpusim ib_core nvidia_peermem; do
	check "after it: $m is loaded ($(rd /sys/module/$m/initstate))" test "$(rd /sys/module/$m/initstate)" = live
done
check "nvidia_peermem links against the GPU driver (/sys/module/gpusim/holders/nvidia_peermem)" test -e /sys/module/gpusim/holders/nvidia_peermem
check "nvidia_peermem links against the core (/sys/module/ib_core/holders/nvidia_peermem)" test -e /sys/module/ib_core/holders/nvidia_peermem
expect_eq "the loaded nvidia_peermem is the package's version" "$(rd /sys/module/nvidia_peermem/version)" "$UB_VERSION"
check "it registered with the peer-memory core ($core/nv_mem)" test -d "$core/nv_mem"
# A signed module taints nothing: no 'E' (unsigned module) in its taint.
t=$(rd /sys/module/nvidia_peermem/taint)
check "the kernel accepted its signature (taint '$t' has no E)" test "${t//E/}" = "$t"
echo "# lsmod after boot: $(lsmod | awk 'NR > 1 { printf "%s ", $1 }')"

# The doctor on this machine, as installed.
dout=$(bash "$root/scripts/doctor.sh" 2>&1); drc=$?
printf '%s\n' "$dout" | sed 's/^/# doctor: /'
line=$(grep -E '^[A-Z]+ +secure-boot: ' <<<"$dout")
if [[ $line == PASS* ]] && [[ $line == *nvidia_peermem.ko.zst* ]]; then ok "doctor: secure-boot PASS, the installed module is signed"
else nok "doctor: secure-boot PASS for the signed install" "$line"; fi
line=$(grep -E '^[A-Z]+ +peermem: ' <<<"$dout")
if [[ $line == PASS* ]]; then ok "doctor: peermem PASS (${line#*peermem: })"; else nok "doctor: peermem PASS" "$line"; fi

# --- the RDMA device (udev's part): rdma_rxe, with the rig's DMA device -------
modprobe ib_uverbs && modprobe rdma_rxe
check "ib_uverbs and rdma_rxe load (signed, from /lib/modules/$UB_KREL)" loaded rdma_rxe
# As tests/vm/guest-init.sh does at boot when rxe is built in: its rig
# driver rxe_dma takes QEMU's edu device behind the IOMMU.
dmadev=
for d in /sys/bus/pci/devices/*; do
	[ "$(<"$d/vendor")" = 0x1234 ] && [ "$(<"$d/device")" = 0x11e8 ] || continue
	dmadev=${d##*/}
	[ -e "$d/driver" ] && echo "$dmadev" > "$d/driver/unbind"
	echo DMA > "$d/iommu_group/type" 2>/dev/null
	echo "$dmadev" > /sys/bus/pci/drivers/rxe_dma/bind 2>/dev/null
	break
done
check "rxe_dma bound the rig's DMA device ${dmadev:-none}" test -n "$dmadev" -a -e "/sys/bus/pci/drivers/rxe_dma/$dmadev"
export PEERMEM_DMA_DEVICE=$dmadev

# --- the NCCL-style probes (tests/guest/module/t_probes), signed builds -----------
# The rig knob ib_core.peer_mem_sysfs (emulating an OFED whose kernel exports
# mm_kobj, with /sys/kernel/mm/memory_peers/) works only with a built-in core:
# mm_kobj is not exported, and patch 0001 compiles the sysfs part only under
# IS_BUILTIN(CONFIG_INFINIBAND). With this modular core it is inert, which is
# exactly OFED on a current kernel (no memory_peers): shown here; t_probes
# sees the modular core itself and skips its two "+knob" configurations,
# naming that cause.
knob=/sys/module/ib_core/parameters/peer_mem_sysfs
echo 1 > "$knob" 2>/dev/null
insmod "$stage/dropin/nvidia_peermem.ko" 2>/dev/null
if [ "$(rd "$knob")" = Y ] && [ -d "$core/nv_mem" ] && [ ! -e /sys/kernel/mm/memory_peers ]; then
	ok "the rig knob peer_mem_sysfs is inert with the core as a module: a client registered with it set gets no /sys/kernel/mm/memory_peers (as with OFED on a current kernel)"
else nok "the rig knob is inert with a modular core" "knob $(rd "$knob"), nv_mem $([ -d "$core/nv_mem" ] && echo registered), memory_peers $([ -e /sys/kernel/mm/memory_peers ] && echo present || echo absent)"; fi
rmmod nvidia_peermem 2>/dev/null; echo 0 > "$knob" 2>/dev/null
relay probes env PEERMEM_KO="$stage/peermem.ko" PEERMEM_DROPIN_KO="$stage/dropin/nvidia_peermem.ko" \
	GPUSIM_KO="$stage/gpusim.ko" "$root/tests/guest/module/t_probes"


# --- the end-to-end test (tests/guest/e2e/t_e2e_peermem) ------------------------
# It insmods <PEERMEM_ROOT>/peermem.ko: the signed one in the stage.
relay e2e env PEERMEM_ROOT="$stage" GPUSIM_KO="$stage/gpusim.ko" "$root/tests/guest/e2e/t_e2e_peermem"

# --- an unsigned module is refused at load -----------------------------------------
for m in nvidia_peermem peermem; do loaded $m && rmmod $m; done
out=$(insmod "$stage/unsigned/peermem.ko" 2>&1); rc=$?
if [ "$rc" != 0 ] && [[ $out == *"Key was rejected by service"* ]]; then
	ok "insmod of an unsigned peermem.ko is refused: Key was rejected by service (EKEYREJECTED)"
else nok "an unsigned peermem.ko is refused with EKEYREJECTED" "rc $rc: $out"; loaded peermem && rmmod peermem; fi
dmesg | grep -iE 'module verification failed|Loading of unsigned module' | tail -n 2 | sed 's/^/# dmesg: /'
# Installed unsigned in place of the dkms one (a module built and copied by
# hand): a tmpfs over updates/dkms holds the GPU driver and the unsigned
# drop-in, as /lib/modules would if a user had installed it so.
ud=/lib/modules/$UB_KREL/updates/dkms
if mount -t tmpfs tmpfs "$ud" 2>/dev/null; then
	cp "$stage/unsigned-dkms/nvidia_peermem.ko.zst" "$ud/"
	zstd -q -19 -f "$stage/gpusim.ko" -o "$ud/gpusim.ko.zst"
	out=$(modprobe nvidia_peermem 2>&1); rc=$?
	if [ "$rc" != 0 ] && [[ $out == *"Key was rejected by service"* ]]; then
		ok "modprobe nvidia_peermem with the unsigned one installed: refused (Key was rejected by service)"
	else nok "modprobe of the unsigned installed nvidia_peermem is refused" "rc $rc: $out"; fi
	dout=$(bash "$root/scripts/doctor.sh" 2>&1)
	line=$(grep -E '^[A-Z]+ +secure-boot: ' <<<"$dout")
	echo "# doctor: $line"
	if [[ $line == FAIL* ]] && [[ $line == *"unsigned: /lib/modules/$UB_KREL/updates/dkms/nvidia_peermem.ko.zst"* ]] &&
		[[ $line == *"Key was rejected by service"* ]]; then
		ok "doctor names the cause: secure-boot FAIL, the unsigned installed module, 'Key was rejected by service'"
	else nok "doctor names the unsigned module" "$line"; fi
	umount "$ud"
else
	nok "mount a tmpfs over $ud for the unsigned install"
fi

# --- a stale Module.symvers given explicitly: the load-time failure the search prevents
if [ -f "$stage/stale/peermem.ko" ]; then
	out=$(insmod "$stage/stale/peermem.ko" 2>&1); rc=$?
	msg=$(dmesg | grep 'disagrees about version of symbol ib_register_peer_memory_client' | tail -n 1)
	if [ "$rc" != 0 ] && [ -n "$msg" ]; then
		ok "a module built with OFED_SYMVERS=<stale file> fails at load: ${msg#*] }"
	else nok "the stale-CRC module fails at load with 'disagrees about version'" "rc $rc: $out; dmesg: $msg"; loaded peermem && rmmod peermem; fi
fi

# --- openibd restart with peermem loaded ---------------------------------------------
# OFED's /etc/init.d/openibd (mlnx-ofa_kernel, ofed_scripts/openibd), stop():
# for each module of its UNLOAD_MODULES list (ULPs, HCA drivers, then
# ... ib_uverbs ib_umad ib_mad ib_core ... rdma_rxe) that is loaded:
# `modprobe -r MOD`; if that fails, for each holder `rmmod MOD` names ("is in
# use by: ..."): a holder not in UNLOAD_MODULES, run by hand (not at boot)
# and without force-, makes it `rmmod MOD` once more and, that failing,
# print "Unloading MOD [FAILED]" with rmmod's message and exit 1; otherwise
# (force-restart, or at boot) the holder is unloaded first, recursively.
# start() then loads the HCA driver, ib_umad, ib_uverbs and the configured
# ULPs: no peer-memory client. Emulated here with the modules this rig has.
unload_list="rdma_ucm rdma_cm iw_cm ib_cm ib_sa ib_uverbs ib_umad ib_mad ib_core rdma_rxe"
ofed_unload_rec() { # MOD FORCE
	local mod=$1 force=$2 dep
	loaded "$mod" || return 0
	modprobe -r "$mod" >/dev/null 2>&1 && return 0
	for dep in $(rmmod "$mod" 2>&1 | grep 'is in use by' | sed -r -e 's/.*use by[:]* //' -e 's/,/ /g'); do
		if ! grep -qw "$dep" <<<"$unload_list" && [ "$force" = 0 ]; then
			ofed_rm_mod "$mod" || return 1
		else
			ofed_unload_rec "$dep" "$force" || return 1
		fi
	done
	if loaded "$mod"; then ofed_rm_mod "$mod" || return 1; fi
}
ofed_rm_mod() {
	local o
	o=$(rmmod "$1" 2>&1) || { echo "Unloading $1 [FAILED]"; echo "$o"; return 1; }
}
openibd_restart() { # FORCE: prints what openibd would print; status 1 if stop failed
	local m
	for m in $unload_list; do ofed_unload_rec "$m" "$1" || return 1; done
	modprobe rdma_rxe && modprobe ib_uverbs
}
rxe_link_up() {
	[ -e /sys/class/infiniband/rxe0 ] && return 0
	ip link show veth0 >/dev/null 2>&1 || { ip link add veth0 type veth peer name veth1 && ip link set veth0 up && ip link set veth1 up; }
	rdma link add rxe0 type rxe netdev veth0
}
modprobe nvidia_peermem
rxe_link_up
check "before the restart: nvidia_peermem loaded (modprobe), rxe0 up" test -d "$core/nv_mem" -a -e /sys/class/infiniband/rxe0
out=$(openibd_restart 0 2>&1); rc=$?
printf '%s\n' "$out" | sed 's/^/# openibd restart: /'
if [ "$rc" != 0 ] && [[ $out == *"Unloading ib_core [FAILED]"* ]] && [[ $out == *"in use by"*nvidia_peermem* ]] &&
	loaded ib_core && [ -d "$core/nv_mem" ]; then
	ok "openibd restart (by hand) with nvidia_peermem loaded is refused: 'Unloading ib_core [FAILED]', rmmod names nvidia_peermem as the holder; the core and the client stay"
else nok "openibd restart refused with a message naming nvidia_peermem" "rc $rc" "$out"; fi
modprobe rdma_rxe; modprobe ib_uverbs
out=$(openibd_restart 1 2>&1); rc=$?
printf '%s\n' "$out" | sed 's/^/# openibd force-restart: /'
if [ "$rc" = 0 ] && loaded ib_core && loaded rdma_rxe && ! loaded nvidia_peermem; then
	ok "openibd force-restart unloads nvidia_peermem with the core, reloads the core and rxe, and leaves nvidia_peermem unloaded (openibd loads no peer client)"
else nok "openibd force-restart" "rc $rc; loaded: $(lsmod | awk 'NR > 1 { printf "%s ", $1 }')"; fi
# systemd restarts peermem.service after openibd.service (PartOf, After).
if grep -qx 'PartOf=openibd.service nvidia-persistenced.service' "$unit"; then
	out=$(unit_start 2>&1); rc=$?
else rc=unit-not-PartOf-openibd out=$(grep '^PartOf' "$unit"); fi
if [ "$rc" = 0 ] && [ -d "$core/nv_mem" ] && [ "$(rd /sys/module/nvidia_peermem/version)" = "$UB_VERSION" ]; then
	ok "after it, peermem.service (PartOf openibd.service: restarted with it, after it) loads nvidia_peermem again, which registers with the new core"
else nok "peermem.service after the force-restart" "rc $rc: $out"; fi
# --- the NVIDIA driver reloaded by hand ----------------------------------------
# systemctl stop nvidia-persistenced (PartOf: stops peermem.service, which
# unloads nothing), unload peermem and the driver, load the driver,
# systemctl start nvidia-persistenced: WantedBy= makes that start start
# peermem.service again. The driver is gpusim here.
rm_ok=0
rmmod nvidia_peermem 2>/dev/null && { ! loaded gpusim || rmmod gpusim 2>/dev/null; } && rm_ok=1
if [ "$rm_ok" = 1 ] && ! loaded nvidia_peermem && ! loaded gpusim && modprobe gpusim && ! loaded nvidia_peermem; then
	ok "driver reload by hand: nvidia_peermem and the driver (gpusim) unloaded, the driver loaded again alone"
else nok "driver reload by hand" "loaded: $(lsmod | awk 'NR > 1 { printf "%s ", $1 }')"; fi
if grep -Eq '^WantedBy=.*(^|[ =])nvidia-persistenced\.service( |$)' "$unit"; then
	out=$(unit_start 2>&1); rc=$?
else rc=unit-not-WantedBy-nvidia-persistenced out=$(grep '^WantedBy' "$unit"); fi
if [ "$rc" = 0 ] && [ -d "$core/nv_mem" ] && [ -e /sys/module/gpusim/holders/nvidia_peermem ]; then
	ok "after it, starting nvidia-persistenced starts peermem.service (WantedBy), which loads nvidia_peermem against the reloaded driver"
else nok "peermem.service after the driver reload" "rc $rc: $out"; fi
rxe_link_up
relay "probes after force-restart" env PEERMEM_KO="$stage/peermem.ko" PEERMEM_DROPIN_KO="$stage/dropin/nvidia_peermem.ko" \
	GPUSIM_KO="$stage/gpusim.ko" "$root/tests/guest/module/t_probes"
finish
