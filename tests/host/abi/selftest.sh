#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
# Self-test of the ABI fidelity test: copies our two headers and the facts
# of newer drivers (nv_p2p_newer.tsv), breaks them in
# one way at a time, and checks that tests/host/abi/run.sh then fails with
# the expected item reported "not ok" (and passes on the unmodified copy).
# Prints TAP. Takes about 2 s per mutation when the caches are warm.
#
#   tests/host/abi/selftest.sh        (KDIR as for run.sh)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
inc=$(cd "$here/../../../include" && pwd)

# description | header | sed program | regex of the "not ok" line expected
mutations=(
"field wider, struct size unchanged|nv_p2p_abi.h|/^typedef struct nvidia_p2p_page_table {/,/^}/s/\tu32 entries;/\tu64 entries;/|nvidia_p2p_page_table\.entries$"
"field renamed|nv_p2p_abi.h|/^typedef struct nvidia_p2p_page_table {/,/^}/s/\*\*pages;/**page_list;/|struct nvidia_p2p_page_table: size"
"enum field made a plain u32|nv_p2p_abi.h|s/^\tenum nvidia_p2p_page_size_type page_size_type;/\tu32 page_size_type;/|nvidia_p2p_dma_mapping\.page_size_type$"
"array length changed, later offsets shift|peer_mem_abi.h|s/^\tchar version\[IB_PEER_MEMORY_VER_MAX\];/\tchar version[IB_PEER_MEMORY_VER_MAX + 8];/|peer_memory_client\.acquire$"
"callback parameter type changed|peer_mem_abi.h|s/^\t\t\t u64 core_context);/\t\t\t u32 core_context);/|peer_memory_client\.get_pages$"
"extra field hidden in tail padding|peer_mem_abi.h|s/^\tu32 flags;/\tu32 flags;\n\tu32 extra;/|struct peer_memory_client_ex: size"
"flag value changed|peer_mem_abi.h|s/PEER_MEM_INVALIDATE_UNMAPS = 1 << 0,/PEER_MEM_INVALIDATE_UNMAPS = 1 << 1,/|enumerator PEER_MEM_INVALIDATE_UNMAPS"
"invalidate typedef changed|peer_mem_abi.h|s/^typedef int (\*invalidate_peer_memory)(void \*reg_handle, u64 core_context);/typedef int (*invalidate_peer_memory)(void *reg_handle, u32 core_context);/|typedef invalidate_peer_memory"
"const dropped from a prototype|peer_mem_abi.h|s/^void \*ib_register_peer_memory_client(const struct/void *ib_register_peer_memory_client(struct/|function ib_register_peer_memory_client"
"return type of a prototype changed|nv_p2p_abi.h|s/^int nvidia_p2p_put_pages(/long nvidia_p2p_put_pages(/|function nvidia_p2p_put_pages$"
"prototype removed|nv_p2p_abi.h|/^int nvidia_p2p_free_dma_mapping(/d|function nvidia_p2p_free_dma_mapping"
"extra declaration added|nv_p2p_abi.h|s/^int nvidia_p2p_destroy_mapping(u64 p2p_token);/&\nint nvidia_p2p_extra(void);/|declares beyond the reference is pinned by"
"580 flag value changed|nv_p2p_abi.h|s/^#define NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE 0x1/#define NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE 0x2/|580.65.06 .*NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE == 0x1"
"580 flags field dropped from the v2 layout|nv_p2p_abi.h|/^typedef struct nvidia_p2p_page_table {/,/^}/{/^\tu32 flags;/d}|595.45.04 .*offsetof\(struct nvidia_p2p_page_table, flags\)"
"v2 flags offset constant changed|nv_p2p_abi.h|s/^#define NVIDIA_P2P_PAGE_TABLE_V2_FLAGS_OFFSET 32/#define NVIDIA_P2P_PAGE_TABLE_V2_FLAGS_OFFSET 36/|as our NVIDIA_P2P_PAGE_TABLE_V2_FLAGS_OFFSET"
"v2 version word changed|nv_p2p_abi.h|s/^#define NVIDIA_P2P_PAGE_TABLE_VERSION 0x00020000/#define NVIDIA_P2P_PAGE_TABLE_VERSION 0x00020001/|595.45.04 .*: NVIDIA_P2P_PAGE_TABLE_VERSION == 0x20000$"
"a recorded fact changed|nv_p2p_newer.tsv|s/^595.45.04\tsizeof(struct nvidia_p2p_page_table)\t40/595.45.04\tsizeof(struct nvidia_p2p_page_table)\t32/|595.45.04 .*sizeof\(struct nvidia_p2p_page_table\) == 0x20"
"version constant changed|nv_p2p_abi.h|s/^#define NVIDIA_P2P_DMA_MAPPING_VERSION 0x00020003/#define NVIDIA_P2P_DMA_MAPPING_VERSION 0x00020002/|macro NVIDIA_P2P_DMA_MAPPING_VERSION:"
"constant type widened|nv_p2p_abi.h|s/^#define NVIDIA_P2P_MAJOR_VERSION_MASK 0xffff0000/&UL/|macro NVIDIA_P2P_MAJOR_VERSION_MASK:"
"compatibility macro logic changed|nv_p2p_abi.h|s/ >= NVIDIA_P2P_MINOR_VERSION(v)))/ > NVIDIA_P2P_MINOR_VERSION(v)))/|macro NVIDIA_P2P_VERSION_COMPATIBLE\("
"enumerator inserted|nv_p2p_abi.h|s/^\tNVIDIA_P2P_PAGE_SIZE_4KB = 0,/&\n\tNVIDIA_P2P_PAGE_SIZE_8KB,/|enumerator NVIDIA_P2P_PAGE_SIZE_64KB"
"capability macro removed|nv_p2p_abi.h|/^#define NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API/d|macro NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API"
"typedef replaced by a macro|nv_p2p_abi.h|s/^typedef struct nvidia_p2p_rsync_reg_info {/struct nvidia_p2p_rsync_reg_info {/; s/^} nvidia_p2p_rsync_reg_info_t;/};\n#define nvidia_p2p_rsync_reg_info_t struct nvidia_p2p_rsync_reg_info/|typedef nvidia_p2p_rsync_reg_info_t"
)

work=$(mktemp -d "${TMPDIR:-/tmp}/peermem-abi-self.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "1..$(( ${#mutations[@]} + 1 ))"
n=1 failed=0
cp "$inc/peer_mem_abi.h" "$inc/nv_p2p_abi.h" "$here/nv_p2p_newer.tsv" "$work/"
mkdir -p "$work/uapi" && cp "$inc/uapi/peermem.h" "$work/uapi/"
export ABI_NEWER_FACTS=$work/nv_p2p_newer.tsv
if ABI_INCLUDE_DIR=$work "$here/run.sh" >"$work/out" 2>&1; then
	echo "ok $n - unmodified headers pass ($(grep -c '^ok' "$work/out") checks)"
else
	echo "not ok $n - unmodified headers pass"; sed 's/^/# /' "$work/out" | grep -v '^# ok' | head -20; failed=1
fi
for m in "${mutations[@]}"; do
	n=$((n + 1))
	IFS='|' read -r desc file prog expect <<<"$m"
	cp "$inc/peer_mem_abi.h" "$inc/nv_p2p_abi.h" "$here/nv_p2p_newer.tsv" "$work/"
	sed -i "$prog" "$work/$file"
	orig=$inc/$file
	[ "$file" = nv_p2p_newer.tsv ] && orig=$here/$file
	if cmp -s "$work/$file" "$orig"; then
		echo "not ok $n - caught: $desc # the mutation no longer applies to $file; update selftest.sh"
		failed=1; continue
	fi
	ABI_INCLUDE_DIR=$work "$here/run.sh" >"$work/out" 2>&1
	rc=$?
	bad=$(grep -c '^not ok' "$work/out")
	if [ "$rc" -ne 0 ] && grep -Eq "^not ok [0-9]+ - .*$expect" "$work/out"; then
		echo "ok $n - caught: $desc ($bad not ok, e.g. $(grep -m1 -E "^not ok [0-9]+ - .*$expect" "$work/out" | sed 's/^not ok [0-9]* - //'))"
	else
		echo "not ok $n - caught: $desc (exit $rc, $bad not ok, none matching /$expect/)"
		grep '^not ok' "$work/out" | head -5 | sed 's/^/# /'
		failed=1
	fi
done
exit $failed
