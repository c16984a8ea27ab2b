#!/bin/bash
# PID 1 of the peermem rig VM (started by scripts/vm.sh, never by hand).
#
# The root filesystem is the host's / over virtio-9p, read-only. This script
# makes the few writable places a system needs (tmpfs on /tmp, /run, ...),
# mounts the writable results share that scripts/vm.sh exported (tag
# peermem-results) and runs the tests listed there:
#
#   $RES/vm.conf      shell variables: TEST_TIMEOUT, CAL_REF_MS, KMEMLEAK, PEERMEM_ROOT
#   $RES/tests.list   one test a line: "<cwd>\t<kind>\t<command>", kind "exec"
#                     (command is an executable's path) or "sh" (bash -c)
#
# For test N it writes $RES/out/N (stdout and stderr), $RES/out/N.rc (exit
# status; 124/137 = timed out) and $RES/out/N.limit (its limit in seconds). Progress markers go to the kernel log
# (/dev/kmsg), so they land in the console stream in order with any kernel
# report, which is how the runner knows which test a report belongs to:
#
#   peermem-vm: init                  the guest userspace is up
#   peermem-vm: begin test N: CMD
#   peermem-vm: end test N: rc=RC ms=MS
#   peermem-vm: kmemleak scan         final leak scan (result in $RES/kmemleak)
#   peermem-vm: done                  everything written; powering off
#
# PID 1 must never exit (the kernel would panic), so nothing here uses
# `set -e`, and every path ends in a power-off.

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp TERM=dumb LANG=C.UTF-8
RES=/run/peermem-results

kmsg() { echo "peermem-vm: $*" > /dev/kmsg 2>/dev/null || echo "peermem-vm: $*" > /dev/console; }

power_off() {
	sync
	umount "$RES" 2>/dev/null
	# A reboot, not a power-off: QEMU runs with -no-reboot, so it exits
	# either way, and a reboot needs no ACPI (the guest may boot acpi=off).
	echo b > /proc/sysrq-trigger
	# Never fall through: PID 1 must not exit.
	while :; do sleep 10; done
}

fatal() { kmsg "FATAL: $*"; power_off; }

# --- a writable system on a read-only root ---------------------------------
# Every exec is slow in this guest (KASAN, lockdep, TCG; 1-2 s each at half
# speed): builtins wherever possible, and the mounts in two `mount -a` of
# this directory's guest-fstab.1 and guest-fstab.2.
here=${0%/*}
mount -t proc -o nosuid,nodev,noexec proc /proc || fatal "cannot mount /proc"
# mounted DIR: something is mounted on DIR (from /proc/self/mounts).
mounted() {
	local dev dir rest
	while read -r dev dir rest; do [ "$dir" = "$1" ] && return 0; done < /proc/self/mounts
	return 1
}
# CONFIG_DEVTMPFS_MOUNT mounts /dev when the kernel mounts the root itself.
[ -e /dev/null ] && [ -c /dev/kmsg ] || mount -t devtmpfs devtmpfs /dev || fatal "cannot mount /dev"
# A checkout under /tmp, /run or /var/tmp (a CI clone, say) would vanish
# under the guest's own tmpfs there: keep it aside on a bind mount and put it
# back at the same path once those are mounted.
repo=${0%/tests/vm/guest-init.sh}
case "$repo" in
/tmp/*|/run/*|/var/tmp/*)
	mkdir -p /dev/.peermem-repo && mount --bind "$repo" /dev/.peermem-repo || fatal "cannot keep $repo aside" ;;
*) repo= ;;
esac
mount -a -T "$here/guest-fstab.1"
for d in /sys /tmp /run; do mounted "$d" || fatal "cannot mount $d ($here/guest-fstab.1)"; done
mounted /sys/kernel/debug || kmsg "warning: no debugfs"
mkdir -p "$RES" /run/lock /run/user /dev/pts /dev/shm
# (A checkout under /tmp is now under the guest's tmpfs: read it aside.)
fstab2=$here/guest-fstab.2
[ -z "$repo" ] || fstab2=/dev/.peermem-repo/tests/vm/guest-fstab.2
mount -a -T "$fstab2"
mounted "$RES" || fatal "cannot mount the results share (tag peermem-results) on $RES ($fstab2)"
[ -f "$RES/vm.conf" ] || fatal "no $RES/vm.conf from the host"
# From here on, this script's own chatter goes to a file, so that the serial
# console carries only kernel messages (and our /dev/kmsg markers).
exec >>"$RES/init.log" 2>&1
# shellcheck source=/dev/null
. "$RES/vm.conf"
: "${TEST_TIMEOUT:=300}" "${KMEMLEAK:=1}"
export PEERMEM_ROOT PEERMEM_VM=1 PEERMEM_RESULTS=$RES
for d in /var/tmp /dev/pts /dev/shm; do mounted "$d" || echo "warning: nothing mounted on $d"; done
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
if [ -n "$repo" ]; then
	mkdir -p "$repo" && mount --move /dev/.peermem-repo "$repo" || fatal "cannot put $repo back"
fi

echo peermem-vm > /proc/sys/kernel/hostname
ip link set lo up
ulimit -l unlimited
ulimit -c 0
# Reports must reach the console without being rate-limited away.
echo 0 > /proc/sys/kernel/printk_ratelimit

# The rig's RDMA DMA device: QEMU's edu (1234:11e8) behind the emulated
# IOMMU, which scripts/vm.sh adds. The kernel boots with
# iommu.passthrough=1 (translating every device would slow the 9p root), so
# switch only this device's group to translation, then bind rxe's rig-only
# driver rxe_dma to it (it refuses an untranslated device); rxe devices
# created afterwards give it to peer-memory clients as their DMA device.
dmadev=
for d in /sys/bus/pci/devices/*; do
	vendor='' device=''
	read -r vendor < "$d/vendor"; read -r device < "$d/device"
	[ "$vendor" = 0x1234 ] && [ "$device" = 0x11e8 ] || continue
	dmadev=${d##*/}
	[ -e "$d/driver" ] && echo "$dmadev" > "$d/driver/unbind"
	echo DMA > "$d/iommu_group/type" 2>/dev/null
	echo "$dmadev" > /sys/bus/pci/drivers/rxe_dma/bind 2>/dev/null
	if [ ! -e "/sys/bus/pci/drivers/rxe_dma/$dmadev" ]; then
		kmsg "warning: rxe_dma did not bind $dmadev (iommu group type $(<"$d/iommu_group/type")); peer memory cannot be registered"
		dmadev=
	fi
	break
done
if [ -n "$dmadev" ]; then
	# The group's number: the link's target, read with cd -P (no program).
	cd -P "/sys/bus/pci/devices/$dmadev/iommu_group" && group=${PWD##*/}; cd /
	read -r gtype < "/sys/bus/pci/devices/$dmadev/iommu_group/type"
	kmsg "rig DMA device $dmadev (iommu group ${group:-?}: $gtype)"
else
	kmsg "warning: no rig DMA device (QEMU edu behind intel-iommu); peer memory cannot be registered"
fi
export PEERMEM_DMA_DEVICE=$dmadev

leak=/sys/kernel/debug/kmemleak
[ "$KMEMLEAK" = 1 ] && [ -w "$leak" ] || KMEMLEAK=0
read -r up _ < /proc/uptime
kmsg "init (uptime ${up}s, kmemleak=$KMEMLEAK)"

mkdir -p "$RES/out"
# --- how fast is this guest? ------------------------------------------------
# Work-bound tests take longer on a slower or busier machine; their limit
# must not decide the verdict. A fixed bash loop (builtins only) is timed
# against CAL_REF_MS, what it took in the rig on an idle 2-core machine
# (scripts/vm.sh), and every test's limit is TEST_TIMEOUT times that ratio,
# at least 1 and at most 4. A hung test is still killed, only later on a slow
# machine. PEERMEM_VM_SLOWDOWN (percent) forces the ratio (the runner's own
# tests); tests see the ratio as PEERMEM_SLOWDOWN, in percent.
cal_t0=${EPOCHREALTIME/./}
for ((i = 0; i < 20000; i++)); do :; done
cal_ms=$(( (${EPOCHREALTIME/./} - cal_t0) / 1000 ))
: "${CAL_REF_MS:=0}"
if [ -n "${PEERMEM_VM_SLOWDOWN:-}" ]; then
	slow=$PEERMEM_VM_SLOWDOWN
elif [ "$CAL_REF_MS" -gt 0 ]; then
	slow=$(( cal_ms * 100 / CAL_REF_MS ))
else
	slow=100
fi
[ "$slow" -lt 100 ] && slow=100
[ "$slow" -gt 400 ] && slow=400
limit=$(( TEST_TIMEOUT * slow / 100 ))
export PEERMEM_SLOWDOWN=$slow
kmsg "calibration: ${cal_ms} ms (reference ${CAL_REF_MS} ms): slowdown ${slow}%, test limit ${limit}s"

# peermem's KUnit suites run at every load of the module (KUnit's module
# notifier), some 150 times in the suite, about half a second each on an
# idle machine; only tests/guest/module/t_kunit is about them. A glob that
# matches no suite keeps them from running; t_kunit sets KUnit's default
# ('*.*') around its own load. The suites are still built into the module
# and still run by t_kunit, and by any load outside the rig.
if [ -w /sys/module/kunit/parameters/filter_glob ]; then
	printf '%s' 'rig-kunit-only-in-t_kunit' > /sys/module/kunit/parameters/filter_glob
	export PEERMEM_KUNIT_SKIP_GLOB=rig-kunit-only-in-t_kunit
fi

# The modules loaded before any test: what a test leaves loaded is
# unloaded before the next one, which would otherwise run against it (a
# client left registered under a name the next test's client takes, gpusim
# with another test's branch: a CI failure, 2026-11-26). It is written to
# out/N.left and said by scripts/vm.sh; a module that cannot be unloaded
# fails the test.
declare -A mods0=()
while read -r m _; do mods0[$m]=1; done < /proc/modules

n=0
last_end=${EPOCHSECONDS}
while IFS=$'\t' read -r cwd kind cmd; do
	[ -n "$cmd" ] || continue
	n=$((n + 1))
	kmsg "begin test $n: $cmd"
	t0=${EPOCHREALTIME/./}
	(
		cd "$cwd" 2>/dev/null || cd /tmp
		if [ "$kind" = exec ]; then
			exec timeout -k 10 "$limit" "$cmd"
		else
			exec timeout -k 10 "$limit" bash -c "$cmd"
		fi
	) </dev/null >"$RES/out/$n" 2>&1
	rc=$?
	t1=${EPOCHREALTIME/./}
	echo "$limit" > "$RES/out/$n.limit"
	echo "$rc" > "$RES/out/$n.rc"
	# Nothing a test started may outlive it (servers, stuck children):
	# signal -1 from PID 1 reaches every process but PID 1 itself.
	kill -KILL -1 2>/dev/null
	wait 2>/dev/null
	left=()
	while read -r m _; do [ -n "${mods0[$m]:-}" ] || left+=("$m"); done < /proc/modules
	if [ ${#left[@]} -gt 0 ]; then
		echo "${left[*]}" > "$RES/out/$n.left"
		# Newest first is the order /proc/modules lists them (users before
		# what they use); files of killed processes may still be closing.
		for try in 1 2 3 4 5; do
			still=0
			for m in "${left[@]}"; do [ -d "/sys/module/$m" ] && { rmmod "$m" 2>/dev/null || still=1; }; done
			[ "$still" = 0 ] && break
			sleep 1
		done
		[ "$still" = 0 ] || echo "(could not unload: $(for m in "${left[@]}"; do [ -d "/sys/module/$m" ] && printf '%s ' "$m"; done))" >> "$RES/out/$n.left"
	fi
	kmsg "end test $n: rc=$rc ms=$(( (t1 - t0) / 1000 ))"
	last_end=${EPOCHSECONDS}
done < "$RES/tests.list"

if [ "$KMEMLEAK" = 1 ]; then
	# kmemleak reports only objects older than 5 s: let the last test's
	# allocations age first. Boot-time suspects are not filtered out: none
	# are seen on the rig kernel, and a scan + clear at boot would cost as
	# much as the final scans.
	# Exited tasks leave their kernel stacks in a per-CPU cache, still
	# allocated and so scanned, full of stale pointers that would hide a
	# leak (a test's ioctl path that dropped its last pointer, say). Fork
	# more concurrent tasks on every CPU than the cache holds (2): each
	# cached stack is cleared when it is reused.
	ncpu=$(nproc)
	for ((c = 0; c < ncpu; c++)); do
		taskset -p -c "$c" $$ >/dev/null || continue
		for i in 1 2 3 4; do sleep 1 & done
		wait
	done
	taskset -p -c "0-$((ncpu - 1))" $$ >/dev/null
	age=$(( EPOCHSECONDS - last_end ))
	[ "$age" -lt 6 ] && sleep $(( 6 - age ))
	# Two scans: on this kernel a leak is often first reported by the
	# second one (measured with tests/vm/fixtures/pmfixture.c).
	kmsg "kmemleak scan"
	echo scan > "$leak"
	echo scan > "$leak"
	cat "$leak" > "$RES/kmemleak" 2>&1
fi
# Every DMA mapping made for the rig's DMA device must have been unmapped
# by now (CONFIG_DMA_API_DEBUG keeps the list): scripts/vm.sh reads this.
if [ -n "$dmadev" ] && [ -r /sys/kernel/debug/dma-api/dump ]; then
	grep -F " $dmadev " /sys/kernel/debug/dma-api/dump > "$RES/dma-leaks" 2>&1
fi
dmesg > "$RES/dmesg" 2>&1
kmsg "done"
power_off
