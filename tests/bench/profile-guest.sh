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
#   profile-guest.sh BENCH_PEERMEM BYTES|free N [TOP [THREADS [CALLGRAPH]]]
#
# THREADS 2 (BYTES 2 MiB only): two threads registering distinct ranges, N
# each, as the 1 vs 2 threads figure does.
# BYTES "free": N GPU frees of 4 MiB under 64 live MRs each (as the GPU
# free -> revoked figure), perf enabled around the frees only; the symbols
# also in microseconds of CPU per free (4000 samples/s per vCPU).
# The microseconds are the symbol's share of all samples times the CPU
# time of the frees (vCPUs x their summed wall time): under TCG the
# sampling timer reaches far fewer than the nominal 4000 samples/s (the
# rate reached is printed), so the samples are scaled to the time they
# cover. After the profiles, the frees are timed without perf in 10
# rounds of 30 per side, the sides in a rotating order, for their medians.
# CALLGRAPH 1: perf record -g (kernel call chains through the kernel's ORC
# unwinder); adds, for every sample spinning on or waiting for a mutex, the
# first caller outside the mutex code, and for the free profile the
# symbols by inclusive share (time in them and in what they call).
# PROFILE_CALLERS=SYM (with CALLGRAPH 1): the samples whose leaf is SYM by
# their first four callers.
# PROFILE_COUNTERS=1 (registrations, one thread): no perf; the kernel's
# counters around each pass instead (bench_peermem's BENCH_PROF_COUNTERS:
# the thread's CPU time and context switches, the guest's busy time, the
# softirq and interrupt rows), per reg+dereg, and the wall time without a
# profiler's overhead: where a side's time goes that a CPU profile cannot
# see (sleeps, work on the other vCPU, IPIs).
# PROFILE_EVENT=cs: perf records every context switch (perf's software
# event, one sample each, with call chains if CALLGRAPH): where the
# registering thread sleeps, by kernel call chain.
# PROFILE_GAP=S (with PROFILE_COUNTERS=1): S seconds idle between passes,
# for a profile of QEMU on the host (the host's view of each pass).
bench=$1 bytes=$2 n=$3 top=${4:-25} threads=${5:-1} cg=${6:-0}
counters=${PROFILE_COUNTERS:-0}
[ "$counters" = 1 ] || command -v perf >/dev/null || { echo "no perf on the host (Debian: linux-perf); nothing profiled"; exit 1; }
echo 0 > /proc/sys/kernel/kptr_restrict
echo -1 > /proc/sys/kernel/perf_event_paranoid
if [ "$bytes" = free ]; then large=67108864; else large=$(( bytes > 67108864 ? bytes : 67108864 )); fi
idle_re='default_idle|cpu_idle|safe_halt|mwait_idle|poll_idle|acpi_idle'
# PROFILE_CHUNKS=K (registrations only): K passes over the three sides, in
# an order that rotates from pass to pass, N/K registrations per side and
# pass, each pass profiled and reported apart (the raw lines of each pass
# follow its "profile SIDE" line): under a loaded host the passes of the
# sides interleave, so a drift of the host's speed weighs on all sides
# alike (tests/bench/report.py profdiff averages the passes).
chunks=${PROFILE_CHUNKS:-1}
[ "$bytes" != free ] || chunks=1
sides=(peermem nvidia-peermem floor)
order=()
for ((c = 0; c < chunks; c++)); do
	for k in 0 1 2; do order+=("${sides[(c + k) % 3]}"); done
done
[ "$chunks" = 1 ] || n=$(( n / chunks ))
if [ "$counters" = 1 ]; then
	[ "$bytes" != free ] && [ "$threads" = 1 ] || { echo "PROFILE_COUNTERS=1: registrations by one thread only"; exit 1; }
	pass=0
	for side in "${order[@]}"; do
		BENCH_PROF_COUNTERS=1 "$bench" --profile "$side" "$bytes" "$n" --large "$large" |
			grep -E '^(profile|counter|insns-dump|ksym|not ok)' | sed "s/^counter /counter pass$((pass / 3)) /"
		[ "${PIPESTATUS[0]}" = 0 ] || exit 1
		pass=$((pass + 1))
		# PROFILE_GAP=S: S seconds idle after each pass, so that a profile
		# of QEMU taken on the host shows the passes apart.
		[ -z "${PROFILE_GAP:-}" ] || sleep "$PROFILE_GAP"
	done
	exit 0
fi
for side in "${order[@]}"; do
	out=/tmp/perf.$side
	# The symbols while the side's module is loaded (bench_peermem unloads
	# it before it exits): perf report names the module's functions from it.
	ks=/tmp/kallsyms.$side
	line=$(BENCH_PERF_EVENT=${PROFILE_EVENT:-} BENCH_KALLSYMS=$ks BENCH_PERF_CALLGRAPH=$cg BENCH_PROF_THREADS=$threads BENCH_PERF_OUT=$out "$bench" --profile "$side" "$bytes" "$n" --large "$large" | grep -E '^(profile|not ok)')
	echo "$line"
	case "$line" in profile*) ;; *) exit 1 ;; esac
	# The frees' summed wall time (free profile): the CPU time sampled.
	wall=$(sed -n 's/.* sum \([0-9.]*\) s .*/\1/p' <<<"$line")
	cpus=$(nproc)
	total=$(perf report -q -i "$out" --kallsyms="$ks" --stdio --no-children -n --sort sym -g none 2>/dev/null | awk '/^ *[0-9.]+%/ { s += $2 } END { print s + 0 }')
	if [ "$bytes" = free ]; then
		awk -v t="$total" -v w="$wall" -v c="$cpus" -v side="$side" 'BEGIN {
			printf "%s: %d samples in %.3f s of frees on %d vCPUs: %.0f samples/s per vCPU (perf_event_max_sample_rate now %s)\n",
				side, t, w, c, t / (w * c), "'"$(cat /proc/sys/kernel/perf_event_max_sample_rate)"'" }'
	fi
	perf report -q -i "$out" --kallsyms="$ks" --stdio --no-children -n --sort sym -g none 2>/dev/null | awk -v top="$top" -v side="$side" -v n="$n" -v free="$bytes" -v total="$total" -v cput="${wall:-0}" -v cpus="$cpus" '
		/^ *[0-9.]+%/ {
			p = $1; sub(/%/, "", p); c = $2; sym = $0; sub(/^ *[0-9.]+% +[0-9]+ +/, "", sym)
			if (sym ~ /'"$idle_re"'/) { idle += p; idlec += c; next }
			k++; pc[k] = p; cnt[k] = c; name[k] = sym; busy += p; busyc += c
		}
		END {
			printf "%s: busy %.1f%% of the CPU samples (2 vCPUs), idle %.1f%%", side, busy, idle
			us = cput * cpus / total / n * 1e6	# CPU time per sample, per free
			if (free == "free")
				printf "; per free: %.0f us busy, %.0f us idle (CPU time, all vCPUs)", busyc * us, idlec * us
			printf "; top symbols as shares of the busy samples%s:\n", free == "free" ? " (and us of CPU per free)" : ""
			for (i = 1; i <= k && i <= top; i++)
				if (free == "free")
					printf "  %6.2f%%  %7.1f us  %s\n", 100 * pc[i] / busy, cnt[i] * us, name[i]
				else
					printf "  %6.2f%%  %s\n", 100 * pc[i] / busy, name[i]
		}'
	# Every symbol's samples, for a comparison of the sides on the host
	# (tests/bench/report.py profdiff): "raw-self SIDE PCT COUNT SYM" and,
	# with call chains, "raw-incl SIDE CHILDREN% SELF% SYM".
	# perf leaves the functions of a module it finds no .ko for (peermem's,
	# nvidia-peermem's: built outside /lib/modules) as bare addresses; they
	# are named here from the side's kallsyms ("name [module]").
	{
		perf report -q -i "$out" --kallsyms="$ks" --stdio --no-children -n --sort sym -g none 2>/dev/null |
			awk -v side="$side" '/^ *[0-9.]+%/ { sub(/^ +/, ""); print "raw-self " side " " $0 }'
		[ "$cg" = 1 ] && perf report -q -i "$out" --kallsyms="$ks" --stdio --children --sort sym -g none 2>/dev/null |
			awk -v side="$side" '/^ *[0-9.]+%/ { sub(/^ +/, ""); print "raw-incl " side " " $0 }'
	} | python3 -c '
import bisect, re, sys
syms = []
for l in open(sys.argv[1]):
    p = l.split()
    if len(p) >= 4 and p[1] in "tT":
        syms.append((int(p[0], 16), p[2] + " " + p[3]))
syms.sort()
keys = [a for a, _ in syms]
def name(m):
    a = int(m.group(1), 16)
    i = bisect.bisect_right(keys, a) - 1
    return syms[i][1] if i >= 0 and a - keys[i] < 0x10000 else m.group(0)
for l in sys.stdin:
    sys.stdout.write(re.sub(r"\b0x(ffffffff[0-9a-f]{8})\b", name, l))
' "$ks"
	echo "$side: busy samples by object (the kernel, each module, user space):"
	perf report -q -i "$out" --kallsyms="$ks" --stdio --no-children --sort dso -g none 2>/dev/null | awk '
		/^ *[0-9.]+%/ { p = $1; sub(/%/, "", p); d = $2; v[d] += p; t += p }
		END { for (d in v) printf "  %6.2f%%  %s\n", 100 * v[d] / t, d }' | sort -rn | head -n 8
	[ "$cg" = 1 ] || continue
	# Call chains: one block per sample, the leaf first.
	perf script -i "$out" --kallsyms="$ks" -F ip,sym,dso 2>/dev/null > /tmp/perf.$side.chains
	echo "$side: samples spinning on a contended spinlock (leaf queued_spin_lock_slowpath), by the first two callers outside the lock code:"
	awk '
		function flush() {
			if (nf && leaf ~ /queued_spin_lock_slowpath/) {
				tot++; who = "(chain ends in the lock code)"
				for (i = 2; i <= nf; i++)
					if (fr[i] !~ /^(_raw_spin_lock|queued_spin_lock|do_raw_spin_lock|native_queued)/) { who = fr[i] " <- " fr[i + 1]; break }
				by[who]++
			}
			nf = 0
		}
		/^[[:space:]]*$/ { flush(); next }
		{ nf++; s = $2; sub(/\+0x[0-9a-f]+$/, "", s); fr[nf] = s; if (nf == 1) leaf = s }
		END { flush(); printf "  %d samples\n", tot; for (k in by) printf "  %6d  %s\n", by[k], k }' /tmp/perf.$side.chains | sort -k1,1rn | head -n 12
	echo "$side: samples in the mutex code (leaf mutex_spin_on_owner, osq_lock, mutex_lock*, __mutex_*), by the first caller outside it:"
	awk '
		function flush() {
			if (nf && leaf ~ /^(mutex_spin_on_owner|osq_lock|__mutex_lock|mutex_lock|__mutex_|mutex_optimistic_spin)/) {
				tot++; who = "(chain ends in the mutex code)"
				for (i = 2; i <= nf; i++)
					if (fr[i] !~ /^(mutex_spin_on_owner|osq_lock|__mutex|mutex_lock|mutex_optimistic_spin)/) { who = fr[i] " " dso[i]; break }
				by[leaf " <- " who]++
			}
			nf = 0
		}
		/^[[:space:]]*$/ { flush(); next }
		{ nf++; s = $2; sub(/\+0x[0-9a-f]+$/, "", s); fr[nf] = s; dso[nf] = $NF; if (nf == 1) leaf = s }
		END { flush(); printf "  %d samples\n", tot; for (k in by) printf "  %6d  %s\n", by[k], k }' /tmp/perf.$side.chains | sort -k1,1rn | head -n 15
	# PROFILE_CALLERS=SYM: the samples in SYM (the leaf) by their first
	# four callers, to find whose work a shared kernel function is.
	if [ -n "${PROFILE_CALLERS:-}" ]; then
		echo "$side: samples in ${PROFILE_CALLERS} by their first four callers:"
		awk -v want="$PROFILE_CALLERS" '
			function flush() {
				if (nf && leaf == want) {
					tot++; who = ""
					for (i = 2; i <= nf && i <= 5; i++) who = who (i > 2 ? " <- " : "") fr[i]
					by[who]++
				}
				nf = 0
			}
			/^[[:space:]]*$/ { flush(); next }
			{ nf++; s = $2; sub(/\+0x[0-9a-f]+$/, "", s); fr[nf] = s; if (nf == 1) leaf = s }
			END { flush(); printf "  %d samples\n", tot; for (k in by) printf "  %6d  %s\n", by[k], k }' /tmp/perf.$side.chains | sort -k1,1rn | head -n 12
	fi
	if [ "$bytes" = free ]; then
		echo "$side: symbols by inclusive share of the busy samples (itself and what it calls), and us of CPU per free:"
		perf report -q -i "$out" --kallsyms="$ks" --stdio --children --sort sym -g none 2>/dev/null | awk -v top="$top" -v n="$n" -v cput="$wall" -v cpus="$cpus" '
			/^ *[0-9.]+%/ {
				sym = $0; sub(/^ *[0-9.]+% +[0-9.]+% +/, "", sym)
				if (sym ~ /'"$idle_re"'|ret_from_fork|kthread|cpu_startup_entry|do_idle|ap_starting|start_secondary|common_startup|x86_64_start|start_kernel|rest_init/) next
				if (++k > top) exit
				c = $1; sub(/%/, "", c); printf "  %6s  %7.1f us  %s\n", $1, c / 100 * cput * cpus / n * 1e6, sym
			}'
	fi
done
[ "$bytes" = free ] || exit 0
echo "GPU frees timed without perf: 10 rounds of 30 frees per side, the sides in a rotating order (median of each round's 30):"
sides=(peermem nvidia-peermem floor)
for r in 0 1 2 3 4 5 6 7 8 9; do
	for k in 0 1 2; do
		side=${sides[(r + k) % 3]}
		"$bench" --profile "$side" free 30 --large "$large" | sed -n "s/^profile \([a-z-]*\) free: .*median \([0-9.]*\) ms.*/round $r \1 \2/p"
	done
done | awk '{ print "  " $0; v[$3] = v[$3] " " $4; m[$2, $3] = $4; if ($2 + 1 > nr) nr = $2 + 1 }
	END {
		for (r = 0; r < nr; r++)
			if (m[r, "nvidia-peermem"] > 0) { k++; q[k] = m[r, "peermem"] / m[r, "nvidia-peermem"]; qs = qs sprintf(" %.2f", q[k]) }
		for (i = 2; i <= k; i++)
			for (j = i; j > 1 && q[j - 1] > q[j]; j--) { t = q[j]; q[j] = q[j - 1]; q[j - 1] = t }
		if (k) printf "  peermem / nvidia-peermem per round:%s; median %.3f\n", qs, k % 2 ? q[(k + 1) / 2] : (q[k / 2] + q[k / 2 + 1]) / 2
		for (s in v) {
			n = split(v[s], a, " ")
			for (i = 2; i <= n; i++)	# insertion sort (mawk has no asort)
				for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
			printf "  %s: median of the round medians %.3f ms (rounds:%s)\n", s, n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2, v[s]
		}
	}'
