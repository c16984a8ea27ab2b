#!/usr/bin/env bash
# The one test command: from a fresh clone on Debian 12, set up the host, build
# the rig kernel, the module and the test programs, run every host test and
# every guest test (in the rig VM), and end with one line
# `N passed, M failed, K skipped`.
#
#   tests/run-all.sh [--only AREA]... [--skip-setup] [--kdir DIR] [-v]
#
#   --only AREA   run only the tests of AREA: a directory name under
#                 tests/host/ or tests/guest/, or `vm` for the runner's own
#                 guest self-tests (repeatable; builds always run)
#   --skip-setup  do not run scripts/setup-host.sh (the host is ready)
#   --kdir DIR    use this built kernel tree instead of scripts/kernel.sh
#   -v            stream the guest console (scripts/vm.sh -v)
#
# PEERMEM_RM_LOCK_RUN=1 also runs the peermem and e2e areas with gpusim's RM
# lock (GPUSIM_RM_LOCK=1, docs/gpusim.md), in a second VM boot.
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

only=() skip_setup=0 kdir= verbose=()
while [ $# -gt 0 ]; do
	case "$1" in
	--only) [ -n "${2:-}" ] || pm_die "--only needs an area name"; only+=("$2"); shift 2 ;;
	--skip-setup) skip_setup=1; shift ;;
	--kdir) [ -n "${2:-}" ] || pm_die "--kdir needs a directory"; kdir=$2; shift 2 ;;
	-v|--verbose) verbose=(-v); shift ;;
	-h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) pm_die "unknown argument '$1'; usage: tests/run-all.sh [--only AREA]... [--skip-setup] [--kdir DIR] [-v]" ;;
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
	if scripts/setup-host.sh; then result ok "host setup"; else result fail "host setup (scripts/setup-host.sh)"; fi
fi

if [ -z "$kdir" ]; then
	pm_stage "run-all: rig kernel (scripts/kernel.sh --variant debug)"
	if kdir=$(scripts/kernel.sh --variant debug | tail -n 1) && [ -d "$kdir" ]; then
		result ok "rig kernel built ($kdir)"
	else
		result fail "rig kernel build (scripts/kernel.sh --variant debug)"; kdir=
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
	area=$(basename "$(dirname "$t")")
	wanted "$area" || continue
	pm_stage "run-all: host tests: $area"
	KDIR=$kdir run_tap "host/$area" bash "$t"
done

# --- guest tests, one VM boot ------------------------------------------------
gtests=()
if wanted vm; then for t in tests/vm/t_*; do [ -f "$t" ] && [ -x "$t" ] && gtests+=("$t"); done; fi
for d in tests/guest/*/; do
	[ -d "$d" ] || continue
	wanted "$(basename "$d")" || continue
	for t in "$d"t_*; do [ -f "$t" ] && [ -x "$t" ] && gtests+=("$t"); done
done
if [ ${#gtests[@]} -gt 0 ]; then
	pm_stage "run-all: guest tests (${#gtests[@]} in one VM boot)"
	if [ -n "$kdir" ]; then
		run_tap "guest tests (scripts/vm.sh)" scripts/vm.sh --kdir "$kdir" "${verbose[@]}" -- "${gtests[@]}"
	else
		result fail "guest tests not run: no rig kernel"
	fi
fi

# --- peermem and e2e again with gpusim's RM lock ----------------------------
# gpusim's RM lock (docs/gpusim.md, "The resource manager's lock") is off by
# default in these areas: with it lockdep reports the core's umem mapping lock
# (held across the client's dma_map, so across nvidia_p2p_dma_map_pages, and
# taken by invalidate from the free callback: a cycle with every invalidating
# client, nvidia-peermem included, as in OFED), and t_peermem_free's
# register-versus-free race deadlocks (docs/module.md, "Locking"). peermem's
# registration mutex is out of it (tests/host/rmlock); a free callback waits
# for its Mapping phase, its share of the core's cycle. PEERMEM_RM_LOCK_RUN=1 runs the
# areas once more with it (one more VM boot; expect that report).
if [ "${PEERMEM_RM_LOCK_RUN:-0}" = 1 ]; then
	rtests=()
	for a in peermem e2e; do
		wanted "$a" || continue
		for t in tests/guest/$a/t_*; do [ -f "$t" ] && [ -x "$t" ] && rtests+=("$t"); done
	done
	if [ ${#rtests[@]} -gt 0 ]; then
		pm_stage "run-all: peermem and e2e with gpusim's RM lock (${#rtests[@]} in one VM boot)"
		if [ -n "$kdir" ]; then
			run_tap "guest tests with GPUSIM_RM_LOCK=1 (scripts/vm.sh)" \
				scripts/vm.sh --kdir "$kdir" "${verbose[@]}" --env GPUSIM_RM_LOCK=1 -- "${rtests[@]}"
		else
			result fail "guest tests with GPUSIM_RM_LOCK=1 not run: no rig kernel"
		fi
	fi
fi

pm_stage "run-all: finished"
echo "$npass passed, $nfail failed, $nskip skipped"
[ "$nfail" = 0 ]
exit
}
