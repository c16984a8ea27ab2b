#!/usr/bin/env bash
# The benchmarks: peermem against NVIDIA's nvidia-peermem (unmodified) and
# against the floor (the same GPU range pinned and DMA-mapped directly
# through nvidia_p2p_get_pages + nvidia_p2p_dma_map_pages by gpusim's test
# client), measured in one run in the rig, alternating round by round
# (tests/bench/bench_peermem); then, in the same boot, PFN-mapped memory:
# an RDMA WRITE straight out of a PFN-mapped ring registered through
# peermem's PFN-map source (pfnmap=1) against a memcpy into a registered
# staging buffer plus the same WRITE (tests/bench/bench_pfnmap, the rig's
# exporter tests/pfnmap). docs/benchmarks.md says what each figure is and
# what the ratios mean and do not mean.
#
#   scripts/bench.sh [options] [ROUNDS]
#
#   --rounds N       rounds (default 20), of both programs; a bare number
#                    means the same
#   --runs N         runs, each in a boot of its own (default 3; 1..10):
#                    their samples pooled in one bench-results.json, the
#                    pin-cost table's pm/nv also given run by run
#   --nvpeermem V    the nvidia-peermem to compare with: 550 (default:
#                    Debian's 550.163.01, its only mode, invalidating),
#                    595 (595.45.04 from NVIDIA's repository, its default
#                    mode, persistent) or 595-legacy (the same with
#                    persistent_api_support=0, invalidating); 595 needs
#                    its source imported (tests/nvpeermem/build.sh
#                    --import-git). Recorded as nv_client
#   --kernel K       plain (default: the rig kernel without KASAN, lockdep,
#                    kmemleak, DMA-API debug) or debug (the test kernel)
#   --kdir DIR       a built rig kernel tree instead of scripts/kernel.sh's
#   --large-mib N    the largest registration (default 512, >= 64)
#   --pfn-mib N      the PFN-mapped ring's transfer size (default 16, 1..64)
#   --mem SIZE       guest memory (default 3G: the large size, pinned 4
#                    times over, and the rest)
#   --src DIR        the peermem checkout to benchmark (default: this one,
#                    its work tree as it is)
#   --out DIR        where bench-results.json, bench-latency.png and
#                    bench-pfnmap.png go
#                    (default docs/bench/, docs/bench/debug/ for --kernel debug)
#   --profile MIB[,N[,T]]  instead of the rounds: for each side, N (default
#                    20) registrations of MIB MiB (T=2: by each of 2
#                    threads, MIB must be 2) under a system-wide perf
#                    record in the guest (the host's perf; the rig kernel
#                    has no ftrace), and the symbols that took the CPU
#                    (tests/bench/profile-guest.sh); output on stdout and
#                    in OUT/profile-<MIB>M.txt
#   --profile KIBK[,N]  the same for KIB KiB (a multiple of 64 below 1024:
#                    64K,20000 for 64 KiB), into OUT/profile-<KIB>K.txt.
#                    BENCH_PROF_MISS=1 in the environment: each
#                    registration at a distinct range (a watch-pin cache
#                    miss) instead of the same range again.
#                    PROFILE_CHUNKS=K in the environment: in K passes over
#                    the sides, rotating (a loaded host's drift weighs on
#                    every side alike; tests/bench/report.py profdiff)
#   --profile free[,N]  the same around GPU frees: N (default 20) frees of
#                    4 MiB under 64 live MRs each, perf enabled around
#                    the frees only (OUT/profile-free.txt)
#   --callgraph      with --profile: perf record -g (kernel call chains
#                    through the kernel's ORC unwinder): adds the callers of
#                    the mutex code, and for free the inclusive shares
#   --memory-detail  instead of all figures: only the kernel memory per live
#                    registration, broken down by counter (slab caches,
#                    /proc/meminfo, /proc/vmstat): OUT/memory-detail.md
#                    (tests/bench/report.py memdetail) and the guest's
#                    output OUT/memory-detail-output.txt
#   --only GROUPS    only these figure groups of bench_peermem, comma-
#                    separated: latency, layers, free, munmap, events,
#                    threads, memory, sg (e.g. latency,free for issue 22's
#                    keeper, before and after); no bench_pfnmap, no PFN plot.
#                    pincost: reg+dereg at 64 KiB, 2 MiB, 64 MiB and the
#                    large size under gpusim's pin-cost model, a first
#                    registration of the range and the same range again
#                    apart, and the pins each makes. The models:
#                    BENCH_PIN_COSTS="CALL_US:PAGE_NS,..." (default
#                    45:190,70:190, the published figures of NVIDIA's
#                    pin, docs/benchmarks.md; 0:0 is free pins); recorded
#                    as pin_costs. scaling runs only when named (against
#                    live registrations and open /dev/peermem files,
#                    BENCH_SCALE_N)
#   --append ARGS    extra guest kernel command line (scripts/vm.sh
#                    --append), for experiments; recorded in the results
#   --skip-setup     do not run scripts/setup-host.sh
#
# Sets up the host (scripts/setup-host.sh: also python3-matplotlib for the
# plot), builds the kernel variant if it is missing (scripts/kernel.sh),
# then copies the sources into $PEERMEM_CACHE/bench/<kernel build>/tree
# and builds gpusim, its test client, peermem, nvidia-peermem (tests/
# nvpeermem/build.sh), the PFN-map exporter (tests/pfnmap) and the
# benchmarks there: modules belong to one kernel
# tree, and the copies in the checkout (built for the debug kernel) are
# left alone. Then boots the rig (scripts/vm.sh) and runs the benchmark.
# Prints the table and the goals; writes OUT/bench-results.json (every raw
# sample, the kernel, the commit, the date), OUT/bench-table.md (the tables
# and the goals in Markdown), OUT/bench-latency.png and OUT/bench-pfnmap.png.
# Exits non-zero only if something failed to build or an operation failed
# (never because of a figure).
set -euo pipefail
# Read whole before running (the braces below): a script edited while it
# runs, or waits for a lock, must not change under the running shell.
{
. "$(dirname "$0")/lib.sh"
cd "$PEERMEM_ROOT"

usage() { pm_help "$0" '^set -euo'; }
bad() { pm_usage_die "$*" 'scripts/bench.sh [--rounds N] [--runs N] [--nvpeermem 550|595|595-legacy] [--kernel plain|debug] [--kdir DIR] [--large-mib N] [--pfn-mib N] [--mem SIZE] [--src DIR] [--out DIR] [--only GROUPS] [--append ARGS] [--profile SPEC] [--memory-detail] [--callgraph] [--skip-setup] (--help)'; }
rounds=20 runs=3 nvpeermem=550 kernel=plain kdir= large_mib=512 pfn_mib=16 mem=3G src=$PEERMEM_ROOT out= skip_setup=0 append= profile= memdetail=0 callgraph=0 only=
need() { [ $# -ge 2 ] && [ -n "$2" ] && [[ $2 != --* ]] || bad "option $1 needs a value"; }
while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) need "$@"; rounds=$2; shift 2 ;;
	--runs) need "$@"; runs=$2; shift 2 ;;
	--nvpeermem) need "$@"; nvpeermem=$2; shift 2 ;;
	--kernel) need "$@"; kernel=$2; shift 2 ;;
	--kdir) need "$@"; kdir=$2; shift 2 ;;
	--large-mib) need "$@"; large_mib=$2; shift 2 ;;
	--pfn-mib) need "$@"; pfn_mib=$2; shift 2 ;;
	--mem) need "$@"; mem=$2; shift 2 ;;
	--src) need "$@"; src=$2; shift 2 ;;
	--out) need "$@"; out=$2; shift 2 ;;
	--append) need "$@"; append+=" $2"; shift 2 ;;
	--only) need "$@"; only=$2; shift 2 ;;
	--profile) need "$@"; profile=$2; shift 2 ;;
	--memory-detail) memdetail=1; shift ;;
	--callgraph) callgraph=1; shift ;;
	--skip-setup) skip_setup=1; shift ;;
	-h|--help) usage; exit 0 ;;
	[0-9]*) rounds=$1; shift ;;
	*) bad "unknown argument '$1'" ;;
	esac
done
[[ $rounds =~ ^[0-9]+$ ]] && [ "$rounds" -ge 1 ] && [ "$rounds" -le 1000 ] || bad "--rounds wants 1..1000, got '$rounds'"
[[ $runs =~ ^[0-9]+$ ]] && [ "$runs" -ge 1 ] && [ "$runs" -le 10 ] || bad "--runs wants 1..10, got '$runs'"
case "$nvpeermem" in 550|595|595-legacy) ;; *) bad "--nvpeermem wants 550, 595 or 595-legacy, got '$nvpeermem'" ;; esac
pin_costs=${BENCH_PIN_COSTS:-45:190,70:190}
[[ $pin_costs =~ ^[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*$ ]] || bad "BENCH_PIN_COSTS wants CALL_US:PAGE_NS,..., got '$pin_costs'"
[[ $large_mib =~ ^[0-9]+$ ]] && [ "$large_mib" -ge 64 ] && [ $((large_mib % 2)) = 0 ] ||
	bad "--large-mib wants an even number of MiB, at least 64, got '$large_mib'"
[[ $pfn_mib =~ ^[0-9]+$ ]] && [ "$pfn_mib" -ge 1 ] && [ "$pfn_mib" -le 64 ] ||
	bad "--pfn-mib wants 1..64 (MiB), got '$pfn_mib'"
[ -z "$profile" ] || [ "$memdetail" = 0 ] || bad "--profile and --memory-detail are two different runs: pick one"
[ -z "$only" ] || [[ $only =~ ^(latency|layers|free|munmap|events|threads|memory|sg|pincost|scaling)(,(latency|layers|free|munmap|events|threads|memory|sg|pincost|scaling))*$ ]] ||
	bad "--only wants figure groups, comma-separated (latency, layers, free, munmap, events, threads, memory, sg; pincost, scaling: only when named), got '$only'"
case "$kernel" in plain|debug) ;; *) bad "--kernel must be plain or debug, not '$kernel'" ;; esac
if [ -n "$profile" ]; then
	[[ $profile =~ ^(free|[0-9]+K?)(,([0-9]+)(,([12]))?)?$ ]] && [ "${BASH_REMATCH[1]}" != 0 ] ||
		bad "--profile wants MIB, MIB,N, 2,N,2, 64K,N or free,N (e.g. 512,8), got '$profile'"
	prof_mib=${BASH_REMATCH[1]} prof_n=${BASH_REMATCH[3]:-20} prof_t=${BASH_REMATCH[5]:-1}
	# KIB K (a multiple of 64): a registration below 1 MiB (64K: 64 KiB).
	prof_kib=
	if [[ $prof_mib == *K ]]; then
		prof_kib=${prof_mib%K}
		[ "$prof_kib" -gt 0 ] && [ $((prof_kib % 64)) = 0 ] && [ "$prof_kib" -lt 1024 ] ||
			bad "--profile KIB K wants a multiple of 64 below 1024 (64K), got '$profile'"
		prof_mib=1
	fi
	[ "$prof_t" = 1 ] || [ "$prof_mib" = 2 ] || bad "--profile MIB,N,2 (2 threads) wants MIB 2, got '$profile'"
	[ "$prof_mib" = free ] || [ "$prof_mib" -le "$large_mib" ] || large_mib=$(( (prof_mib + 1) / 2 * 2 ))
fi
[ -d "$src" ] && [ -f "$src/Kbuild" ] && [ -f "$src/tests/bench/bench_peermem.c" ] ||
	bad "--src '$src' is not a peermem checkout"
src=$(cd "$src" && pwd)
if [ -z "$out" ]; then
	out=$PEERMEM_ROOT/docs/bench
	[ "$kernel" = debug ] && out=$out/debug
fi
mkdir -p "$out" || pm_die "cannot create $out"
out=$(cd "$out" && pwd)

# --- host and kernel ------------------------------------------------------
if [ "$skip_setup" = 0 ]; then
	pm_stage "bench: host setup (scripts/setup-host.sh)"
	scripts/setup-host.sh
fi
if [ -z "$kdir" ]; then
	pm_stage "bench: rig kernel ($kernel)"
	kdir=$(scripts/kernel.sh --variant "$kernel" --print-kdir 2>/dev/null) ||
		kdir=$(scripts/kernel.sh --variant "$kernel" | tail -n 1)
fi
[ -f "$kdir/arch/x86/boot/bzImage" ] && [ -f "$kdir/Module.symvers" ] ||
	pm_die "no built kernel in '$kdir' (bzImage, Module.symvers); build it with scripts/kernel.sh --variant $kernel"
kdir=$(cd "$kdir" && pwd -P)
if grep -q '^CONFIG_KASAN=y' "$kdir/.config"; then kvariant=debug; else kvariant=plain; fi
# nvidia-peermem's side takes gpusim's RM lock as peermem's does (NVIDIA's
# driver takes it for every client) on the plain kernel; on the debug one
# lockdep reports nvidia-peermem's mapping-lock/RM cycle, so not there.
if [ -z "${BENCH_NV_RM_LOCK:-}" ]; then
	if [ "$kvariant" = plain ]; then BENCH_NV_RM_LOCK=1; else BENCH_NV_RM_LOCK=0; fi
fi
[ "${BENCH_NV_RM_LOCK:-0}" != 1 ] || [ "$kvariant" = plain ] ||
	pm_die "BENCH_NV_RM_LOCK=1 needs the plain kernel: on the debug one lockdep reports nvidia-peermem's mapping-lock/RM cycle"
[ "$kvariant" = "$kernel" ] || pm_log "bench: note: --kdir $kdir is a $kvariant kernel (--kernel $kernel); recording it as $kvariant"
margs=(KDIR="$kdir")
if [ -f "$kdir/.peermem-make-args" ]; then read -ra extra < "$kdir/.peermem-make-args"; margs+=("${extra[@]}"); fi
llvm=$(sed -n 's/^LLVM=//p' "$kdir/.peermem-make-args" 2>/dev/null); llvm=${llvm:--19}

# --- sources and builds, per kernel tree ----------------------------------
work=$PEERMEM_CACHE/bench/$(basename "$kdir")
tree=$work/tree
logs=$work/logs
mkdir -p "$tree" "$logs" || pm_die "cannot create $work"
pm_stage "bench: copy $src into $tree"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
	commit=$(git -C "$src" rev-parse HEAD)
	dirty=$(git -C "$src" status --porcelain --untracked-files=no | wc -l)
	# The tree keeps its objects from run to run (only what changed is
	# rebuilt), but a source the checkout no longer has must go, or it
	# breaks the build (a stale rust/client.rs beside rust/client/): the
	# files of the last copy are listed, and those not in this one removed.
	# Without that list (an older tree), start the tree afresh.
	manifest=$work/sources.list
	(cd "$src" && git ls-files -z -co --exclude-standard) | sort -z > "$manifest.new" ||
		pm_die "cannot list the sources of $src"
	if [ -f "$manifest" ]; then
		comm -z -23 "$manifest" "$manifest.new" | (cd "$tree" && xargs -0r rm -f --) ||
			pm_die "cannot remove from $tree the sources $src no longer has"
	else
		rm -rf "$tree" && mkdir -p "$tree" || pm_die "cannot empty $tree"
	fi
	# By content, and without the checkout's times: a file whose content
	# changed gets the time of the copy, so make rebuilds what depends on
	# it. With the checkout's times (rsync -a), benchmarking one checkout
	# after another (--src) left the first one's peermem.ko in place
	# whenever the second's sources were older than that build: the
	# keeper's first "after" run measured the module from before it.
	rsync -a --no-times --checksum --from0 --files-from="$manifest.new" --ignore-missing-args "$src/" "$tree/" ||
		pm_die "cannot copy the sources of $src into $tree"
	mv "$manifest.new" "$manifest"
else
	commit=unknown dirty=unknown
	rsync -a --delete --exclude '*.o' --exclude '*.ko' --exclude '.*.cmd' "$src/" "$tree/" ||
		pm_die "cannot copy $src into $tree"
fi
build() { # build NAME CMD...: one build step, its log kept
	local name=$1 log=$logs/build-${1// /-}.log; shift
	pm_stage "bench: build $name"
	if ! "$@" >"$log" 2>&1; then
		tail -n 20 "$log" >&2
		pm_die "building $name for $kdir failed (full log: $log)"
	fi
}
build gpusim make -C "$tree/tests/gpusim" -j3 "${margs[@]}"
build peermem make -C "$tree" -j3 "${margs[@]}"
# BENCH_PM_CALIBRATION=aa|onepin: nvidia-peermem itself, built under the
# name peermem (aa), or with its probe pin compiled out (onepin), in
# peermem's turn (tests/nvpeermem/build.sh --calibration; docs/history.md,
# "Code footprint under TCG, and a calibration").
calib=
case ${BENCH_PM_CALIBRATION:-} in
'') ;;
aa|onepin) calib=$work/calibration ;;
*) pm_die "BENCH_PM_CALIBRATION=$BENCH_PM_CALIBRATION: aa or onepin" ;;
esac
build nvidia-peermem "$tree/tests/nvpeermem/build.sh" --kdir "$kdir" --llvm "$llvm" ${calib:+--calibration "$calib"}
build pfnmap-exporter make -C "$tree/tests/pfnmap" "${margs[@]}"
build benchmark make -C "$tree/tests/bench"
for f in tests/gpusim/gpusim.ko tests/gpusim/testclient/gpusim_testclient.ko peermem.ko \
	tests/nvpeermem/nvidia-peermem.ko tests/pfnmap/pfnmap_exporter.ko \
	tests/bench/bench_peermem tests/bench/bench_pfnmap tests/bench/profile-guest.sh; do
	[ -f "$tree/$f" ] || pm_die "the builds left no $tree/$f"
done

vmargs=(--kdir "$kdir" --mem "$mem" --no-kmemleak --test-timeout 7200)
# BENCH_SMP=N: the guest's vCPUs (default 2), an experiment (issue 26: the
# second vCPU's work against the first on a loaded host); recorded in the
# results (guest_smp).
[ -n "${BENCH_SMP:-}" ] && vmargs+=(--smp "$BENCH_SMP")
[ -n "$append" ] && vmargs+=(--append "${append# }")
mods="GPUSIM_KO=$tree/tests/gpusim/gpusim.ko"
mods+=" TESTCLIENT_KO=$tree/tests/gpusim/testclient/gpusim_testclient.ko"
# BENCH_PM_KO=FILE: another module in peermem's turn, built with the name
# peermem (the bench loads and unloads the sides by name); what
# BENCH_PM_CALIBRATION uses. The results record the file (bench-results.json,
# "pm_ko"). Not under /tmp: the guest sees the host's / but has a /tmp of
# its own.
[ -n "$calib" ] && BENCH_PM_KO=$calib/$BENCH_PM_CALIBRATION/peermem.ko
pm_ko=${BENCH_PM_KO:-$tree/peermem.ko}
[ -f "$pm_ko" ] || pm_die "BENCH_PM_KO=$pm_ko: no such file"
case "$nvpeermem" in
550) nv_ko=$tree/tests/nvpeermem/nvidia-peermem.ko nv_args= nv_client="nvidia-peermem $(modinfo -F version "$nv_ko" 2>/dev/null || echo 550)" ;;
595*) nv_ko=$tree/tests/nvpeermem/595/nvidia-peermem.ko
	nv_client="nvidia-peermem $(modinfo -F version "$nv_ko" 2>/dev/null || echo 595)"
	if [ "$nvpeermem" = 595 ]; then nv_args= nv_client+=" persistent"; else nv_args=persistent_api_support=0 nv_client+=" legacy"; fi
	[ -f "$nv_ko" ] || pm_die "no $nv_ko: import 595's source first (tests/nvpeermem/build.sh --import-git DIR --tag 595.45.04, DIR a clone of NVIDIA's open-gpu-kernel-modules)" ;;
esac
mods+=" PEERMEM_KO=$pm_ko NVPEERMEM_KO=$nv_ko${nv_args:+ BENCH_NV_ARGS=$nv_args}"
[ -n "${BENCH_PM_KO:-}" ] && mods+=" BENCH_PM_FOREIGN=1"

# --- or a profile ----------------------------------------------------------
if [ -n "$profile" ]; then
	if [ "$prof_mib" = free ]; then
		pm_stage "bench: boot the rig ($kvariant kernel) and profile GPU frees under 64 MRs, $prof_n per side"
		pf=$out/profile-free.txt prof_bytes=free
	else
		pf=$out/profile-${prof_mib}M.txt prof_bytes=$((prof_mib * 1024 * 1024)) prof_size="${prof_mib} MiB"
		if [ -n "$prof_kib" ]; then pf=$out/profile-${prof_kib}K.txt prof_bytes=$((prof_kib * 1024)) prof_size="${prof_kib} KiB"; fi
		pm_stage "bench: boot the rig ($kvariant kernel) and profile $prof_size registrations, $prof_n per side"
		[ "$prof_t" = 1 ] || pf=$out/profile-${prof_mib}M-${prof_t}threads.txt
	fi
	rc=0
	scripts/vm.sh "${vmargs[@]}" --cmd "$mods PROFILE_CHUNKS=${PROFILE_CHUNKS:-1} PROFILE_COUNTERS=${PROFILE_COUNTERS:-0} PROFILE_EVENT=${PROFILE_EVENT:-} PROFILE_GAP=${PROFILE_GAP:-} PROFILE_CALLERS=${PROFILE_CALLERS:-} BENCH_PROF_UMEM=${BENCH_PROF_UMEM:-0} BENCH_PROF_INSNS=${BENCH_PROF_INSNS:-0} BENCH_PROF_MISS=${BENCH_PROF_MISS:-0} BENCH_PM_RM_LOCK=${BENCH_PM_RM_LOCK:-1} BENCH_PM_ARGS='${BENCH_PM_ARGS:-}' bash $tree/tests/bench/profile-guest.sh $tree/tests/bench/bench_peermem $prof_bytes $prof_n 25 $prof_t $callgraph" \
		>"$pf.tmp" 2>"$work/vm.log" || rc=$?
	{ echo "# scripts/bench.sh --profile $profile$([ "$callgraph" = 1 ] && echo ' --callgraph')${append:+ --append '${append# }'}: $kvariant kernel $(basename "$kdir"), commit $commit, $(date -u +%Y-%m-%dT%H:%M:%SZ)"; cat "$pf.tmp"; } > "$pf"
	rm -f "$pf.tmp"
	cat "$pf"
	[ "$rc" = 0 ] || pm_die "the profile run failed (runner log: $work/vm.log)"
	pm_log "bench: $pf"
	exit 0
fi

# --- or the memory breakdown ------------------------------------------------
if [ "$memdetail" = 1 ]; then
	pm_stage "bench: boot the rig ($kvariant kernel, $mem) and break the memory figures down, $rounds rounds"
	raw=$out/memory-detail-output.txt
	rc=0
	scripts/vm.sh "${vmargs[@]}" --cmd "$mods $tree/tests/bench/bench_peermem --memory-detail --rounds $rounds --large $((large_mib * 1024 * 1024))" \
		>"$raw" 2>"$work/vm.log" || rc=$?
	if [ "$rc" != 0 ]; then
		grep -E '^(not ok|#)' "$raw" | tail -n 20 >&2
		pm_die "the memory run failed (guest output: $raw; runner log: $work/vm.log)"
	fi
	{
		echo "# scripts/bench.sh --memory-detail --rounds $rounds${append:+ --append '${append# }'}: $kvariant kernel $(basename "$kdir"), commit $commit ($dirty files changed), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
		echo
		python3 tests/bench/report.py memdetail "$raw"
	} > "$out/memory-detail.md" || pm_die "cannot turn $raw into $out/memory-detail.md"
	cat "$out/memory-detail.md"
	pm_log "bench: $out/memory-detail.md (guest output: $raw)"
	exit 0
fi

# --- the runs -------------------------------------------------------------
raws=()
vmlog=$work/vm.log
t0=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
# One boot a run, the two programs one after the other (bench_peermem
# unloads the peer clients it loaded; bench_pfnmap loads peermem with pfnmap=1).
cmd="$mods BENCH_PIN_COSTS=$pin_costs $tree/tests/bench/bench_peermem --rounds $rounds --large $((large_mib * 1024 * 1024))"
# BENCH_PM_RM_LOCK=0 in the environment: peermem's side runs with gpusim's
# rm_lock=0, as nvidia-peermem's (a before/after comparison with a module
# from before the keeper, whose free callback has the RM cycle).
[ "${BENCH_PM_RM_LOCK:-1}" = 0 ] && cmd="BENCH_PM_RM_LOCK=0 $cmd"
# BENCH_NV_RM_LOCK=1: nvidia-peermem's side with gpusim's rm_lock=1 too (the
# same conditions for both; plain kernel only: lockdep reports its cycle).
[ "${BENCH_NV_RM_LOCK:-0}" = 1 ] && cmd="BENCH_NV_RM_LOCK=1 $cmd"
# BENCH_PM_ARGS='...': peermem's module parameters (a measurement).
[ -n "${BENCH_PM_ARGS:-}" ] && cmd="BENCH_PM_ARGS='$BENCH_PM_ARGS' $cmd"
# BENCH_WARM=N: N more reg+dereg at 64 KiB and 2 MiB after each side's load.
[ -n "${BENCH_WARM:-}" ] && cmd="BENCH_WARM=$BENCH_WARM $cmd"
[ -n "${BENCH_SCALE_N:-}" ] && cmd="BENCH_SCALE_N=$BENCH_SCALE_N $cmd"
if [ -n "$only" ]; then
	cmd+=" --only $only"
else
	cmd+=" && $mods PFNMAP_KO=$tree/tests/pfnmap/pfnmap_exporter.ko"
	cmd+=" $tree/tests/bench/bench_pfnmap --rounds $rounds --mib $pfn_mib"
fi
for ((run = 1; run <= runs; run++)); do
	raw=$work/guest-output.$run.txt
	pm_stage "bench: run $run of $runs: boot the rig ($kvariant kernel, $mem) and run $rounds rounds of each benchmark"
	rc=0
	scripts/vm.sh "${vmargs[@]}" --cmd "$cmd" \
		>"$raw" 2>"$vmlog" || rc=$?
	if [ "$rc" != 0 ]; then
		grep -E '^(not ok|#)' "$raw" | tail -n 20 >&2
		tail -n 30 "$vmlog" >&2
		pm_die "the benchmark run failed (guest output: $raw; runner log: $vmlog)"
	fi
	grep '^# ' "$raw" | sed 's/^# /bench: /' >&2 || true
	want=(regdereg_s pincost_s pfn_send_s)
	[ -z "$only" ] || want=()
	[[ ,$only, == *,latency,* ]] && want+=(regdereg_s)
	[[ ,$only, == *,pincost,* ]] && want+=(pincost_s pincost_miss_s)
	for f in "${want[@]}"; do
		grep -q "^sample $f " "$raw" || pm_die "the guest output has no $f samples (guest output: $raw)"
	done
	raws+=(--raw "$raw")
done
t1=$(date +%s)

# --- the results ------------------------------------------------------------
pm_stage "bench: results"
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
accel=$(sed -n 's/.*vm: booting .* (\([a-z]*\), .*/\1/p' "$vmlog" | head -n 1)
"$py" tests/bench/report.py results "${raws[@]}" --json "$out/bench-results.json" \
	--meta "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)" --meta "commit=$commit" \
	--meta "dirty_files=$dirty" --meta "src=$src" \
	--meta "kernel_variant=$kvariant" --meta "kernel_tree=$(basename "$kdir")" \
	--meta "kernel_release=$(cat "$kdir/include/config/kernel.release")" \
	--meta "accel=${accel:-unknown}" --meta "guest_mem=$mem" --meta "rounds=$rounds" \
	--meta "nv_client=$nv_client" --meta "nv_args=$nv_args" --meta "pin_costs=$pin_costs" \
	--meta "pin_cost_model=gpusim pin_call_us + pin_page_ns per 64 KiB GPU page, per pin call, each of $pin_costs (us:ns)" \
	--meta "guest_append=${append# }" --meta "guest_smp=${BENCH_SMP:-2}" --meta "pfn_mib=$pfn_mib" --meta "only=${only:-all}" --meta "pm_rm_lock=${BENCH_PM_RM_LOCK:-1}" --meta "nv_rm_lock=${BENCH_NV_RM_LOCK:-0}" --meta "warm=${BENCH_WARM:-0}" --meta "pm_args=${BENCH_PM_ARGS:-}" --meta "pm_ko=${BENCH_PM_KO:-}" \
	--meta "qemu=$(qemu-system-x86_64 --version | head -n 1)" \
	--meta "host_cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)" \
	--meta "host_cpus=$(nproc)" --meta "wall_s=$((t1 - t0))" \
	--meta "host_loadavg_before=$load0" --meta "host_loadavg_after=$(cut -d' ' -f1-3 /proc/loadavg)" ||
	pm_die "cannot turn $raw into $out/bench-results.json"
"$py" tests/bench/report.py table "$out/bench-results.json"
"$py" tests/bench/report.py table "$out/bench-results.json" --markdown > "$out/bench-table.md" ||
	pm_die "cannot write $out/bench-table.md"
if "$py" -c 'import matplotlib' 2>/dev/null; then
	if [ -z "$only" ] || [[ ,$only, == *,latency,* ]]; then
		"$py" tests/bench/report.py plot "$out/bench-results.json" "$out/bench-latency.png" ||
			pm_die "the plot failed"
	fi
	if [ -z "$only" ] || [[ ,$only, == *,pincost,* ]]; then
		"$py" tests/bench/report.py pincost "$out/bench-results.json" --markdown > "$out/pincost-table.md" &&
			"$py" tests/bench/report.py plot-pincost "$out/bench-results.json" "$out/bench-pincost.png" ||
			pm_die "the pin-cost table or plot failed"
		cat "$out/pincost-table.md"
	fi
	if [[ ,$only, == *,scaling,* ]]; then
		"$py" tests/bench/report.py scaling "$out/bench-results.json" --markdown > "$out/scaling-table.md" &&
			"$py" tests/bench/report.py plot-scaling "$out/bench-results.json" "$out/bench-scaling.png" ||
			pm_die "the scaling table or plot failed"
		cat "$out/scaling-table.md"
	fi
	if [ -z "$only" ]; then
		"$py" tests/bench/report.py plot-pfn "$out/bench-results.json" "$out/bench-pfnmap.png" ||
			pm_die "the PFN-map plot failed"
	fi
	pm_log "bench: $out/bench-results.json and its plots (run: $((t1 - t0)) s)"
else
	pm_log "bench: no matplotlib for $py (scripts/setup-host.sh installs python3-matplotlib): no plot"
	pm_log "bench: $out/bench-results.json (run: $((t1 - t0)) s)"
fi
exit
}
