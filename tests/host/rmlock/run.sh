#!/usr/bin/env bash
# Host test (TAP): peermem's own locks stay out of every lock-order cycle
# with the GPU driver's resource-manager (RM) lock. gpusim with rm_lock=1
# holds a lockdep-tracked lock where NVIDIA 550's RM holds its API lock
# (inside nvidia_p2p_get_pages, dma_map_pages, put_pages; across the free
# callbacks). tests/guest/peermem/x_peermem_rm_lock registers, deregisters,
# registers again and frees the memory under the MR, none of it racing.
# The free callback takes peermem's registration lock before it calls the
# core's invalidate, so a cycle through peermem's lock would be lockdep's
# report; the report that must come instead is the one peermem cannot
# avoid: OFED's core holds the umem's mapping_lock across the client's
# dma_map (hence across nvidia_p2p_dma_map_pages) and takes it in
# invalidate (docs/module.md, "Locking"). A lockdep report fails any VM
# run, so the program runs alone in a boot of its own and this script
# checks the run failed for exactly that reason.
# Needs a built rig kernel (KDIR, or scripts/kernel.sh --print-kdir), gpusim,
# peermem and the guest programs built; PEERMEM_SCRIPTS_NO_VM=1 skips it.
set -uo pipefail
. "$(dirname "$0")/../../../scripts/lib.sh"
cd "$PEERMEM_ROOT" || exit 1

n=0 nfail=0
ok()     { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $*"; nfail=$((nfail + 1)); }
skip()   { n=$((n + 1)); echo "ok $n - $* # SKIP"; }
out=$(mktemp /tmp/peermem-rmlock.XXXXXX); trap 'rm -f "$out"' EXIT
has() { # has DESC REGEX: the VM output has a line matching REGEX
	if grep -qE -- "$2" "$out"; then ok "$1"; else not_ok "$1 (no line matching: $2)"; fi
}

kdir=${KDIR:-$(scripts/kernel.sh --print-kdir 2>/dev/null)}
prog=tests/guest/peermem/x_peermem_rm_lock
if [ "${PEERMEM_SCRIPTS_NO_VM:-0}" = 1 ] || [ -z "$kdir" ] || [ ! -f "$kdir/arch/x86/boot/bzImage" ]; then
	skip "peermem RM-lock lockdep check (no built rig kernel, or PEERMEM_SCRIPTS_NO_VM=1)"
	echo "1..$n"; exit 0
fi
for f in tests/gpusim/gpusim.ko peermem.ko "$prog"; do
	[ -e "$f" ] || { not_ok "$f is missing (make -C tests/gpusim; make; make -C tests/guest/peermem)"; echo "1..$n"; exit 1; }
done

scripts/vm.sh --kdir "$kdir" --test-timeout 180 --env GPUSIM_RM_LOCK=1 -- "$prog" >"$out" 2>&1
rc=$?
if [ "$rc" = 1 ]; then ok "the VM run fails (exit 1): the report counts as a failure"; else not_ok "the VM run fails with exit 1 (got $rc)"; fi
p='guest/peermem/x_peermem_rm_lock'
has "registration, deregistration and the free's invalidation worked with the RM lock" \
	"^ok [0-9]+ - $p: peermem invalidated the MR through the core"
has "no lockdep report names peermem's registration lock" \
	"^ok [0-9]+ - $p: no lockdep report names peermem's registration lock"
has "the report is the core's mapping_lock against the RM lock" \
	"^ok [0-9]+ - $p: the report is the core's"
if grep -qE "^not ok [0-9]+ - $p:" "$out"; then
	not_ok "every check of the guest program passed"; grep -E '^not ok' "$out" | sed 's/^/#   /'
else
	ok "every check of the guest program passed"
fi
has "scripts/vm.sh attributes a lockdep cycle report to it" \
	"^not ok [0-9]+ - kernel report during test 1 \\($p\\): WARNING: possible circular locking dependency detected"
nrep=$(grep -cE '^not ok [0-9]+ - kernel report' "$out")
if [ "$nrep" = 1 ]; then ok "exactly one kernel report"; else not_ok "exactly one kernel report (got $nrep)"; fi
if [ "$nfail" -gt 0 ]; then sed 's/^/#   | /' "$out" | tail -n 80; fi
echo "1..$n"
[ "$nfail" = 0 ]
