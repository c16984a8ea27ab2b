// SPDX-License-Identifier: GPL-2.0
/*
 * t_gpusim_dma - nvidia_p2p_dma_map_pages / dma_unmap_pages through the
 * kernel DMA API for a real PCI device of the guest (DMA-API debug watches
 * every mapping), the NULL-peer case of software RDMA devices, pointers
 * that are no PCI device (refused without being dereferenced), and the
 * physical contiguity knob as seen in page tables and DMA mappings.
 */
#include "gpusim_test.h"

static int dma_map(int tc, uint32_t id, uint32_t flags, struct gpusim_tc_req *q)
{
	int ret;

	memset(q, 0, sizeof(*q));
	q->id = id;
	q->flags = flags;
	ret = tc_cmd(tc, GPUSIM_TC_DMA_MAP, q);
	return ret ? ret : q->ret;
}

static void test_map(int fd, int tc)
{
	struct gpusim_tc_req q, m, s;
	long long reaped;
	uint64_t h;
	char *p = gs_alloc(fd, 8 * GPU_PAGE, &h);
	int ret;

	tc_get(tc, p, 8 * GPU_PAGE, 0, &q);
	ret = dma_map(tc, q.id, 0, &m);
	if (ret == -ENODEV) {
		skip("DMA mapping: the guest has no PCI device with a DMA mask");
		tc_id(tc, GPUSIM_TC_FORGET, q.id, 0, &s);
		munmap(p, 8 * GPU_PAGE);
		gs_free(fd, h);
		return;
	}
	ok(ret == 0, "dma_map_pages for a PCI device (%d)", ret);
	ok(m.dma_entries == 8 && m.version_ok,
	   "8 DMA addresses, mapping version compatible with NVIDIA_P2P_DMA_MAPPING_VERSION");
	ok(m.dma0 != 0, "DMA address of page 0: %#llx (physical %#llx)",
	   (unsigned long long)m.dma0, (unsigned long long)m.phys0);
	ok(dbg_get("live_dma_mappings") == 1, "live_dma_mappings is 1");
	ret = tc_id(tc, GPUSIM_TC_DMA_UNMAP, q.id, 0, &s);
	ok(ret == 0, "dma_unmap_pages (%d)", ret);
	ok(dbg_get("live_dma_mappings") == 0, "live_dma_mappings back to 0");
	ret = tc_id(tc, GPUSIM_TC_DMA_UNMAP, q.id, 0, &s);
	ok(ret == 0 && dbg_get("stale_calls") == 1,
	   "unmapping the same mapping again: 0, counted in stale_calls (stale_errno=0, the default) (%d)",
	   ret);
	dbg_set("stale_errno", 22);
	ret = tc_id(tc, GPUSIM_TC_DMA_UNMAP, q.id, 0, &s);
	ok(ret == -EINVAL && dbg_get("stale_calls") == 2,
	   "and -EINVAL with stale_errno=22 (the refusing variant) (%d)", ret);
	dbg_set("stale_errno", 0);

	ok(dma_map(tc, q.id, GPUSIM_TC_NULL_PEER, &m) == -EINVAL,
	   "dma_map_pages with a NULL pci_dev (software RDMA device): -EINVAL");
	/*
	 * Pointers that are no PCI device: gpusim must look them up on the
	 * PCI bus before touching them (a dereference of the first would
	 * oops; the second looks DMA capable and would be mapped for).
	 */
	ret = dma_map(tc, q.id, GPUSIM_TC_BOGUS_PEER, &m);
	ok(ret == -EINVAL && m.dma_entries == 0,
	   "dma_map_pages with to_pci_dev(NULL) (a NULL struct device converted): -EINVAL, nothing mapped (%d)",
	   ret);
	ret = dma_map(tc, q.id, GPUSIM_TC_FAKE_PEER, &m);
	ok(ret == -EINVAL && m.dma_entries == 0,
	   "dma_map_pages with a made-up pci_dev that is not on the PCI bus (it has a DMA mask): -EINVAL (%d)",
	   ret);
	ok(dbg_get("live_dma_mappings") == 0,
	   "the refused calls left no mapping (live_dma_mappings 0)");
	ok(dma_map(tc, q.id, 0, &m) == 0, "map again");
	ret = tc_id(tc, GPUSIM_TC_DMA_UNMAP, q.id, GPUSIM_TC_NULL_PEER, &s);
	ok(ret == -EINVAL, "dma_unmap_pages with a NULL pci_dev: -EINVAL (%d)", ret);
	ok(dbg_get("live_dma_mappings") == 1, "the mapping is still there");

	reaped = dbg_get("dma_reaped");
	ret = tc_id(tc, GPUSIM_TC_PUT, q.id, 0, &s);
	ok(ret == 0, "put_pages with the DMA mapping still live");
	ok(dbg_get("live_dma_mappings") == 0 && dbg_get("dma_reaped") - reaped == 1,
	   "gpusim unmapped the leftover mapping (dma_reaped +1)");
	tc_id(tc, GPUSIM_TC_FORGET, q.id, 0, &s);
	munmap(p, 8 * GPU_PAGE);
	gs_free(fd, h);
}

/* Contiguity knob: an allocation of `size` with contig_bytes = `contig`
 * must show exactly `runs` physically contiguous runs. */
static void test_contig(int fd, int tc, long long contig, uint64_t size, unsigned int runs)
{
	struct gpusim_alloc a;
	struct gpusim_tc_req q, m, s;
	int ret;

	ret = dbg_set("contig_bytes", contig);
	ret = ret ? ret : gs_alloc_at(fd, size, 0, &a);
	if (ret) {
		ok(0, "contig_bytes=%lld: alloc %llu bytes (%s)", contig,
		   (unsigned long long)size, strerror(-ret));
		return;
	}
	tc_get(tc, (void *)(uintptr_t)a.addr, size, 0, &q);
	ok(q.runs == runs, "contig_bytes=%lld, %llu KiB: %u physically contiguous runs (want %u)",
	   contig, (unsigned long long)size >> 10, q.runs, runs);
	if (dma_map(tc, q.id, 0, &m) == 0) {
		/* Without an IOMMU the DMA addresses keep the physical layout. */
		ok(m.dma_runs == runs, "... and %u DMA-contiguous runs (want %u)", m.dma_runs, runs);
	}
	tc_id(tc, GPUSIM_TC_FORGET, q.id, 0, &s);
	munmap((void *)(uintptr_t)a.addr, size);
	gs_free(fd, a.handle);
}

int main(void)
{
	int fd, tc;

	gs_setup();
	fd = gs_open();
	tc = tc_open();
	test_map(fd, tc);

	test_contig(fd, tc, 65536, 1 << 20, 16);
	test_contig(fd, tc, 262144, 1 << 20, 4);
	test_contig(fd, tc, 1 << 20, 3 << 20, 3);
	test_contig(fd, tc, 196608, 1 << 20, 6);
	test_contig(fd, tc, 0, 2 << 20, 1);
	ok(dbg_set("contig_bytes", 100) == -EINVAL, "contig_bytes=100 refused (EINVAL)");
	ok(dbg_set("contig_bytes", 64LL << 20) == -EINVAL, "contig_bytes=64 MiB refused (EINVAL)");
	dbg_set("contig_bytes", 65536);

	close(tc);
	close(fd);
	return gs_finish();
}
