#!/usr/bin/env bash
# Host test of gpusim's RM lock (TAP). With rm_lock=1 gpusim holds one
# lockdep-tracked lock where NVIDIA 550's resource manager holds its API lock
# (across get_pages, dma_map_pages, put_pages and the whole free path with its
# free callbacks; docs/gpusim.md, "The resource manager's lock"). A client
# that holds one of its own locks across nvidia_p2p_get_pages and takes it in
# its free callback must therefore get a lockdep report. That report fails
# any VM run, so the guest program that provokes it,
# tests/guest/gpusim/x_gpusim_rm_cycle, runs alone in a boot of its own and
# this script checks that the run failed for exactly that reason.
# Needs a built rig kernel (KDIR, or scripts/kernel.sh --print-kdir), gpusim
# and the guest programs built; PEERMEM_SCRIPTS_NO_VM=1 skips it.
set -uo pipefail
. "$(dirname "$0")/../../../scripts/lib.sh"
cd "$PEERMEM_ROOT" || exit 1

n=0 nfail=0
ok()     { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $*"; nfail=$((nfail + 1)); }
skip()   { n=$((n + 1)); echo "ok $n - $* # SKIP"; }
out=$(mktemp /tmp/peermem-gpusim-rmlock.XXXXXX); trap 'rm -f "$out"' EXIT
has() { # has DESC REGEX: the VM output has a line matching REGEX
	if grep -qE -- "$2" "$out"; then ok "$1"; else not_ok "$1 (no line matching: $2)"; fi
}

kdir=${KDIR:-$(scripts/kernel.sh --print-kdir 2>/dev/null)}
prog=tests/guest/gpusim/x_gpusim_rm_cycle
if [ "${PEERMEM_SCRIPTS_NO_VM:-0}" = 1 ] || [ -z "$kdir" ] || [ ! -f "$kdir/arch/x86/boot/bzImage" ]; then
	skip "gpusim RM lock lockdep proof (no built rig kernel, or PEERMEM_SCRIPTS_NO_VM=1)"
	echo "1..$n"; exit 0
fi
for f in tests/gpusim/gpusim.ko tests/gpusim/testclient/gpusim_testclient.ko "$prog"; do
	[ -e "$f" ] || { not_ok "$f is missing (make -C tests/gpusim; make -C tests/guest/gpusim)"; echo "1..$n"; exit 1; }
done

scripts/vm.sh --kdir "$kdir" --test-timeout 120 -- "$prog" >"$out" 2>&1
rc=$?
if [ "$rc" = 1 ]; then ok "the VM run fails (exit 1): the report counts as a failure"; else not_ok "the VM run fails with exit 1 (got $rc)"; fi
has "the control without the RM lock has no report" '^ok [0-9]+ - guest/gpusim/x_gpusim_rm_cycle: rm_lock=0: no lockdep report'
has "with rm_lock=1 the program itself found the report in the kernel log" \
	'^ok [0-9]+ - guest/gpusim/x_gpusim_rm_cycle: rm_lock=1: lockdep reports the cycle through GPUSIM_RM_API_LOCK'
if grep -qE '^not ok [0-9]+ - guest/gpusim/x_gpusim_rm_cycle:' "$out"; then
	not_ok "every check of the guest program passed"; grep -E '^not ok' "$out" | sed 's/^/#   /'
else
	ok "every check of the guest program passed"
fi
has "scripts/vm.sh attributes a lockdep cycle report to it" \
	'^not ok [0-9]+ - kernel report during test 1 \(guest/gpusim/x_gpusim_rm_cycle\): WARNING: possible circular locking dependency detected'
has "the report's excerpt names gpusim's RM lock" '^#   \| .*GPUSIM_RM_API_LOCK'
nrep=$(grep -cE '^not ok [0-9]+ - kernel report' "$out")
if [ "$nrep" = 1 ]; then ok "exactly one kernel report"; else not_ok "exactly one kernel report (got $nrep)"; fi
if [ "$nfail" -gt 0 ]; then sed 's/^/#   | /' "$out" | tail -n 60; fi
echo "1..$n"
[ "$nfail" = 0 ]
