#!/usr/bin/env bash
# The race soak (outside CI; tests/run-all.sh runs a short one as
# tests/guest/soak/t_soak_short): several processes with two threads each
# loop over whole registration lifetimes on gpusim memory in the rig, with
# random sizes, sub-ranges,
# teardown orders (dereg, GPU free, munmap, mremap, MAP_FIXED, fork, exit)
# and delay knobs, every byte checked, the client reloaded every few epochs
# (tests/guest/soak/soak.h says what a round does and checks).
#
#   scripts/soak.sh [--rounds N] [--seconds S] [--client peermem|nvpeermem]
#                   [--procs P] [--epochs E] [--reload-every K] [--seed N]
#                   [--kernel debug|plain] [--kdir DIR] [-v]
#
#   --rounds N     rounds in total (default 100000)
#   --seconds S    run for S seconds instead, in E equal epochs (--rounds is
#                  then only a cap; at least one round per epoch is required)
#   --client C     peermem (default) or nvpeermem: NVIDIA's nvidia-peermem,
#                  unmodified, built by tests/nvpeermem/build.sh
#   --procs P      worker processes, two threads each (default 3)
#   --epochs E     epochs (default 50): between two, everything must be idle
#   --reload-every K  unload and reload the client every K epochs (default 5)
#   --seed N       the random seed (default: the time)
#   --kernel K     debug (default: KASAN, lockdep, kmemleak, DMA-API debug:
#                  every report fails the run) or plain (the same kernel
#                  without those checkers, about 9 times the rounds an hour:
#                  what it still checks is the soak's own, every byte, every
#                  revocation, nothing left after an epoch, and the kernel's
#                  BUG/WARNING/Oops); built by scripts/kernel.sh --variant K
#   --kdir DIR     a built rig kernel (instead of --kernel)
#   -v             stream the guest console
#
# Builds gpusim, peermem (or nvidia-peermem) and the soak, boots the rig
# once and runs it; prints progress lines every 30 s and a final TAP table;
# any kernel report, kmemleak or DMA-API leak fails the run (scripts/vm.sh).
# Exit status 0 only if everything passed.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$PEERMEM_ROOT"
usage() { pm_help "$0" '^set -euo'; exit 0; }
rounds=100000 seconds=0 client=peermem procs=3 epochs=50 reload=5 seed=0 kernel= kdir= verbose=()
soak_usage='scripts/soak.sh [--rounds N] [--seconds S] [--client NAME] [--procs P] [--epochs E] [--reload-every N] [--seed N] [--kernel debug|plain] [--kdir DIR] [-v] (--help)'
need() { pm_need_value "$soak_usage" "$@"; }
uint() { [[ $2 =~ ^[0-9]+$ ]] || pm_die "$1 wants a number, got '$2'"; }
while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) need "$@"; uint "$@"; rounds=$2; shift 2 ;;
	--seconds) need "$@"; uint "$@"; seconds=$2; shift 2 ;;
	--client) need "$@"; client=$2; shift 2 ;;
	--procs) need "$@"; uint "$@"; procs=$2; shift 2 ;;
	--epochs) need "$@"; uint "$@"; epochs=$2; shift 2 ;;
	--reload-every) need "$@"; uint "$@"; reload=$2; shift 2 ;;
	--seed) need "$@"; uint "$@"; seed=$2; shift 2 ;;
	--kernel) need "$@"; kernel=$2; shift 2 ;;
	--kdir) need "$@"; kdir=$2; shift 2 ;;
	-v) verbose=(-v); shift ;;
	-h|--help) usage ;;
	*) pm_usage_die "unknown argument '$1'" "$soak_usage" ;;
	esac
done
case "$client" in peermem|nvpeermem) ;; *) pm_die "--client wants peermem or nvpeermem, got '$client'" ;; esac
[ "$rounds" -ge 1 ] && [ "$procs" -ge 1 ] && [ "$procs" -le 64 ] && [ "$epochs" -ge 1 ] ||
	pm_die "--rounds >= 1, --procs 1..64, --epochs >= 1"
case "$kernel" in ''|debug|plain) ;; *) pm_usage_die "--kernel wants debug or plain, got '$kernel'" "$soak_usage" ;; esac
[ -z "$kernel" ] || [ -z "$kdir" ] || pm_usage_die "--kernel and --kdir exclude each other" "$soak_usage"
[ -n "$kdir" ] || kdir=$(scripts/kernel.sh --variant "${kernel:-debug}" --print-kdir) ||
	pm_die "no built ${kernel:-debug} rig kernel: build it with scripts/kernel.sh --variant ${kernel:-debug}"
[ -f "$kdir/arch/x86/boot/bzImage" ] || pm_die "no built rig kernel in '$kdir' (scripts/kernel.sh builds it)"
# A kernel without KASAN is the plain one: no kmemleak to scan.
if grep -q '^CONFIG_KASAN=y' "$kdir/.config" 2>/dev/null; then plain=0; else plain=1; fi

make -C tests/gpusim KDIR="$kdir" LLVM=-19 >/dev/null
make -C tests/pfnmap KDIR="$kdir" LLVM=-19 >/dev/null
if [ "$client" = peermem ]; then
	make KDIR="$kdir" LLVM=-19 >/dev/null
else
	tests/nvpeermem/build.sh --kdir "$kdir" >/dev/null
fi
make -C tests/guest/soak >/dev/null

# Time: the rounds at 3-4 a second under TCG on the debug kernel (measured:
# 3.5 with 3 processes), so 2 a second, and slack; on the plain kernel
# 31 (2026-11-26, 3 processes, 1500 s), so 8 a second.
rate=$((plain ? 8 : 2))
limit=$((seconds > 0 ? seconds + 600 : rounds / rate + 900))
vmx=()
[ "$plain" = 0 ] || vmx=(--no-kmemleak)
scripts/vm.sh --kdir "$kdir" "${verbose[@]}" "${vmx[@]}" --test-timeout "$limit" \
	--env SOAK_ROUNDS="$rounds" --env SOAK_SECONDS="$seconds" --env SOAK_CLIENT="$client" \
	--env SOAK_PROCS="$procs" --env SOAK_EPOCHS="$epochs" --env SOAK_RELOAD_EVERY="$reload" \
	--env SOAK_SEED="$seed" -- tests/guest/soak/soak
