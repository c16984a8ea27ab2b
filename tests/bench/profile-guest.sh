#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# In the rig (scripts/bench.sh --profile runs it): for each side, N
# ibv_reg_mr + ibv_dereg_mr (the floor: pin + map, unmap + unpin) of BYTES
# under a system-wide `perf record -e cpu-clock` (the host's perf, seen
# through the shared root; the rig kernel has no ftrace), then the kernel
# and user symbols that took the CPU, as shares of the busy (non-idle)
# samples. cpu-clock sampling shows where CPU time goes, not time spent
# waiting (a grace period, a sleep): compare the wall time per operation
# with the busy samples.
#
#   profile-guest.sh BENCH_PEERMEM BYTES N [TOP [THREADS]]
#
# THREADS 2 (BYTES 2 MiB only): two threads registering distinct ranges, N
# each, as the 1 vs 2 threads figure does.
bench=$1 bytes=$2 n=$3 top=${4:-25} threads=${5:-1}
command -v perf >/dev/null || { echo "no perf on the host (Debian: linux-perf); nothing profiled"; exit 1; }
echo 0 > /proc/sys/kernel/kptr_restrict
echo -1 > /proc/sys/kernel/perf_event_paranoid
large=$(( bytes > 67108864 ? bytes : 67108864 ))
for side in peermem nvidia-peermem floor; do
	out=/tmp/perf.$side
	BENCH_PROF_THREADS=$threads BENCH_PERF_OUT=$out "$bench" --profile "$side" "$bytes" "$n" --large "$large" | grep -E '^(profile|not ok)' || exit 1
	perf report -q -i "$out" --stdio --sort sym 2>/dev/null | awk -v top="$top" -v side="$side" '
		/^ *[0-9.]+%/ {
			p = $1; sub(/%/, "", p); sym = $0; sub(/^ *[0-9.]+% +/, "", sym)
			if (sym ~ /default_idle|cpu_idle|safe_halt|mwait_idle|poll_idle|acpi_idle/) { idle += p; next }
			n++; pc[n] = p; name[n] = sym; busy += p
		}
		END {
			printf "%s: busy %.1f%% of the CPU samples (2 vCPUs), idle %.1f%%; top symbols as shares of the busy samples:\n", side, busy, idle
			for (i = 1; i <= n && i <= top; i++) printf "  %6.2f%%  %s\n", 100 * pc[i] / busy, name[i]
		}'
	echo "$side: busy samples by object (the kernel, each module, user space):"
	perf report -q -i "$out" --stdio --sort dso 2>/dev/null | awk '
		/^ *[0-9.]+%/ { p = $1; sub(/%/, "", p); d = $2; v[d] += p; t += p }
		END { for (d in v) printf "  %6.2f%%  %s\n", 100 * v[d] / t, d }' | sort -rn | head -n 8
done
