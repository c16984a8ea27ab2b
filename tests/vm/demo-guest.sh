#!/bin/bash
# The guest half of scripts/demo.sh: runs in the rig VM, prints for a person.
#
# Loads gpusim (the emulated GPU) and peermem, brings up soft-RoCE (rxe0),
# runs tests/guest/e2e/pm_demo: GPU memory allocated, ibv_reg_mr() on it,
# RDMA WRITE and READ checked through the GPU's CPU mapping, the memory
# freed under the live MR (invalidation), ibv_dereg_mr(); shows the
# counters of peermem and of the peer-memory core, and unloads everything.
# If peermem does not register with the core, the GPU part runs with the
# reference C client (tests/refclient) instead, and the output says so
# (PEERMEM_DEMO_FALLBACK=1 forces that path, to check it).
set -u
root=$PEERMEM_ROOT
ko=$root/peermem.ko
gko=$root/tests/gpusim/gpusim.ko
rko=$root/tests/refclient/peer_refclient.ko
demo=$root/tests/guest/e2e/pm_demo
core=/sys/kernel/debug/peer_memory
ofed=/sys/kernel/mm/memory_peers
section() { printf '\n=== %s\n' "$*"; }
fail() { printf 'demo: %s\n' "$*"; exit 1; }
# show CMD...: print a command, then run it (indented output).
show() { printf '$ %s\n' "$*"; "$@" 2>&1 | sed 's/^/  /'; return "${PIPESTATUS[0]}"; }
# counters DIR [GLOB]: every readable file of DIR (matching GLOB) as
# name=value, a few a line.
counters() {
	local f v line= n=0
	[ -d "$1" ] || { echo "  ($1: absent)"; return; }
	echo "  $1:"
	for f in "$1"/${2:-*}; do
		[ -f "$f" ] && read -r v < "$f" 2>/dev/null || continue
		line+="  ${f##*/}=$v"
		if [ $((++n % 4)) = 0 ]; then echo "   $line"; line=; fi
	done
	[ -z "$line" ] || echo "   $line"
}

section "The rig: $(uname -sr), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%d MiB", $2/1024}' /proc/meminfo)"
log=$(dmesg)
feat=()
[[ $log == *KernelAddressSanitizer\ initialized* ]] && feat+=(KASAN)
[ -e /proc/lockdep ] && feat+=(lockdep)
[ -e /sys/kernel/debug/kmemleak ] && feat+=(kmemleak)
[[ $log == *DMA-API:\ debugging\ enabled* ]] && feat+=(DMA-API-debug)
echo "kernel debug features: ${feat[*]:-none}"
echo "no GPU and no RDMA adapter: gpusim emulates the GPU (exporting NVIDIA's nvidia_p2p_* interface),"
echo "rxe (soft-RoCE) is the RDMA adapter, and the kernel carries the MLNX_OFED peer-memory core"

for f in "$ko" "$gko" "$demo"; do [ -e "$f" ] || fail "$f is missing: scripts/demo.sh builds it"; done

section "modinfo peermem.ko"
modinfo "$ko" || fail "modinfo failed"

section "Load the emulated GPU, then peermem (it uses gpusim's nvidia_p2p_* functions)"
show insmod "$gko" || fail "insmod gpusim.ko failed"
show insmod "$ko" || fail "insmod peermem.ko failed"
grep -E '^(peermem|gpusim) ' /proc/modules | sed 's/^/  /'
echo "kernel log:"
dmesg | grep -E '(peermem|gpusim): ' | tail -n 6 | sed 's/^/  /'

# The name peermem registers with the core (default nv_mem, what NCCL looks for).
read -r name < /sys/module/peermem/parameters/peer_name 2>/dev/null || name=
client=peermem
if [ -z "$name" ] || [ ! -d "$core/$name" ] || [ -n "${PEERMEM_DEMO_FALLBACK:-}" ]; then
	section "FALLBACK: peermem did not register with the peer-memory core"
	if [ -n "${PEERMEM_DEMO_FALLBACK:-}" ]; then
		echo "  (forced by PEERMEM_DEMO_FALLBACK: peermem is unloaded for it)"
		show rmmod peermem || fail "rmmod peermem failed"
	else
		echo "  There is no $core/${name:-<peer_name>}: this build of peermem loads but does"
		echo "  not register as a peer-memory client, so it cannot serve GPU memory."
	fi
	echo "  To show the rest, the demo uses the REFERENCE C CLIENT (tests/refclient,"
	echo "  source=gpusim) in its place. What follows is NOT peermem."
	show insmod "$rko" name=refclient source=gpusim invalidate=1 unmaps=1 ||
		fail "insmod peer_refclient.ko failed"
	client=refclient name=refclient
fi

section "The peer-memory core's view: client \"$name\""
show ls "$core"
echo "  version: $(cat "$core/$name/version" 2>&1)   flags: $(cat "$core/$name/flags" 2>&1)"
# NCCL, UCX and NVSHMEM decide that GPUDirect RDMA works from these files.
# OFED for a current kernel has no memory_peers directory (the kernel does
# not export mm_kobj), so there only the module name nvidia_peermem counts:
# peermem's drop-in build (make dropin) has it.
echo "  OFED's $ofed/$name/version (only where the kernel exports mm_kobj): $(cat "$ofed/$name/version" 2>&1)"
echo "  /sys/module/nvidia_peermem/version (what NCCL finds on a current OFED): $(cat /sys/module/nvidia_peermem/version 2>&1)"

section "Soft-RoCE: rxe0 on a veth pair"
if [ ! -e /sys/class/infiniband/rxe0 ]; then
	show ip link add veth0 type veth peer name veth1 || fail "cannot create a veth pair"
	show ip addr add 10.55.0.1/24 dev veth0
	show ip link set veth0 up
	show ip link set veth1 up
	show rdma link add rxe0 type rxe netdev veth0 || fail "cannot create rxe0"
fi
show rdma link show

section "GPU memory over RDMA: $demo $client"
# Physically contiguous GPU memory (one run), as a real GPU often hands out:
# the client may then map its 64 KiB pages as few scatter-list entries.
echo '$ echo 0 > /sys/kernel/debug/gpusim/contig_bytes'
echo 0 > /sys/kernel/debug/gpusim/contig_bytes || fail "cannot set gpusim's contig_bytes"
ulimit -l unlimited
"$demo" "$client" 1024 | sed 's/^/  /'
demo_rc=${PIPESTATUS[0]}

section "Counters afterwards"
if [ "$client" = peermem ]; then
	counters /sys/kernel/debug/peermem
	read -r un < /sys/kernel/debug/peermem/sg_entries_uncoalesced
	read -r co < /sys/kernel/debug/peermem/sg_entries_coalesced
	[ "$co" = 1 ] && e=entry || e=entries
	echo "  (peermem mapped $un GPU pages of 64 KiB as $co scatter-list $e: contiguous pages coalesced)"
fi
counters "$core/$name" 'num_*'
counters "$ofed/$name"

section "Unload"
[ "$client" = refclient ] && { show rmmod peer_refclient || fail "rmmod peer_refclient failed"; }
[ -d /sys/module/peermem ] && { show rmmod peermem || fail "rmmod peermem failed"; }
show rmmod gpusim || fail "rmmod gpusim failed"
[ -d "$core/$name" ] && fail "the core still lists $name after rmmod"
if [ -d "$core" ]; then
	echo "the core still lists: $(ls "$core" | tr '\n' ' ')"
else
	echo "the core lists no client any more (no $core)"
fi
echo "kernel log:"
dmesg | grep -E '(peermem|gpusim|peer_refclient): ' | tail -n 4 | sed 's/^/  /'

section "Summary"
if [ "$demo_rc" != 0 ]; then
	fail "pm_demo reported something unexpected (lines marked UNEXPECTED above)"
elif [ "$client" = peermem ]; then
	echo "peermem served ibv_reg_mr() on GPU memory, RDMA moved the right bytes, freeing the GPU memory revoked the MR, and everything unloaded cleanly."
else
	echo "FALLBACK: the GPU-memory part ran with the reference C client, because peermem did not register with the peer-memory core."
fi
