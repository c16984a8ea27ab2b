#!/usr/bin/env bash
# The demo: on a fresh Debian 12 machine, set everything up, build the rig
# kernel, the module, gpusim and the demo program, boot the rig, and there
# (tests/vm/demo-guest.sh): load gpusim and peermem, show modinfo, bring up
# soft-RoCE, ibv_reg_mr() on GPU memory, RDMA WRITE and READ into it, free
# it under the live MR, show the counters, unload, and check the kernel
# stayed clean. Every step prints its elapsed time.
#
#   scripts/demo.sh [--skip-setup] [--kdir DIR] [--bench [ROUNDS]]
#
# --bench: the benchmarks instead of the demo: runs scripts/bench.sh
# --rounds ROUNDS (default 20), which sets up, builds the plain rig kernel,
# gpusim's test client, nvidia-peermem and the benchmark itself (--kdir
# is not passed on: the benchmarks want the plain kernel).
set -euo pipefail
# Read whole before running (the braces below): a script edited while it
# runs, or waits for a lock, must not change under the running shell.
{
. "$(dirname "$0")/lib.sh"
cd "$PEERMEM_ROOT"

skip_setup=0 kdir= bench= bench_rounds=20
while [ $# -gt 0 ]; do
	case "$1" in
	--skip-setup) skip_setup=1; shift ;;
	--kdir) pm_need_value 'scripts/demo.sh [--skip-setup] [--kdir DIR] [--bench [ROUNDS]] [--help]' "$@"; kdir=$2; shift 2 ;;
	--bench) bench=1; shift
		if [[ "${1:-}" =~ ^[0-9]+$ ]]; then bench_rounds=$1; shift; fi ;;
	-h|--help) pm_help "$0" '^set -euo'; exit 0 ;;
	*) pm_usage_die "unknown argument '$1'" 'scripts/demo.sh [--skip-setup] [--kdir DIR] [--bench [ROUNDS]] [--help]' ;;
	esac
done

if [ -n "$bench" ]; then
	sargs=(--rounds "$bench_rounds")
	[ "$skip_setup" = 1 ] && sargs+=(--skip-setup)
	pm_stage "demo: the benchmarks (scripts/bench.sh ${sargs[*]})"
	exec scripts/bench.sh "${sargs[@]}"
fi
if [ "$skip_setup" = 0 ]; then
	pm_stage "demo: host setup"
	scripts/setup-host.sh
fi
if [ -z "$kdir" ]; then
	pm_stage "demo: rig kernel"
	kdir=$(scripts/kernel.sh --variant debug | tail -n 1)
fi
[ -f "$kdir/arch/x86/boot/bzImage" ] || pm_die "no built kernel in $kdir; run scripts/kernel.sh"
margs=(KDIR="$kdir")
if [ -f "$kdir/.peermem-make-args" ]; then read -ra extra < "$kdir/.peermem-make-args"; margs+=("${extra[@]}"); fi

build() { # build DIR NAME
	local log=$PEERMEM_CACHE/logs/demo-build-${2// /-}.log
	mkdir -p "${log%/*}"
	pm_stage "demo: build $2"
	if ! make -C "$1" -j3 "${margs[@]}" >"$log" 2>&1; then
		tail -n 20 "$log" >&2
		pm_die "building $2 failed (full log: $log)"
	fi
}
[ -f tests/gpusim/Makefile ] && build tests/gpusim gpusim
[ -f Makefile ] || pm_die "no Makefile at the top of the repo: the module build is missing"
build . "peermem module"
[ -f peermem.ko ] || pm_die "the build did not produce peermem.ko"
# The reference client is the demo's fallback while peermem cannot serve GPU memory.
build tests/refclient "reference client"
build tests/guest/e2e "demo program"

pm_stage "demo: boot the rig and run tests/vm/demo-guest.sh in it"
# The guest scales the demo's limit (300 s) by its measured slowdown, up to
# 4x; the whole run's limit must allow that and a slow boot, or a slow or
# busy machine sees "guest hung" while the demo is still working (it did:
# 495 s, the default for one command, with the guest at 400%).
scripts/vm.sh --kdir "$kdir" --no-kmemleak --timeout $((300 + 4 * 300)) --cmd "bash $PEERMEM_ROOT/tests/vm/demo-guest.sh"
pm_stage "demo: done"
exit
}
