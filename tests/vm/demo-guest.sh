#!/bin/bash
# The guest half of scripts/demo.sh: runs in the rig VM, prints for a person.
set -u
ko=$PEERMEM_ROOT/peermem.ko
section() { printf '\n=== %s\n' "$*"; }
fail() { printf 'demo: %s\n' "$*"; exit 1; }

section "The rig: $(uname -sr), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%d MiB", $2/1024}' /proc/meminfo)"
log=$(dmesg)
feat=()
[[ $log == *KernelAddressSanitizer\ initialized* ]] && feat+=(KASAN)
[ -e /proc/lockdep ] && feat+=(lockdep)
[ -e /sys/kernel/debug/kmemleak ] && feat+=(kmemleak)
[[ $log == *DMA-API:\ debugging\ enabled* ]] && feat+=(DMA-API-debug)
echo "kernel debug features: ${feat[*]:-none}"

section "modinfo $ko"
modinfo "$ko" || fail "modinfo failed"

# peermem may need the GPU driver's symbols (nvidia_p2p_*): in the rig they
# come from gpusim, the emulated GPU.
deps=$(modinfo -F depends "$ko" | tr ',' ' ')
for d in $deps; do
	dko=$(find "$PEERMEM_ROOT/tests" -name "$d.ko" | head -n 1)
	[ -n "$dko" ] || fail "peermem depends on $d, but no $d.ko was built under tests/"
	section "insmod $dko (peermem depends on it)"
	insmod "$dko" || fail "insmod $dko failed"
done

section "insmod $ko"
insmod "$ko" || fail "insmod failed"
grep -E '^peermem ' /proc/modules
echo "kernel log:"
dmesg | grep -i peermem | tail -n 10 | sed 's/^/  /'

section "debugfs counters (/sys/kernel/debug/peermem)"
if [ -d /sys/kernel/debug/peermem ]; then
	find /sys/kernel/debug/peermem -type f | sort | while read -r f; do
		printf '  %-40s %s\n' "${f#/sys/kernel/debug/peermem/}" "$(head -c 200 "$f" 2>&1 | tr '\n' ' ')"
	done
else
	echo "  (no /sys/kernel/debug/peermem directory)"
fi

section "register GPU memory"
# PLACEHOLDER (issue 4): allocate gpusim memory, ibv_reg_mr() on it over rxe,
# RDMA WRITE/READ, show the counters move. Not available yet.
echo "  (not yet: comes with the peer-memory core and gpusim)"

section "rmmod peermem"
rmmod peermem || fail "rmmod failed"
for d in $deps; do rmmod "$d" || fail "rmmod $d failed"; done
grep -qE '^peermem ' /proc/modules && fail "peermem still loaded"
echo "unloaded; kernel log:"
dmesg | grep -i peermem | tail -n 3 | sed 's/^/  /'
