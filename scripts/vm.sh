#!/usr/bin/env bash
# Boot the rig kernel under QEMU, run tests in it, fail on any kernel report.
#
#   scripts/vm.sh [options] [--] TEST...     run test executables, print TAP
#                       (TEST@NAME=VALUE[@NAME=VALUE...]: that test alone
#                       with NAME set, labelled with the suffix)
#   scripts/vm.sh [options] --cmd 'COMMAND'  run one shell command, show its output
#
# Options:
#   --kdir DIR          kernel build tree (default: scripts/kernel.sh --print-kdir)
#   --test-timeout S    limit for each test (default 300), on a machine as fast
#                       as the reference; the guest scales it by its measured
#                       slowdown (1x to 4x; tests/vm/guest-init.sh)
#   --timeout S         limit for the whole VM run (default: 180 + tests x test limit)
#   --accel auto|tcg|kvm  (default auto: KVM only if a bounded probe boot works;
#                       the verdict is cached in $PEERMEM_CACHE/vm-accel)
#   --mem SIZE --smp N  guest size (default 2G, 2)
#   --env NAME=VALUE    set NAME in every test's environment (repeatable)
#   --no-kmemleak       skip the final kmemleak scan
#   (PEERMEM_VM_BOOT_LIMIT=S: a guest not up after S seconds, default 600, or
#   whose console stays silent for PEERMEM_VM_BOOT_QUIET=S seconds before it
#   is up, default 150, is
#   booted once more; a second such boot fails the run)
#   --append 'ARGS'     extra guest kernel command line (e.g. kasan.fault=panic)
#   -v, --verbose       stream the guest console while it runs
#   --keep              keep the run directory even when everything passed
#
# The guest's root filesystem is the host's / shared read-only over virtio-9p,
# so every host program and library, and this repo's built files, are at the
# same paths in the guest (but the guest's /tmp, /run and /var/tmp are empty
# tmpfs: keep test files elsewhere). tests/vm/guest-init.sh is PID 1; results
# come back over a second, writable 9p share. A TEST is an executable file; it
# runs with its own directory as cwd and PEERMEM_ROOT, PEERMEM_VM=1 and
# PEERMEM_RESULTS (a writable directory that comes back to the host) set.
#
# Output: one TAP stream (every test's TAP, renumbered), plus a `not ok` line
# for each kernel report in the guest log (BUG, WARNING, KASAN, lockdep,
# kmemleak, DMA-API debug, hung task, Oops, panic), with an excerpt and the
# test that was running, and for a guest that hung, panicked or never booted.
# Lines that look like reports but are not are listed in tests/vm/known-reports
# (PEERMEM_KNOWN_REPORTS names another list).
# Exit status: 0 if all passed, 1 if anything failed, 2 on bad usage.
set -uo pipefail
# Read whole before running (the braces below): a script edited while it
# runs, or waits for a lock, must not change under the running shell.
{
. "$(dirname "$0")/lib.sh"

usage() { pm_help "$0" '^set -uo'; exit 0; }
bad() { printf 'peermem: error: %s\nusage: scripts/vm.sh [--kdir DIR] [OPTION...] [--] TEST... | --cmd CMD (scripts/vm.sh --help)\n' "$*" >&2; exit 2; }

kdir= test_timeout=300 total_timeout= accel=${PEERMEM_VM_ACCEL:-auto} mem=2G smp=2
# What the guest's calibration loop takes on an idle 2-core machine under TCG
# (tests/vm/guest-init.sh; 2333 ms for 40000 rounds measured 2026-11-25 on a 2-core machine
# with little else running, so 1150 for its 20000): test limits scale by how much slower a run is.
cal_ref_ms=${PEERMEM_CAL_REF_MS:-1150}
kmemleak=1 verbose=0 keep=0 cmd= have_cmd=0
tests=() envs=() extra_append=
need_arg() { [ $# -ge 2 ] && [ -n "$2" ] && [[ $2 != --* ]] || bad "option $1 needs a value (see scripts/vm.sh --help)"; }
is_uint() { [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -gt 0 ]; }
while [ $# -gt 0 ]; do
	case "$1" in
	--kdir) need_arg "$@"; kdir=$2; shift 2 ;;
	--test-timeout) need_arg "$@"; is_uint "$2" || bad "--test-timeout wants seconds, got '$2'"; test_timeout=$2; shift 2 ;;
	--timeout) need_arg "$@"; is_uint "$2" || bad "--timeout wants seconds, got '$2'"; total_timeout=$2; shift 2 ;;
	--accel) need_arg "$@"; accel=$2; shift 2 ;;
	--mem) need_arg "$@"; mem=$2; shift 2 ;;
	--smp) need_arg "$@"; is_uint "$2" || bad "--smp wants a CPU count, got '$2'"; smp=$2; shift 2 ;;
	--env) need_arg "$@"; [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || bad "--env wants NAME=VALUE, got '$2'"; envs+=("$2"); shift 2 ;;
	--no-kmemleak) kmemleak=0; shift ;;
	--append) need_arg "$@"; extra_append+=" $2"; shift 2 ;;
	--cmd) need_arg "$@"; cmd=$2; have_cmd=1; shift 2 ;;
	-v|--verbose) verbose=1; shift ;;
	--keep) keep=1; shift ;;
	-h|--help) usage ;;
	--) shift; tests+=("$@"); break ;;
	-*) bad "unknown option '$1' (see scripts/vm.sh --help)" ;;
	*) tests+=("$1"); shift ;;
	esac
done
case "$accel" in auto|tcg|kvm) ;; *) bad "--accel must be auto, tcg or kvm, not '$accel'" ;; esac
[[ $mem =~ ^[0-9]+[MG]?$ ]] || bad "--mem wants a size like 2G or 1536M, got '$mem'"
if [ "$have_cmd" = 1 ] && [ ${#tests[@]} -gt 0 ]; then bad "give either --cmd or tests, not both"; fi
if [ "$have_cmd" = 0 ] && [ ${#tests[@]} -eq 0 ]; then bad "nothing to run: give test executables or --cmd 'COMMAND' (see --help)"; fi

# --- the tests: check them all before booting anything ---------------------
# Each list entry is "<cwd>\t<exec|sh>\t<command>" (see tests/vm/guest-init.sh);
# labels name tests in the output.
list=() labels=()
if [ "$have_cmd" = 1 ]; then
	[[ $cmd == *$'\n'* ]] && cmd=$(printf '%s' "$cmd" | tr '\n' ';')
	list+=("$PWD"$'\tsh\t'"$cmd"); labels+=("cmd")
else
	for t in "${tests[@]}"; do
		# TEST@NAME=VALUE...: an environment of this test's own.
		tenv=
		if [[ $t == *@* ]]; then
			tenv=${t#*@} t=${t%%@*}
			[[ $tenv =~ ^[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_.,:/=+-]*(@[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_.,:/=+-]*)*$ ]] ||
				bad "test '$t@$tenv': want TEST@NAME=VALUE[@NAME=VALUE...] (values of letters, digits and _.,:/=+-)"
		fi
		[ -e "$t" ] || bad "test '$t' does not exist"
		[ -f "$t" ] || bad "test '$t' is not a file"
		[ -x "$t" ] || bad "test '$t' is not executable (chmod +x it)"
		abs=$(realpath -s "$t")
		# The guest has its own /tmp, /run and /var/tmp; only this checkout is
		# carried over into them (tests/vm/guest-init.sh).
		case "$abs" in "$PEERMEM_ROOT"/*) ;; /tmp/*|/run/*|/var/tmp/*|/proc/*|/sys/*|/dev/*)
			bad "test '$t' lives in ${abs%/*}, which the guest does not share (its /tmp, /run, /var/tmp are its own); put it elsewhere" ;;
		esac
		[[ $abs == *[$'\t\n']* ]] && bad "test path '$abs' has a tab or newline in it"
		lbl=${abs#"$PEERMEM_ROOT"/}; lbl=${lbl#tests/}
		if [ -n "$tenv" ]; then
			list+=("${abs%/*}"$'\tsh\t'"export ${tenv//@/ }; exec $(printf '%q' "$abs")")
			lbl+="@$tenv"
		else
			list+=("${abs%/*}"$'\texec\t'"$abs")
		fi
		labels+=("$lbl")
	done
fi
ntests=${#list[@]}

# --- the kernel ---------------------------------------------------------
if [ -z "$kdir" ]; then
	kdir=$("$PEERMEM_ROOT/scripts/kernel.sh" --print-kdir 2>/dev/null) ||
		bad "no rig kernel built yet; run scripts/kernel.sh (or pass --kdir DIR)"
fi
[ -d "$kdir" ] || bad "--kdir '$kdir' is not a directory"
kdir=$(realpath "$kdir")
bzimage=$kdir/arch/x86/boot/bzImage
[ -f "$bzimage" ] || bad "no kernel image at $bzimage; build the kernel (scripts/kernel.sh) or pass --kdir of a built tree"
if [ -f "$kdir/.config" ]; then
	for opt in CONFIG_9P_FS CONFIG_NET_9P_VIRTIO CONFIG_VIRTIO_PCI CONFIG_DEVTMPFS CONFIG_TMPFS CONFIG_SERIAL_8250_CONSOLE CONFIG_BINFMT_SCRIPT; do
		grep -qx "$opt=y" "$kdir/.config" || bad "kernel in $kdir lacks $opt=y, which the VM needs (see tests/rig/base.config)"
	done
fi
pm_need_cmd qemu-system-x86_64 "run scripts/setup-host.sh (it installs qemu-system-x86)"

# --- accelerator: TCG unless a bounded KVM probe boot works ---------------
probe_kvm() {
	[ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
	local out
	# A real boot to a deliberate root-mount panic: if the kernel gets that
	# far under KVM, KVM works. Nested KVM here aborts or hangs: bounded.
	out=$(timeout -k 5 25 qemu-system-x86_64 -accel kvm -cpu host -m 512M -smp 1 \
		-nodefaults -no-user-config -display none -no-reboot -serial stdio \
		-kernel "$bzimage" -append "console=ttyS0 panic=-1 root=/dev/peermem-kvm-probe" \
		</dev/null 2>&1)
	grep -q -e 'Kernel panic' -e 'VFS: ' <<<"$out"
}
if [ "$accel" = auto ]; then
	cachef=$PEERMEM_CACHE/vm-accel
	key="$(uname -r) $(qemu-system-x86_64 --version | head -n1 | tr -d ' ')"
	if [ -f "$cachef" ] && [ "$(sed -n 1p "$cachef")" = "$key" ]; then
		accel=$(sed -n 2p "$cachef")
	else
		pm_log "vm: probing KVM (bounded; falls back to TCG)"
		if probe_kvm; then accel=kvm; else accel=tcg; fi
		mkdir -p "$PEERMEM_CACHE" && printf '%s\n%s\n' "$key" "$accel" > "$cachef"
		pm_log "vm: accelerator $accel (cached in $cachef)"
	fi
fi
if [ "$accel" = kvm ]; then accel_args=(-accel kvm -cpu host); else accel_args=(-accel tcg -cpu "${PEERMEM_VM_CPU:-max}"); fi

# --- one VM at a time on this machine ----------------------------------------
# One TCG guest keeps both cores of these machines busy; several at once
# only make each slower, and then wall-clock test limits fire falsely.
# PEERMEM_VM_PARALLEL=1 skips the queue; PEERMEM_VM_LOCK names the lock file
# (default in the cache), so runs with different caches can share one queue.
mkdir -p "$PEERMEM_CACHE" || bad "cannot create $PEERMEM_CACHE"
vm_lock=${PEERMEM_VM_LOCK:-$PEERMEM_CACHE/vm.lock}
if [ "${PEERMEM_VM_PARALLEL:-0}" != 1 ] && command -v flock >/dev/null; then
	exec 9>>"$vm_lock" || bad "cannot open the VM lock $vm_lock"
	if ! flock -n 9; then
		pm_log "vm: another VM run is going on; waiting for it (lock $vm_lock; PEERMEM_VM_PARALLEL=1 to skip)"
		flock 9
	fi
fi

# --- the run directory (the writable share) ----------------------------------
runs=$PEERMEM_CACHE/vm-runs
mkdir -p "$runs" "$PEERMEM_CACHE/logs" || bad "cannot create $runs"
# Keep the last few runs for post-mortems.
ls -1dt "$runs"/run.* 2>/dev/null | tail -n +25 | xargs -r rm -rf
res=$(mktemp -d "$runs/run.$(date +%Y%m%d-%H%M%S).XXXX")
mkdir -p "$res/out"
for l in "${list[@]}"; do printf '%s\n' "$l"; done > "$res/tests.list"
{
	printf 'PEERMEM_ROOT=%q\n' "$PEERMEM_ROOT"
	printf 'TEST_TIMEOUT=%q\n' "$test_timeout"
	printf 'CAL_REF_MS=%q\n' "$cal_ref_ms"
	printf 'KMEMLEAK=%q\n' "$kmemleak"
	for e in "${envs[@]}"; do printf 'export %s=%q\n' "${e%%=*}" "${e#*=}"; done
} > "$res/vm.conf"
[ -n "$total_timeout" ] || total_timeout=$(( 180 + ntests * (test_timeout + 15) ))

append="console=ttyS0 root=hostroot rootfstype=9p"
append+=" rootflags=trans=virtio,version=9p2000.L,msize=262144,cache=loose ro"
append+=" init=$PEERMEM_ROOT/tests/vm/guest-init.sh panic=-1 printk.devkmsg=on log_buf_len=8M"
# no5lvl: 4-level paging, cheaper to emulate (and -cpu max offers LA57).
# acpi=noirq pci=noacpi: ACPI only for the CPU tables, PCI and its IRQs the
# legacy way. The ACPI interpreter under KASAN + lockdep + TCG costs a minute
# of boot; acpi=off would cost the second CPU (SeaBIOS's MP table lists one).
append+=" no5lvl acpi=noirq pci=noacpi no_hash_pointers hung_task_panic=0 loglevel=7"
# The RDMA device's DMA device: QEMU's edu PCI device behind an emulated
# Intel IOMMU (q35), as an HCA sits behind the host's IOMMU. Every other
# device passes through (iommu.passthrough=1: translating the 9p root's
# traffic costs a minute of boot); tests/vm/guest-init.sh switches the edu
# device's group to translation and binds rxe's rig driver to it.
append+=" iommu.passthrough=1$extra_append"
# The PCI topology (docs/core.md, "The DMA device"): the DMA device (edu)
# and a 32 MiB memory BAR (ivshmem-plain, BAR 2) behind one PCIe switch
# (root port, x3130 upstream port, two xio3130 downstream ports), so the BAR
# is peer-to-peer reachable from the DMA device by bus address; and a second
# ivshmem on the root complex, which no client may map peer-to-peer
# (q35's host bridge is not on the kernel's P2P whitelist).
pci_topology=(
	-device pcie-root-port,id=pm_rp,chassis=1,slot=1,bus=pcie.0,addr=0x4
	-device x3130-upstream,id=pm_up,bus=pm_rp
	-device xio3130-downstream,id=pm_dn0,bus=pm_up,chassis=2,slot=0
	-device xio3130-downstream,id=pm_dn1,bus=pm_up,chassis=3,slot=1
	-device edu,bus=pm_dn0
	-object memory-backend-memfd,id=pm_p2pmem,size=32M,share=on
	-device ivshmem-plain,memdev=pm_p2pmem,bus=pm_dn1
	-object memory-backend-memfd,id=pm_rcmem,size=4M,share=on
	-device ivshmem-plain,memdev=pm_rcmem,bus=pcie.0,addr=0x5
)
qemu=(qemu-system-x86_64 "${accel_args[@]}" -smp "$smp" -m "$mem"
	-machine q35 -device intel-iommu,intremap=off "${pci_topology[@]}"
	-pidfile "$res/qemu.pid"
	-nodefaults -no-user-config -display none -no-reboot
	-chardev stdio,id=con,signal=off -serial chardev:con
	-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap
	-virtfs "local,path=$res,mount_tag=peermem-results,security_model=none,multidevs=remap"
	-kernel "$bzimage" -append "$append")
# PEERMEM_QEMU_PLUGIN=SO[,ARGS]: a TCG plugin for measurements
# (tests/bench/insncount: guest instructions between two markers).
[ -n "${PEERMEM_QEMU_PLUGIN:-}" ] && qemu+=(-plugin "$PEERMEM_QEMU_PLUGIN")
# PEERMEM_QEMU_PERFMAP=1: QEMU writes /tmp/perf-<pid>.map, naming each piece
# of translated code by the guest address it came from, so that a host
# `perf record` of QEMU can be split by guest function (tests/bench/hostprof.py).
[ "${PEERMEM_QEMU_PERFMAP:-0}" = 1 ] && qemu+=(-perfmap)

# --- TAP output ----------------------------------------------------------
tapn=0 npass=0 nfail=0 nskip=0
tap() { # tap ok|not-ok "description" [directive]
	tapn=$((tapn + 1))
	if [ "$1" = ok ]; then
		printf 'ok %d - %s\n' "$tapn" "$2"
		if [[ $2 =~ \#[[:space:]]*[Ss][Kk][Ii][Pp] ]]; then nskip=$((nskip + 1)); else npass=$((npass + 1)); fi
	else
		printf 'not ok %d - %s\n' "$tapn" "$2"; nfail=$((nfail + 1))
	fi
}
declare -A test_done=()
# Print test N's own TAP, renumbered into ours, then our verdict on how it ended.
emit_test() {
	local n=$1 lbl=${labels[$(($1 - 1))]} out=$res/out/$1 rc plan= seen=0 bad_seen=0 line st desc
	test_done[$n]=1
	rc=$(cat "$out.rc" 2>/dev/null || echo missing)
	if [ "$have_cmd" = 1 ]; then
		cat "$out" 2>/dev/null
		[ "$rc" = 0 ] || printf 'peermem-vm: the command exited with status %s\n' "$rc" >&2
		cmd_rc=$rc
		return
	fi
	printf '# %s\n' "$lbl"
	while IFS= read -r line || [ -n "$line" ]; do
		line=${line%$'\r'}
		if [[ $line =~ ^(not\ ok|ok)([[:space:]]+[0-9]+)?([[:space:]]+-)?[[:space:]]*(.*)$ ]]; then
			st=${BASH_REMATCH[1]} desc=${BASH_REMATCH[4]}
			seen=$((seen + 1))
			if [ "$st" = ok ]; then tap ok "$lbl: $desc"; else tap not-ok "$lbl: $desc"; bad_seen=1; fi
		elif [[ $line =~ ^1\.\.([0-9]+) ]]; then
			plan=${BASH_REMATCH[1]}
			[[ $line =~ \#[[:space:]]*[Ss][Kk][Ii][Pp] ]] && [ "$plan" = 0 ] && { tap ok "$lbl # SKIP ${line#*#}"; seen=$((seen + 1)); }
		elif [[ $line =~ ^Bail\ out! ]]; then
			tap not-ok "$lbl: $line"; bad_seen=1
		elif [[ $line =~ ^TAP\ version ]]; then
			:
		elif [[ $line =~ ^# ]]; then
			printf '%s\n' "$line"
		else
			printf '#   %s\n' "$line"
		fi
	done < "$out"
	case "$rc" in
	124|137) tap not-ok "$lbl: timed out after $(cat "$out.limit" 2>/dev/null || echo "$test_timeout")s (killed)" ;;
	missing) tap not-ok "$lbl: no exit status came back from the guest" ;;
	0)  if [ "$seen" = 0 ]; then tap not-ok "$lbl: printed no TAP result (a test must report something)"
	    elif [ -n "$plan" ] && [ "$plan" != "$seen" ]; then tap not-ok "$lbl: planned $plan results, printed $seen"; fi ;;
	4)  [ "$seen" = 0 ] && tap ok "$lbl # SKIP (exit status 4)" ;;
	*)  if [ "$bad_seen" = 0 ]; then tap not-ok "$lbl: exited with status $rc"
	    elif [ -n "$plan" ] && [ "$plan" != "$seen" ]; then tap not-ok "$lbl: planned $plan results, printed $seen"; fi ;;
	esac
	# tests/vm/guest-init.sh: modules the test left loaded, which it
	# unloaded before the next test (that one loads its own, with its own
	# arguments). Said, not failed: leaving gpusim loaded is a habit of many
	# tests; failing to unload is a failure.
	if [ -s "$out.left" ]; then
		if grep -q 'could not unload' "$out.left"; then
			tap not-ok "$lbl: left module(s) loaded that the runner could not unload: $(tr '\n' ' ' < "$out.left")"
		else
			printf '# runner: %s left module(s) loaded: %s(unloaded before the next test)\n' "$lbl" "$(tr '\n' ' ' < "$out.left")"
		fi
	fi
}

# --- boot and follow the console ------------------------------------------
con=$res/console.log
: > "$con"
cmd_rc=0 booted=0 done_marker=0 cur=0 t_start=$(date +%s.%N) t_boot= oops_line= hang=
[ "$have_cmd" = 1 ] || printf 'TAP version 13\n'
# QEMU 10.0's TCG can abort while the guest kernel probes PCI on q35
# ("iotlb_to_section: Assertion ... failed", seen once in about 30 boots
# here): an emulator crash before the guest ran anything. Boot once more
# then; any other early end, or one after the guest came up, is a failure.
# A guest can also hang during its boot, QEMU spinning with the console
# stopped (seen once in a CI-like run on a loaded machine, 2026-11-26: at
# 15 s of the kernel's boot, 38 minutes of a test job's time). With no
# "peermem-vm: init" within PEERMEM_VM_BOOT_LIMIT seconds (default 600; a
# boot takes 30 s on an idle machine, 80-130 s at half speed), or with a
# console that printed nothing for PEERMEM_VM_BOOT_QUIET seconds before
# that (default 150; a boot's longest silence is about 10 s here, so 20 s
# at half speed: a hang is caught in minutes, not at the limit), QEMU is
# stopped and the guest booted once more; a second hang fails the run.
boot_limit=${PEERMEM_VM_BOOT_LIMIT:-600}
[[ $boot_limit =~ ^[0-9]+$ ]] && [ "$boot_limit" -gt 0 ] || bad "PEERMEM_VM_BOOT_LIMIT wants seconds, got '$boot_limit'"
boot_quiet=${PEERMEM_VM_BOOT_QUIET:-150}
[[ $boot_quiet =~ ^[0-9]+$ ]] && [ "$boot_quiet" -gt 0 ] || bad "PEERMEM_VM_BOOT_QUIET wants seconds, got '$boot_quiet'"
for attempt in 1 2; do
rm -f "$res/boot-hang"
(
	exec </dev/null >/dev/null 2>&1
	t0=$SECONDS size=-1 t_size=$SECONDS
	while :; do
		# Killed (below, once QEMU has ended): nothing to watch. Without
		# this the watchdog went on when QEMU ended early, marked a boot
		# hang and killed QEMU's old pid before the kill of the watchdog
		# landed.
		sleep 2 || exit 0
		grep -q 'peermem-vm: init' "$con" && exit 0
		now=$(stat -c %s "$con" 2>/dev/null || echo 0)
		[ "$now" != "$size" ] && size=$now t_size=$SECONDS
		if [ $((SECONDS - t0)) -ge "$boot_limit" ]; then why="no init after ${boot_limit}s"
		elif [ $((SECONDS - t_size)) -ge "$boot_quiet" ]; then why="console silent for ${boot_quiet}s"
		else continue; fi
		printf '%s\n' "$why" > "$res/boot-hang"
		kill "$(cat "$res/qemu.pid")"
		exit 0
	done
) &
boot_wd=$!
pm_log "vm: booting $(basename "$(dirname "$kdir")")/$(basename "$kdir") ($accel, ${mem}, ${smp} cpus; $ntests test(s); limit ${total_timeout}s; log $con)"
while IFS= read -r line; do
	line=${line%$'\r'}
	printf '%s\n' "$line" >> "$con"
	[ "$verbose" = 1 ] && printf '%s\n' "$line" >&2
	# After an Oops nothing the guest says counts: its trace goes to the
	# log, but no test ends and no later test runs as far as we know.
	[ -n "$oops_line" ] && continue
	case "$line" in
	*"peermem-vm: init"*)
		booted=1; t_boot=$(date +%s.%N)
		pm_log "vm: guest up after $(printf '%.1f' "$(echo "$t_boot - $t_start" | bc)")s" ;;
	*"peermem-vm: calibration: "*)
		[ "$have_cmd" = 1 ] || printf '# vm: %s\n' "${line#*peermem-vm: }" ;;
	*"peermem-vm: begin test "*)
		[[ $line =~ begin\ test\ ([0-9]+) ]] && cur=${BASH_REMATCH[1]} ;;
	*"peermem-vm: end test "*)
		if [[ $line =~ end\ test\ ([0-9]+):.*\ ms=([0-9]+) ]]; then
			# Each test's time, for the run's log and for run-all's split of
			# the suite over VMs (the newest line of a label counts).
			printf '%s\t%s\t%s\n' "${labels[$((BASH_REMATCH[1] - 1))]}" "$((BASH_REMATCH[2] / 1000))" \
				"$(date +%F)" >> "$PEERMEM_CACHE/logs/vm-test-times.tsv"
			[ "$have_cmd" = 1 ] || printf '# %s took %ss\n' "${labels[$((BASH_REMATCH[1] - 1))]}" "$((BASH_REMATCH[2] / 1000))"
		fi
		[[ $line =~ end\ test\ ([0-9]+) ]] && emit_test "${BASH_REMATCH[1]}" ;;
	*"peermem-vm: done"*) done_marker=1 ;;
	*"peermem-vm: FATAL"*) printf '# %s\n' "${line#*peermem-vm: }" ;;
	# An Oops leaves the guest half dead (locks held, the test's process
	# killed mid-call): stop at the first one instead of waiting for the
	# time limit. A few seconds let its trace reach the console.
	*"Oops: "*|*"general protection fault"*|*"kernel BUG at"*|*"BUG: unable to handle"*)
		if [ -z "$oops_line" ]; then
			oops_line=${line#\[*\] }
			pm_log "vm: kernel Oops during $( [ "$cur" -gt 0 ] && echo "test $cur (${labels[$((cur - 1))]})" || echo boot): stopping the guest"
			( sleep 5; kill "$(cat "$res/qemu.pid" 2>/dev/null)" 2>/dev/null ) &
		fi ;;
	esac
done < <(timeout -k 10 "$total_timeout" "${qemu[@]}" </dev/null 2>"$res/qemu.err"; echo $? > "$res/qemu.rc")
pkill -P "$boot_wd" sleep 2>/dev/null; kill "$boot_wd" 2>/dev/null; wait "$boot_wd" 2>/dev/null
qrc=$(cat "$res/qemu.rc" 2>/dev/null || echo '?')
if [ "$booted" = 0 ] && [ -f "$res/boot-hang" ]; then
	last=$(tail -n 1 "$con" | cut -c1-120)
	hang=$(cat "$res/boot-hang")
	if [ "$attempt" = 1 ]; then
		pm_log "vm: the guest hung during its boot ($hang; the console stopped at: $last); booting again"
		printf '# vm: guest hung during boot (%s; console stopped at: %s); booted again\n' "$hang" "$last"
		mv "$con" "$res/console.first-boot.log"; : > "$con"
		mv "$res/qemu.err" "$res/qemu.first-boot.err"
		oops_line=
		continue
	fi
	printf '# vm: guest hung during boot again (%s; console stopped at: %s)\n' "$hang" "$last"
fi
if [ "$attempt" = 1 ] && [ "$booted" = 0 ] && [ "$qrc" = 134 ] &&
   grep -q 'iotlb_to_section: Assertion' "$res/qemu.err" 2>/dev/null; then
	pm_log "vm: QEMU aborted during the guest's boot ($(head -n 1 "$res/qemu.err")); booting again"
	printf '# vm: QEMU aborted during boot (%s); booted again\n' "$(head -n 1 "$res/qemu.err")"
	mv "$con" "$res/console.first-boot.log"; : > "$con"
	mv "$res/qemu.err" "$res/qemu.first-boot.err"
	oops_line=
	continue
fi
break
done
t_end=$(date +%s.%N)

# --- how did the guest end? -----------------------------------------------
label_of() { if [ "$1" -ge 1 ] 2>/dev/null; then echo "${labels[$(($1 - 1))]}"; else echo "boot"; fi; }
running=
[ "$cur" -gt 0 ] && [ -z "${test_done[$cur]:-}" ] && running=$cur
if [ "$done_marker" = 0 ]; then
	where="during boot"
	[ "$booted" = 1 ] && where="after the tests"
	[ -n "$running" ] && where="during test $running ($(label_of "$running"))"
	if grep -q 'Kernel panic' "$con"; then why="kernel panicked $where"
	elif [ -n "$oops_line" ]; then why="stopped at the first Oops $where: $oops_line"
	elif [ "$booted" = 0 ] && [ -f "$res/boot-hang" ]; then why="hung during boot ($hang), in both boots"
	elif [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then why="hung: killed after the ${total_timeout}s limit $where"
	else why="stopped unexpectedly $where (qemu exit status $qrc)"; fi
	tap not-ok "guest $why"
	if [ "$booted" = 0 ]; then
		printf '#   last lines of the guest console:\n'; tail -n 25 "$con" | sed 's/^/#   | /'
		[ -s "$res/qemu.err" ] && { printf '#   qemu said:\n'; sed 's/^/#   | /' "$res/qemu.err" | tail -n 10; }
	fi
	# A test cut short by a hang or panic still gets its output shown and a
	# verdict; tests that never started are counted as failed, not forgotten.
	if [ -n "$running" ]; then
		printf '# %s (cut short; its output so far):\n' "$(label_of "$running")"
		sed 's/^/#   /' "$res/out/$running" 2>/dev/null
		tap not-ok "$(label_of "$running"): did not finish (guest $why)"
		[ "$have_cmd" = 1 ] && cmd_rc=1
	fi
	for ((i = 1; i <= ntests; i++)); do
		[ -n "${test_done[$i]:-}" ] || [ "$i" = "${running:-0}" ] || tap not-ok "$(label_of "$i"): not run (guest $why)"
	done
fi

# --- kernel reports ------------------------------------------------------
# The console is complete unless the kernel dropped messages; then the saved
# dmesg (8 MiB buffer) is the better record.
src=$con
if grep -q 'printk messages dropped' "$con" && [ -s "$res/dmesg" ]; then src=$res/dmesg; fi
allow=${PEERMEM_KNOWN_REPORTS:-$PEERMEM_ROOT/tests/vm/known-reports}
reports=$res/reports
printf '%s\n' "${labels[@]}" > "$res/labels"
awk -v allowf="$allow" -v labelf="$res/labels" '
function label(n) { return n > 0 ? "test " n : "boot" }
BEGIN {
	nallow = 0
	while ((getline l < labelf) > 0) lab[++nlab] = l
	# "during LABEL-ERE: MSG-ERE" allows MSG only while a test whose label
	# matches LABEL-ERE runs (an expected effect of what that test does).
	while ((getline l < allowf) > 0) {
		if (l ~ /^[[:space:]]*(#|$)/) continue
		nallow++; allowdur[nallow] = ""
		if (l ~ /^during [^ ]+: /) {
			allowdur[nallow] = substr(l, 8, index(l, ": ") - 8)
			l = substr(l, index(l, ": ") + 2)
		}
		allowre[nallow] = l
	}
	head  = "^([A-Za-z0-9_.-]+: )?(BUG:|WARNING:|INFO: |Oops|UBSAN:|KASAN|kernel BUG at|Kernel panic|general protection fault|unreferenced object|DMA-API: |Unable to handle kernel|list_(add|del) corruption|refcount_t: |kmemleak: .*(disabled|[Cc]annot|fail))"
	anywh = "(blocked for more than [0-9]+ seconds|hung task|possible circular locking|inconsistent lock state|possible recursive locking|suspicious RCU usage|lock held when returning to user space)"
	cur = 0; inrep = 0; nrep = 0
}
{
	line = $0; msg = line
	sub(/^\[ *[0-9]+\.[0-9]+\] /, "", msg)
	hist[NR % 4] = line
	if (msg ~ /^peermem-vm: begin test [0-9]+/) { split(msg, w, " "); cur = w[4] + 0; inrep = 0; next }
	if (msg ~ /^peermem-vm: (end test|kmemleak scan|done)/) { if (msg ~ /^peermem-vm: end test/) cur = -cur; inrep = 0; next }
	if (inrep) {
		if (shown < 45) { print "E\t" line; shown++ }
		# A report ends at its end-of-trace line, at the ===== line that
		# closes KASAN reports, or after 80 lines.
		if (msg ~ /---\[ end (trace|Kernel panic)/ || msg ~ /^=+$/ || ++inlen >= 80) inrep = 0
		next
	}
	if (msg ~ head || msg ~ anywh) {
		for (i = 1; i <= nallow; i++) {
			if (msg !~ allowre[i]) continue
			if (allowdur[i] == "" || (cur > 0 && lab[cur] ~ allowdur[i])) next
		}
		nrep++
		where = cur > 0 ? "during test " cur : (cur < 0 ? "after test " (-cur) : "during boot")
		print "R\t" (cur > 0 ? cur : (cur < 0 ? -cur : 0)) "\t" where "\t" msg
		for (k = NR - 3; k < NR; k++) if (k > 0 && (k % 4) in hist) print "E\t" hist[k % 4]
		print "E\t" line
		inrep = 1; inlen = 0; shown = 4
	}
}' "$src" > "$reports"
if [ -s "$reports" ]; then
	nrep=$(grep -c '^R' "$reports")
	shown=0
	while IFS=$'\t' read -r kind a b c; do
		if [ "$kind" = R ]; then
			shown=$((shown + 1))
			[ "$shown" -gt 20 ] && { tap not-ok "$((nrep - 20)) more kernel reports (see $src)"; break; }
			if [ "$a" -gt 0 ]; then who="$b ($(label_of "$a"))"; else who=$b; fi
			tap not-ok "kernel report $who: $c"
		elif [ "$shown" -le 20 ]; then
			printf '#   | %s\n' "$a${b:+	$b}${c:+	$c}"
		fi
	done < "$reports"
fi
# A checker that switched itself off (its own allocation failed, say) stops
# seeing what follows: dma-debug then lists mappings whose unmaps it missed,
# kmemleak finds nothing. Its end-of-run check is failed with that cause
# instead of read (the switch-off line itself is a kernel report above).
# checker_off ERE: "test N (label): message" of the first such line, or nothing.
checker_off() {
	awk -v re="$1" '
	{ msg = $0; sub(/^\[ *[0-9]+\.[0-9]+\] /, "", msg) }
	msg ~ /^peermem-vm: begin test [0-9]+/ { split(msg, w, " "); cur = w[4] + 0; next }
	msg ~ re { print cur; print msg; exit }' "$src" | {
		read -r n || exit 0; read -r m
		printf '%s: %s\n' "$( [ "$n" -gt 0 ] 2>/dev/null && echo "test $n ($(label_of "$n"))" || echo boot)" "$m"
	}
}
dma_off=$(checker_off '^DMA-API: .*(dma-debug disabled|out of memory - disabling)')
leak_off=$(checker_off '^kmemleak: .*(disabled|Cannot allocate a kmemleak_object)')
if [ -n "$dma_off" ]; then
	tap not-ok "DMA-API leak check not done: the checker switched itself off during $dma_off; its list misses the unmaps after that"
elif [ -s "$res/dma-leaks" ]; then
	tap not-ok "DMA-API: $(wc -l < "$res/dma-leaks") mapping(s) for the rig's DMA device never unmapped (list: $res/dma-leaks)"
	head -n 10 "$res/dma-leaks" | sed 's/^/#   | /'
fi
if [ -n "$leak_off" ] && [ "$kmemleak" = 1 ]; then
	tap not-ok "kmemleak check not done: kmemleak switched itself off during $leak_off"
elif [ -s "$res/kmemleak" ] && grep -q '^unreferenced object' "$res/kmemleak"; then
	nleak=$(grep -c '^unreferenced object' "$res/kmemleak")
	tap not-ok "kmemleak: $nleak unreferenced object(s) after the tests (list: $res/kmemleak)"
	head -n 40 "$res/kmemleak" | sed 's/^/#   | /'
fi

# --- summary --------------------------------------------------------------
elapsed=$(printf '%.1f' "$(echo "$t_end - $t_start" | bc)")
boot=?; [ -n "$t_boot" ] && boot=$(printf '%.1f' "$(echo "$t_boot - $t_start" | bc)")
if [ "$have_cmd" = 1 ]; then
	if [ "$nfail" -gt 0 ]; then
		pm_log "vm: FAILED (kernel reports or guest trouble above; run directory $res)"
		exit 1
	fi
	[ "$keep" = 1 ] || rm -rf "$res"
	pm_log "vm: done in ${elapsed}s (boot ${boot}s)"
	[ "$cmd_rc" = 0 ] || exit 1
	exit 0
fi
printf '1..%d\n' "$tapn"
printf '# vm: %d passed, %d failed, %d skipped; boot %ss, total %ss (%s); run directory %s\n' \
	"$npass" "$nfail" "$nskip" "$boot" "$elapsed" "$accel" "$res"
if [ "$nfail" -gt 0 ]; then exit 1; fi
[ "$keep" = 1 ] || rm -rf "$res"
exit 0
exit
}
