#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
# Experiment, not part of the benchmark: what gpusim's global STATE mutex,
# held over the IOMMU mapping in dma_map, costs two registering threads.
# Builds a second gpusim with dma-map-outside-state.patch applied (beside
# the benchmark's tree of scripts/bench.sh, which must have been built for
# the plain kernel: run any scripts/bench.sh first), then boots the rig
# once and, in ROUNDS rounds, for the stock and the patched gpusim in a
# rotating order and for each side, times N reg+dereg of 2 MiB by one
# thread and N by each of two threads (bench_peermem --profile, no perf):
# the throughput ratio 2 threads / 1 thread (guest-run.sh).
#
#   docs/bench/experiments/gpusim-state-narrow/run.sh [ROUNDS [N]]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
. "$root/scripts/lib.sh"
cd "$root"
rounds=${1:-3} n=${2:-300}
kdir=$(scripts/kernel.sh --variant plain --print-kdir)
work=$PEERMEM_CACHE/bench/$(basename "$kdir")
tree=$work/tree exp=$work/gpusim-exp
for f in tests/gpusim/gpusim.ko tests/gpusim/testclient/gpusim_testclient.ko peermem.ko \
	tests/nvpeermem/nvidia-peermem.ko tests/bench/bench_peermem; do
	[ -f "$tree/$f" ] || pm_die "no $tree/$f: run scripts/bench.sh (plain kernel) first"
done
read -ra margs < "$kdir/.peermem-make-args"
rm -rf "$exp" && mkdir -p "$exp/tests"
cp -a "$tree/include" "$exp/include"
cp -a "$tree/tests/gpusim" "$exp/tests/gpusim"
make -C "$exp/tests/gpusim" clean KDIR="$kdir" "${margs[@]}" >/dev/null
patch -d "$exp" -p1 < "$here/dma-map-outside-state.patch"
make -C "$exp/tests/gpusim" gpusim KDIR="$kdir" "${margs[@]}" -j2 > "$work/gpusim-exp-build.log" 2>&1 ||
	pm_die "building the patched gpusim failed ($work/gpusim-exp-build.log)"
mods="GPUSIM_STOCK=$tree/tests/gpusim/gpusim.ko GPUSIM_EXP=$exp/tests/gpusim/gpusim.ko"
mods+=" TESTCLIENT_KO=$tree/tests/gpusim/testclient/gpusim_testclient.ko"
mods+=" PEERMEM_KO=$tree/peermem.ko NVPEERMEM_KO=$tree/tests/nvpeermem/nvidia-peermem.ko"
echo "# gpusim-state-narrow/run.sh $rounds $n: plain kernel $(basename "$kdir"), commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
scripts/vm.sh --kdir "$kdir" --mem 3G --no-kmemleak --test-timeout 1800 \
	--cmd "$mods bash $here/guest-run.sh $tree/tests/bench/bench_peermem $rounds $n"
