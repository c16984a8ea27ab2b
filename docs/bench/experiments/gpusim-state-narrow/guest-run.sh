#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# In the rig (run.sh runs it): ROUNDS rounds; in each, for the stock gpusim
# (GPUSIM_STOCK) and the patched one (GPUSIM_EXP) in a rotating order, and
# for each side: N reg+dereg of 2 MiB by one thread, then N by each of two
# threads on distinct ranges; the throughput ratio 2 threads / 1 thread is
# (ms per op, 1 thread) / (ms per op, wall over both threads' ops).
#
#   guest-run.sh BENCH_PEERMEM ROUNDS N
bench=$1 rounds=$2 n=$3
builds=(stock exp)
per_op() { # per_op BUILD SIDE THREADS: ms per reg+dereg (wall, all threads)
	local ko=$GPUSIM_STOCK
	[ "$1" = exp ] && ko=$GPUSIM_EXP
	GPUSIM_KO=$ko BENCH_PROF_THREADS=$3 "$bench" --profile "$2" 2097152 "$n" --large 67108864 |
		sed -n 's/.* \([0-9.]*\) ms per reg+dereg.*/\1/p'
}
for ((r = 0; r < rounds; r++)); do
	for k in 0 1; do
		b=${builds[(r + k) % 2]}
		rmmod gpusim 2>/dev/null
		for side in peermem nvidia-peermem floor; do
			t1=$(per_op "$b" "$side" 1) t2=$(per_op "$b" "$side" 2)
			[ -n "$t1" ] && [ -n "$t2" ] || { echo "not ok: $b $side failed"; exit 1; }
			echo "round $r $b $side 1thread_ms $t1 2threads_ms $t2 ratio $(awk -v a="$t1" -v b="$t2" 'BEGIN { printf "%.2f", a / b }')"
		done
	done
done | tee /tmp/gpusim-narrow.txt
echo "medians of the rounds' 2 threads / 1 thread throughput:"
awk '{ v[$3 " " $4] = v[$3 " " $4] " " $10 }
	END {
		for (k in v) {
			n = split(v[k], a, " ")
			for (i = 2; i <= n; i++)
				for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
			printf "  %-22s %.2fx (rounds:%s)\n", k, n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2, v[k]
		}
	}' /tmp/gpusim-narrow.txt | sort
rmmod gpusim 2>/dev/null
exit 0
