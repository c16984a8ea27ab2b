#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# bar1-capacity.sh [--out FILE] [--nvpeermem KO]... : how much GPU memory each
# client registers before gpusim's BAR1 (docs/gpusim.md, "BAR1") is full,
# one rig boot: peermem with its defaults and with watch_cache=0, and each
# nvidia-peermem.ko given (default: tests/nvpeermem/nvidia-peermem.ko, 550,
# if built; add tests/nvpeermem/595/nvidia-peermem.ko for 595 in both of its
# modes). Prints bench_bar1's lines and writes them to FILE (default
# docs/bench/bar1-capacity.txt). BENCH_BAR1_MIB: the BAR1 sizes (default
# "256 512"), BENCH_PIN_SIZES_KIB and BENCH_PIN_ROUNDS: the pin counts (bench_bar1.c).
# Needs the rig kernel, gpusim, peermem and tests/bench built.
set -euo pipefail
usage='tests/bench/bar1-capacity.sh [--out FILE] [--nvpeermem KO]...'
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/docs/bench/bar1-capacity.txt nv=()
while [ $# -gt 0 ]; do
	case "$1" in
	--out) out=${2:?$usage}; shift 2 ;;
	--nvpeermem) nv+=("${2:?$usage}"); shift 2 ;;
	-h|--help) echo "$usage"; sed -n '3,11p' "$0"; exit 0 ;;
	*) echo "$usage" >&2; exit 2 ;;
	esac
done
[ ${#nv[@]} -gt 0 ] || { [ -f "$root/tests/nvpeermem/nvidia-peermem.ko" ] && nv=("$root/tests/nvpeermem/nvidia-peermem.ko"); }
b=$root/tests/bench/bench_bar1
script=$(mktemp -p "$root/tests/bench" .bar1-XXXX.sh)
trap 'rm -f "$script"' EXIT
{
	echo '#!/bin/sh'
	echo "export BENCH_BAR1_MIB='${BENCH_BAR1_MIB:-256 512}'"
	echo "$b peermem $root/peermem.ko peermem"
	echo "$b peermem-nocache $root/peermem.ko peermem watch_cache=0"
	for k in "${nv[@]}"; do
		case "$k" in
		*/595/*) echo "$b nvidia-peermem-595 $k nvidia_peermem"
			 echo "$b nvidia-peermem-595-legacy $k nvidia_peermem persistent_api_support=0" ;;
		*) echo "$b nvidia-peermem-550 $k nvidia_peermem" ;;
		esac
	done
} > "$script"
chmod +x "$script"
"$root/scripts/vm.sh" --mem 4G --test-timeout 1800 --cmd "$script" | tee /dev/stderr | grep -E '^(bar1|pins) ' > "$out.tmp" || true
[ -s "$out.tmp" ] || { rm -f "$out.tmp"; echo "bar1-capacity.sh: no result (see the VM output above)" >&2; exit 1; }
{
	echo "# bench_bar1 $(date -u +%F) on $(git -C "$root" rev-parse --short HEAD): label bar1_mib one_mr_mib N small_mrs N (2 MiB MRs at once); BAR1 dynamic"
	cat "$out.tmp"
} > "$out"
rm -f "$out.tmp"
echo "written: $out"
