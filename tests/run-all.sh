#!/usr/bin/env bash
# The one test command: from a fresh clone on Debian 12, set up the host, build
# the rig kernel, the module and the test programs, run every host test and
# every guest test (in the rig VM), and end with one line
# `N passed, M failed, K skipped`.
#
#   tests/run-all.sh [--only AREA]... [--skip-setup] [--kdir DIR] [--variant V | --kcsan] [-v]
#
#   --only AREA   run only the tests of AREA: a directory name under
#                 tests/host/ or tests/guest/, or `vm` for the runner's own
#                 guest self-tests (repeatable; builds always run)
#   --skip-setup  do not run scripts/setup-host.sh (the host is ready)
#   --kdir DIR    use this built kernel tree instead of scripts/kernel.sh
#   --variant V   build and use kernel variant V (scripts/kernel.sh --variant:
#                 debug, the default and CI's, plain, or a tests/rig/
#                 variant-V.config); other variants are run on request and
#                 their results recorded in docs/testing.md, never by CI
#   --kcsan       the data-race run (issue 24): the kcsan variant (KCSAN and
#                 lockdep, no KASAN: tests/rig/variant-kcsan.config), and in
#                 it only the programs that race (the race matrix, the short
#                 soak, the event-channel races, the e2e area), no host tests,
#                 no 550 rerun; with --only, those of the named areas
#   -v            stream the guest console (scripts/vm.sh -v)
#
# gpusim holds its emulated RM lock by default (rm_lock=1, as NVIDIA's
# driver; docs/gpusim.md). PEERMEM_RM_LOCK_RUN=1 runs the peermem and e2e
# areas once more with GPUSIM_RM_LOCK=1 forced, in a VM boot of their own.
# PEERMEM_VM_SLOTS=N runs the guest suite's VM boots N at a time (default 2).
# PEERMEM_MATRIX_FULL=1 runs the whole race matrix (default: a quarter of
# its cells, every cause and every phase; t_peermem_matrix's MATRIX_SHARE).
# The peermem and e2e areas run twice: against gpusim's default NVIDIA branch
# (595) and against 550 (PEERMEM_OLD_BRANCH; none skips that).
#
# Every test prints TAP; every `ok`/`not ok` line is counted, `ok ... # SKIP`
# as skipped. Each build step is one result too, so a broken build is a
# failure, not a silent gap. Exit status 0 only if nothing failed.
set -uo pipefail
# Read whole before running (the braces below): a script edited while it
# runs, or waits for a lock, must not change under the running shell.
{
. "$(dirname "$0")/../scripts/lib.sh"
cd "$PEERMEM_ROOT" || exit 1

only=() skip_setup=0 kdir= verbose=() variant=debug kcsan=0
while [ $# -gt 0 ]; do
	case "$1" in
	--only) pm_need_value 'tests/run-all.sh [--only AREA]... [--skip-setup] [--kdir DIR] [--variant V | --kcsan] [-v] [--help]' "$@"; only+=("$2"); shift 2 ;;
	--skip-setup) skip_setup=1; shift ;;
	--kdir) pm_need_value 'tests/run-all.sh [--only AREA]... [--skip-setup] [--kdir DIR] [--variant V | --kcsan] [-v] [--help]' "$@"; kdir=$2; shift 2 ;;
	--variant) pm_need_value 'tests/run-all.sh [--only AREA]... [--skip-setup] [--kdir DIR] [--variant V | --kcsan] [-v] [--help]' "$@"; variant=$2; shift 2 ;;
	--kcsan) kcsan=1 variant=kcsan; shift ;;
	-v|--verbose) verbose=(-v); shift ;;
	-h|--help) printf 'usage: tests/run-all.sh [--only AREA]... [--skip-setup] [--kdir DIR] [--variant V | --kcsan] [-v]\n\n'; sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) pm_usage_die "unknown argument '$1'" 'tests/run-all.sh [--only AREA]... [--skip-setup] [--kdir DIR] [--variant V | --kcsan] [-v] [--help]' ;;
	esac
done
wanted() { # wanted AREA: is this area selected?
	[ ${#only[@]} -eq 0 ] && return 0
	local a; for a in "${only[@]}"; do [ "$a" = "$1" ] && return 0; done; return 1
}
if [ ${#only[@]} -gt 0 ]; then
	for a in "${only[@]}"; do
		[ "$a" = vm ] || [ -d "tests/host/$a" ] || [ -d "tests/guest/$a" ] ||
			pm_die "--only $a: no tests/host/$a or tests/guest/$a (areas: vm $(cd tests && ls -d host/*/ guest/*/ 2>/dev/null | xargs -rn1 basename | sort -u | tr '\n' ' '))"
	done
fi

logs=$PEERMEM_CACHE/logs/run-all
mkdir -p "$logs" || pm_die "cannot create $logs"
npass=0 nfail=0 nskip=0
count() { # count FILE: add its TAP results to the totals
	local p f s
	p=$(grep -cE '^ok\b' "$1"); f=$(grep -cE '^not ok\b' "$1")
	s=$(grep -E '^ok\b' "$1" | grep -ciE '#[[:space:]]*skip')
	npass=$((npass + p - s)); nfail=$((nfail + f)); nskip=$((nskip + s))
}
result() { # result ok|fail DESCRIPTION: one result of our own
	if [ "$1" = ok ]; then echo "ok - $2"; npass=$((npass + 1)); else echo "not ok - $2"; nfail=$((nfail + 1)); fi
}
# run_step DESCRIPTION LOG CMD...: run a build step quietly, one result for it.
run_step() {
	local desc=$1 log=$2; shift 2
	if "$@" >"$log" 2>&1; then result ok "$desc"; return 0; fi
	result fail "$desc (log: $log)"
	grep -E -m 15 '(error|Error|ERROR)' "$log" | sed 's/^/#   /'
	tail -n 15 "$log" | sed 's/^/#   | /'
	return 1
}
# run_tap DESCRIPTION CMD...: run something that prints TAP, show and count it.
run_tap() {
	local desc=$1 out rc; shift
	out=$(mktemp); echo "# $desc"
	"$@" 2>&1 | tee "$out"; rc=${PIPESTATUS[0]}
	count "$out"
	if [ "$rc" != 0 ] && ! grep -qE '^not ok\b' "$out"; then result fail "$desc exited with status $rc"; fi
	if ! grep -qE '^(not )?ok\b' "$out"; then result fail "$desc printed no TAP result"; fi
	rm -f "$out"
}

# --- setup and builds ------------------------------------------------------
if [ "$skip_setup" = 0 ]; then
	pm_stage "run-all: host setup (scripts/setup-host.sh)"
	if scripts/setup-host.sh; then result ok "host setup"
	else
		# Everything after needs the host it sets up (and a refused host,
		# not Debian 12, is not to be built on): stop here.
		result fail "host setup (scripts/setup-host.sh); nothing else run"
		echo "$npass passed, $nfail failed, $nskip skipped"
		exit 1
	fi
fi

if [ -z "$kdir" ]; then
	pm_stage "run-all: rig kernel (scripts/kernel.sh --variant $variant)"
	if kdir=$(scripts/kernel.sh --variant "$variant" | tail -n 1) && [ -d "$kdir" ]; then
		result ok "rig kernel built ($kdir)"
	else
		result fail "rig kernel build (scripts/kernel.sh --variant $variant)"; kdir=
	fi
else
	[ -f "$kdir/arch/x86/boot/bzImage" ] || pm_die "--kdir $kdir has no arch/x86/boot/bzImage; build it first"
fi

if [ -n "$kdir" ]; then
	# Module builds must use the compiler the kernel was built with.
	margs=(KDIR="$kdir")
	if [ -f "$kdir/.peermem-make-args" ]; then read -ra extra < "$kdir/.peermem-make-args"; margs+=("${extra[@]}"); fi
	# gpusim first: the module links against its nvidia_p2p_* exports.
	dirs=()
	[ -f tests/gpusim/Makefile ] && dirs+=(tests/gpusim)
	dirs+=(.)
	for mf in tests/*/Makefile tests/guest/*/Makefile; do
		[ -f "$mf" ] || continue
		d=${mf%/Makefile}
		[ "$d" = tests/gpusim ] || dirs+=("$d")
	done
	for d in "${dirs[@]}"; do
		name=${d#./}; [ "$d" = . ] && name="peermem module"
		pm_stage "run-all: build $name"
		if [ ! -f "$d/Makefile" ]; then result fail "build $name: no $d/Makefile"; continue; fi
		run_step "build $name" "$logs/build-$(echo "$name" | tr ' /' '--').log" make -C "$d" -j3 "${margs[@]}"
		# The drop-in variant too (module nvidia_peermem, in dropin/), beside
		# ./peermem.ko: tests/guest/module/t_probes loads both.
		if [ "$d" = . ]; then
			pm_stage "run-all: build peermem module as the nvidia-peermem drop-in"
			run_step "build peermem module as the nvidia-peermem drop-in (make dropin: dropin/nvidia_peermem.ko)" \
				"$logs/build-peermem-dropin.log" make -C . -j3 "${margs[@]}" dropin
		fi
	done
fi

# --- host tests --------------------------------------------------------------
for t in tests/host/*/run.sh; do
	[ -f "$t" ] || continue
	[ "$kcsan" = 0 ] || continue
	area=$(basename "$(dirname "$t")")
	wanted "$area" || continue
	pm_stage "run-all: host tests: $area"
	KDIR=$kdir run_tap "host/$area" bash "$t"
done

# --- guest tests: VM jobs on parallel slots ----------------------------------
# The guest suite runs as a few VM jobs (each one boot of scripts/vm.sh) on
# PEERMEM_VM_SLOTS slots at once (default 2). A rig guest keeps about half of
# a 2-core machine busy (it waits on RCU, timers, rxe's tasklets), so two
# boots side by side finish the suite sooner; test limits follow each guest's
# measured slowdown (tests/vm/guest-init.sh). The tests are dealt to the
# slots longest first by their last recorded time ($PEERMEM_CACHE/logs/
# vm-test-times.tsv, written by scripts/vm.sh; 20 s for a test never timed).
# A job's TAP is printed whole when the job ends, in job order.
gtests=()
# --kcsan: the programs that race, and nothing else (see the header).
kcsan_programs=(tests/guest/pfnmap/t_peermem_matrix* tests/guest/soak/t_soak_short
	tests/guest/peermem/t_peermem_events tests/guest/peermem/t_peermem_evfiles
	tests/guest/peermem/t_peermem_rmrace tests/guest/peermem/t_peermem_wcache tests/guest/e2e/t_*)
kcsan_program() { local p; for p in "${kcsan_programs[@]}"; do [[ $1 == $p ]] && return 0; done; return 1; }
if [ "$kcsan" = 0 ] && wanted vm; then
	for t in tests/vm/t_*; do
		[ -f "$t" ] && [ -x "$t" ] || continue
		# t_env also checks scripts/vm.sh's TEST@NAME=VALUE (its header).
		[ "$t" = tests/vm/t_env ] && t+=@PEERMEM_T_ENV=per-test@PEERMEM_T_ENV2=a,b:c/d
		gtests+=("$t")
	done
fi
for d in tests/guest/*/; do
	[ -d "$d" ] || continue
	wanted "$(basename "$d")" || continue
	for t in "$d"t_*; do
		[ -f "$t" ] && [ -x "$t" ] || continue
		[ "$kcsan" = 0 ] || kcsan_program "$t" || continue
		# The race matrix: a quarter of its cells (every cause, every
		# phase; the whole is about 6 minutes of an idle rig, CI's budget
		# cannot take it) unless PEERMEM_MATRIX_FULL=1 or --kcsan.
		if [[ ${t##*/} == t_peermem_matrix* ]] && [ "$kcsan" = 0 ] && [ "${PEERMEM_MATRIX_FULL:-0}" != 1 ]; then
			t+=@MATRIX_SHARE=4
		fi
		gtests+=("$t")
	done
done
slots=${PEERMEM_VM_SLOTS:-2}
[[ $slots =~ ^[1-8]$ ]] || pm_die "PEERMEM_VM_SLOTS=$slots: want 1 to 8"
# Times measured here win; tests/vm/test-times.tsv (committed, measured in
# the rig on 2026-11-26) stands in on a machine that has run none.
# Read once: the newest line of a label counts.
declare -A secs=()
while IFS=$'\t' read -r l t _; do
	[[ $l == \#* || ! $t =~ ^[0-9]+$ ]] || secs[$l]=$t
done < <(cat tests/vm/test-times.tsv "$PEERMEM_CACHE/logs/vm-test-times.tsv" 2>/dev/null)
est() { # est TEST: its last recorded time in seconds (20 if none)
	local l=${1#tests/}; l=${l%%/}
	echo "${secs[$l]:-20}"
}
# programs AREA...: the guest programs of the selected AREAs.
programs() {
	local a t
	for a in "$@"; do
		wanted "$a" || continue
		for t in tests/guest/$a/t_*; do [ -f "$t" ] && [ -x "$t" ] && echo "$t"; done
	done
}
# Each job: "SLOT|DESCRIPTION|ENV (space-separated)|TESTS (space-separated)".
# The extra jobs (fixed sets of tests with an environment of their own) are
# placed first, each on the lightest slot; then the suite's tests are dealt,
# longest first, to the lightest slot, one suite job per slot.
jobs=() extra=() load=()
for ((i = 0; i < slots; i++)); do load[i]=0; done
lightest() { local i b=0; for ((i = 1; i < slots; i++)); do [ "${load[i]}" -lt "${load[b]}" ] && b=$i; done; echo "$b"; }
weigh() { local t sum=40; for t in "$@"; do sum=$((sum + $(est "$t"))); done; echo "$sum"; } # 40: a boot
# extra_job DESC ENV TESTS...
extra_job() { local desc=$1 env=$2; shift 2; extra+=("$desc"'|'"$env"'|'"$*"); }

# gpusim emulates the newest NVIDIA branch by default (595: page tables of
# layout 2.0); the peermem and e2e programs that pin, map and free GPU
# memory run once more against 550 (layout 1.2, the older rules;
# docs/gpusim.md, "Driver branches"), so both ABIs are proven on every run.
# The programs that test peermem's own machinery the same way whatever the
# driver's branch (fault injection, hostile input, lifetimes, events, memory
# pressure), and those whose driver calls another 550 program makes the
# same way (t_peermem_mmu: the address watch, its pins as t_peermem_basic's,
# its GPU free as t_peermem_free's; t_peermem_dma: dma_map_pages of a 1.2
# table as t_peermem_basic's; t_peermem_noinval: persistent pins as
# t_peermem_nc's; t_peermem_rm_lock: gpusim's RM lock, the same in every
# branch; t_peermem_wcache: the watch-pin cache, its pins and frees as
# t_peermem_basic's and t_peermem_free's; t_peermem_identity: which process
# puts a pin, the same rule in every branch) run against 595 only, to keep CI in its time; with
# PEERMEM_OLD_BRANCH_ALL=1 both areas run whole. PEERMEM_OLD_BRANCH=none
# skips it, another value picks the branch.
old_branch=${PEERMEM_OLD_BRANCH:-550}
[ "$kcsan" = 0 ] || old_branch=none
any_branch='^t_(peermem_(failnth|failnth_load|loadfail|hostile|lifetime|oom|notifier_alloc|rcache|stale|events|evfiles|genpage|rmrace|mmu|dma|noinval|rm_lock|wcache|identity|bar1)|e2e_refclient)$'
if [ "$old_branch" != none ]; then
	[[ $old_branch =~ ^[0-9]+$ ]] || pm_die "PEERMEM_OLD_BRANCH=$old_branch: want a gpusim branch (550, 570, 580, 595) or none"
	btests=()
	while read -r t; do
		[ "${PEERMEM_OLD_BRANCH_ALL:-0}" = 1 ] || ! [[ ${t##*/} =~ $any_branch ]] || continue
		btests+=("$t")
	done < <(programs peermem e2e)
	# Each with gpusim's branch as its own environment (scripts/vm.sh's
	# TEST@NAME=VALUE), dealt to the slots with the rest: no boot of their own.
	for t in "${btests[@]}"; do gtests+=("$t@GPUSIM_ARGS=branch=$old_branch"); done
	# The race matrix's GPU-free row (where the branches differ: 550 returns 0
	# from a put whose free callback is still to come) against it too; the
	# other causes do not meet the driver's put and free rules.
	for m in tests/guest/pfnmap/t_peermem_matrix tests/guest/pfnmap/t_peermem_matrix_nc; do
		if wanted pfnmap && [ -x "$m" ] && [ "${PEERMEM_OLD_BRANCH_ALL:-0}" != 1 ]; then
			gtests+=("$m@GPUSIM_ARGS=branch=$old_branch@MATRIX_ONLY=all,gpu_free")
		elif wanted pfnmap && [ -x "$m" ]; then
			gtests+=("$m@GPUSIM_ARGS=branch=$old_branch")
		fi
	done
fi

# peermem and e2e again with gpusim's RM lock forced on (PEERMEM_RM_LOCK_RUN=1;
# it is gpusim's default anyway; docs/gpusim.md, "The resource manager's
# lock"): one more job.
if [ "${PEERMEM_RM_LOCK_RUN:-0}" = 1 ]; then
	mapfile -t rtests < <(programs peermem e2e)
	[ ${#rtests[@]} -gt 0 ] && extra_job "guest tests with GPUSIM_RM_LOCK=1 (scripts/vm.sh)" "GPUSIM_RM_LOCK=1" "${rtests[@]}"
fi

xslot=()
for ((j = 0; j < ${#extra[@]}; j++)); do
	IFS='|' read -r desc env ts <<<"${extra[j]}"
	read -ra tl <<<"$ts"
	b=$(lightest); xslot[j]=$b; load[b]=$((load[b] + $(weigh "${tl[@]}")))
done
if [ ${#gtests[@]} -gt 0 ]; then
	declare -A part=()
	sorted=$(for t in "${gtests[@]}"; do printf '%s %s\n' "$(est "$t")" "$t"; done | sort -k1,1nr -k2)
	for ((i = 0; i < slots; i++)); do load[i]=$((load[i] + 40)); done
	while read -r w t; do
		b=$(lightest); load[b]=$((load[b] + w)); part[$b]+="$t "
	done <<<"$sorted"
	for ((i = 0; i < slots; i++)); do
		[ -n "${part[$i]:-}" ] || continue
		# Keep each job's tests in the suite's order (area, then name).
		ts=$(tr ' ' '\n' <<<"${part[$i]}" | grep . | sort | tr '\n' ' ')
		jobs+=("$i"'|'"guest tests, part $((i + 1)) of $slots (scripts/vm.sh)"'|''|'"$ts")
	done
fi
for ((j = 0; j < ${#extra[@]}; j++)); do jobs+=("${xslot[j]}"'|'"${extra[j]}"); done
pm_log "run-all: VM slots' estimated loads (s): ${load[*]}"

if [ ${#jobs[@]} -gt 0 ]; then
	if [ -z "$kdir" ]; then
		result fail "guest tests not run: no rig kernel"
	else
		pm_stage "run-all: guest tests (${#gtests[@]} programs; ${#jobs[@]} VM job(s) on $slots slot(s))"
		jdir=$(mktemp -d "$logs/vm-jobs.XXXXXX")
		# The slots share this run's hold on the VM lock: no other run's
		# VM joins them (scripts/vm.sh, PEERMEM_VM_PARALLEL).
		exec 8>>"$PEERMEM_CACHE/vm.lock"
		if ! flock -n 8; then pm_log "run-all: another VM run is going on; waiting for it"; flock 8; fi
		for ((i = 0; i < slots; i++)); do
			(
				for ((j = 0; j < ${#jobs[@]}; j++)); do
					IFS='|' read -r sl desc env ts <<<"${jobs[j]}"
					[ "$sl" = "$i" ] || continue
					eargs=(); for e in $env; do eargs+=(--env "$e"); done
					read -ra tl <<<"$ts"
					pm_log "run-all: slot $((i + 1)): $desc: ${#tl[@]} programs"
					PEERMEM_VM_PARALLEL=1 scripts/vm.sh --kdir "$kdir" "${verbose[@]}" "${eargs[@]}" -- "${tl[@]}" \
						>"$jdir/$j.out" 2>"$jdir/$j.err"
					echo $? >"$jdir/$j.rc"
					pm_log "run-all: slot $((i + 1)): $desc: done (exit $(cat "$jdir/$j.rc"))"
				done
			) &
		done
		wait
		exec 8>&-
		for ((j = 0; j < ${#jobs[@]}; j++)); do
			IFS='|' read -r sl desc env ts <<<"${jobs[j]}"
			echo "# $desc"
			cat "$jdir/$j.out"; sed 's/^/# /' "$jdir/$j.err" | grep -E 'vm: (guest up|booting|FAILED)' || true
			count "$jdir/$j.out"
			rc=$(cat "$jdir/$j.rc" 2>/dev/null || echo '?')
			if [ "$rc" != 0 ] && ! grep -qE '^not ok\b' "$jdir/$j.out"; then result fail "$desc exited with status $rc"; fi
			if ! grep -qE '^(not )?ok\b' "$jdir/$j.out"; then result fail "$desc printed no TAP result"; fi
		done
		rm -rf "$jdir"
	fi
fi

pm_stage "run-all: finished"
echo "$npass passed, $nfail failed, $nskip skipped"
[ "$nfail" = 0 ]
exit
}
