// SPDX-License-Identifier: GPL-2.0
/*
 * peermem with gpusim memory over rxe: registration of both clients with
 * the core, host memory untouched, ibv_reg_mr on GPU memory mapped for
 * rxe's PCI device (nvidia_p2p_dma_map_pages; rxe moves the data through
 * those bus addresses and the device's IOMMU), RDMA WRITE/READ checked
 * through the CPU mapping, unaligned sub-ranges, one pin per registration,
 * entries within the device's segment limit, memory that is not the
 * GPU's, failure injection (a pin nv_mem cannot get goes to nv_mem_nc),
 * balanced counters after deregistration, unregistration at rmmod.
 */
#include "peermem_test.h"

#define LEN (1024 * 1024UL)		/* 16 GPU pages */
#define NPAGES (LEN / GPU_PAGE)

struct thr_reg {
	struct ibv_pd *pd;
	void *p;
	size_t len;
	struct ibv_mr *mr;
	int err;
};

/* A hex debugfs file of peermem (0x%08x); -1 if unreadable. */
static long long pm_hex(const char *name)
{
	unsigned long long v;
	char path[256];
	FILE *f;

	snprintf(path, sizeof(path), PMDBG "%s", name);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%llx", &v) != 1)
		v = (unsigned long long)-1;
	fclose(f);
	return (long long)v;
}

static void *thr_reg(void *arg)
{
	struct thr_reg *r = arg;

	r->mr = ibv_reg_mr(r->pd, r->p, r->len, MR_ACCESS);
	r->err = r->mr ? 0 : errno;
	return NULL;
}

/* Counter NAME of SET in /proc/driver/peermem ("SET NAME VALUE" lines), -1 if absent. */
static long long proc_counter(const char *set, const char *name)
{
	FILE *f = fopen("/proc/driver/peermem", "r");
	char s[64], n[64];
	long long v, found = -1;

	if (!f)
		return -1;
	while (fscanf(f, "%63s %63s %lld", s, n, &v) == 3)
		if (!strcmp(s, set) && !strcmp(n, name))
			found = v;
	fclose(f);
	return found;
}

int main(void)
{
	struct peer_stats s0, s1;
	struct ibv_mr *hmr, *mr, *smr;
	struct conn c;
	struct gmem g;
	uint8_t *h;
	long long a0, d0, e0, u0, co0, co1, co2, pins0;
	char buf[128], want[128];
	int fd, rc, st;

	rxe_up();
	load_modules(NULL);
	ok(1, "gpusim and peermem loaded");
	ok(!strcmp(pm_name, "nv_mem"), "peermem registers as nv_mem by default (got %s)", pm_name);
	snprintf(buf, sizeof(buf), "/sys/kernel/debug/peer_memory/%s/flags", pm_name);
	read_line(buf, want, sizeof(want));
	ok(!strcmp(want, "invalidate=1 invalidate_unmaps=1"),
	   "the core sees an invalidating client with PEER_MEM_INVALIDATE_UNMAPS (%s)", want);
	{
		char v1[64], v2[64], v3[64];

		snprintf(buf, sizeof(buf), "/sys/kernel/debug/peer_memory/%s/version", pm_name);
		read_line(buf, v1, sizeof(v1));
		snprintf(buf, sizeof(buf), "/sys/kernel/debug/peer_memory/%s/version", pm_nc_name);
		read_line(buf, v2, sizeof(v2));
		ok(!strcmp(pm_nc_name, "nv_mem_nc") && read_line("/sys/module/peermem/version", v3, sizeof(v3)) == 0 &&
		   v3[0] && !strcmp(v1, v3) && !strcmp(v2, v3),
		   "both clients, %s and %s, are registered with peermem's version %s", pm_name, pm_nc_name, v3);
	}
	ok(peer_stats(pm_name, &s0) == 0 && s0.alloc_mrs == 0 && pm("registrations_acquired") == 0 &&
	   pm_idle(), "counters start at zero");

	if (conn_open(&c))
		bail("cannot set up an RC loopback on " RXE_DEV);
	fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0)
		bail("cannot open /dev/gpusim: %s", strerror(errno));
	h = aligned_alloc(4096, 4 * LEN);
	if (!h)
		bail("out of memory");
	memset(h, 0, 4 * LEN);

	/* Host memory takes the normal pinning path: peermem is never asked. */
	hmr = ibv_reg_mr(c.pd, h, 4 * LEN, MR_ACCESS);
	ok(hmr && pm("registrations_acquired") == 0 && pm("registrations_declined") == 0,
	   "ibv_reg_mr on host memory never reaches peermem");
	if (!hmr)
		bail("host MR failed: %s", strerror(errno));

	/* GPU memory, 64 KiB physical contiguity (gpusim's default). */
	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	fill(g.p, LEN, 0x1234);
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	ok(mr != NULL, "ibv_reg_mr on gpusim memory succeeds (errno %d)", mr ? 0 : errno);
	if (!mr)
		bail("the GPU MR failed; nothing else can work");
	peer_stats(pm_name, &s1);
	ok(s1.alloc_mrs == 1 && s1.reg_pages == pm("sg_entries_coalesced") && s1.reg_bytes == (long long)LEN,
	   "core counters: 1 MR, %lld table entries (OFED's num_reg_pages), %lu bytes", s1.reg_pages, LEN);
	ok(pm("registrations_acquired") == 1 && pm_live_regs() == 1 && pm_live_pins() == 1 &&
	   pm_live_maps() == 1 && pm("pages_pinned") == (long long)NPAGES,
	   "peermem: one registration, one pin of %lu pages, one mapping", NPAGES);
	{
		/* The counters anyone may read, as debugfs has them (docs/module.md, "Counters"). */
		long long pa = proc_counter("client", "registrations_acquired"),
			  pp = proc_counter("client", "pages_pinned"),
			  pn = proc_counter("client_nc", "registrations_acquired");

		ok(pa == 1 && pp == pm("pages_pinned") && pn == pm_nc("registrations_acquired"),
		   "/proc/driver/peermem: client registrations_acquired %lld, pages_pinned %lld (debugfs %lld), client_nc registrations_acquired %lld",
		   pa, pp, pm("pages_pinned"), pn);
	}
	ok(gs("live_pins") == 2 && gs("calls/get_pages") == 1 && gs("live_persistent_pins") == 1 &&
	   pm_live_keepers() == 1,
	   "one nvidia_p2p_get_pages and one keeper pin (persistent) for the whole registration (gpusim: %lld call(s), %lld pin(s))",
	   gs("calls/get_pages"), gs("live_pins"));
	/*
	 * The pin's page-table version and flags (issue 28): a layout peermem
	 * reads, v1.2 from 550-575 (no flags: 0) or v2.0 from 580 on; a
	 * CPU_CACHEABLE v2 table is counted.
	 */
	{
		long long ver = pm_hex("last_pin_version"), fl = pm_hex("last_pin_flags");
		int v1 = (ver >> 16) == 1 && (ver & 0xffff) >= 2, v2 = (ver >> 16) == 2;

		ok((v1 && fl == 0) || (v2 && fl >= 0),
		   "debugfs: last_pin_version %#llx is a known layout, last_pin_flags %#llx (0 for a v1 table)",
		   ver, fl);
		ok(pm("page_tables_cpu_cacheable") == (v2 && (fl & 1) ? 1 : 0),
		   "debugfs: page_tables_cpu_cacheable %lld matches the pin's CPU_CACHEABLE bit",
		   pm("page_tables_cpu_cacheable"));
	}
	ok(gs("live_dma_mappings") == 1 && gs("calls/dma_map_pages") == 1,
	   "mapped for rxe's PCI device with one nvidia_p2p_dma_map_pages (gpusim: %lld call(s), %lld live mapping(s))",
	   gs("calls/dma_map_pages"), gs("live_dma_mappings"));
	ok(pm_nc("registrations_acquired") == 0 && pm_nc("registrations_declined") == 0,
	   "the MR is nv_mem's: nv_mem_nc was not asked");
	/* Bus addresses are IOVAs: consecutive only where the IOMMU's allocator made them so. */
	ok(pm("sg_entries_uncoalesced") == (long long)NPAGES && pm("sg_entries_coalesced") >= 1 &&
	   pm("sg_entries_coalesced") <= (long long)NPAGES,
	   "64 KiB contiguity: %lld entries for %lu pages (bus-contiguous pages merged)",
	   pm("sg_entries_coalesced"), NPAGES);
	ok(s1.dereg_pages == 0 && s1.dealloc_mrs == 0, "the core's num_dereg_pages and num_dealloc_mrs at 0");

	/* RDMA both ways, checked through the CPU mapping. */
	rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, LEN, (uintptr_t)g.p, mr->rkey);
	ok(rc == 0 && !memcmp(h, g.p, LEN), "RDMA READ of the whole GPU MR returns its bytes (status %d)", rc);
	fill(h + LEN, 300000, 0x5678);
	rc = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h + LEN, 300000, (uintptr_t)g.p + 65536 - 1000, mr->rkey);
	ok(rc == 0 && !memcmp(g.p + 65536 - 1000, h + LEN, 300000),
	   "RDMA WRITE across GPU page boundaries lands in the CPU mapping (status %d)", rc);
	fill(g.p + 500000, 200000, 0x9abc);
	rc = rdma_op(&c, IBV_WR_RDMA_WRITE, mr, g.p + 500000, 200000, (uintptr_t)h + 2 * LEN, hmr->rkey);
	ok(rc == 0 && !memcmp(h + 2 * LEN, g.p + 500000, 200000),
	   "the GPU MR as local source of an RDMA WRITE (status %d)", rc);

	/* An unaligned sub-range: pins only the GPU pages it touches. */
	a0 = pm("pages_pinned");
	smr = ibv_reg_mr(c.pd, g.p + 70000, 100000, MR_ACCESS);
	ok(smr && pm("pages_pinned") - a0 == 2 && pm_live_pins() == 2,
	   "MR on [+70000, +170000): its own pin of the 2 GPU pages it touches (%lld)",
	   pm("pages_pinned") - a0);
	if (smr) {
		fill(h, 8000, 0x4444);
		rc = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h, 5000, (uintptr_t)g.p + 70000, smr->rkey);
		st = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h + 5000, 3000, (uintptr_t)g.p + 167000, smr->rkey);
		ok(rc == 0 && st == 0 && !memcmp(g.p + 70000, h, 5000) && !memcmp(g.p + 167000, h + 5000, 3000),
		   "RDMA WRITE at the first and last bytes of the sub-range");
		rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h + LEN, 100000, (uintptr_t)g.p + 70000, smr->rkey);
		ok(rc == 0 && !memcmp(h + LEN, g.p + 70000, 100000), "RDMA READ of the whole sub-range");
		rc = rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, 4096, (uintptr_t)g.p + 170000, smr->rkey);
		ok(rc > 0, "RDMA READ past the sub-range's end fails (status %d)", rc);
		if (conn_qps(&c))
			bail("cannot recreate the QPs");
		ok(ibv_dereg_mr(smr) == 0, "ibv_dereg_mr of the sub-range MR");
	}

	/* Another thread registers (NCCL's proxy thread does): same process, same memory. */
	{
		struct thr_reg tr = { .pd = c.pd, .p = g.p, .len = LEN };
		pthread_t t;

		if (pthread_create(&t, NULL, thr_reg, &tr))
			bail("pthread_create");
		pthread_join(t, NULL);
		ok(tr.mr != NULL, "ibv_reg_mr from a second thread of the process works (%s)",
		   tr.mr ? "ok" : strerror(tr.err));
		if (tr.mr) {
			fill(h, 4096, 0x7777);
			rc = rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h, 4096, (uintptr_t)g.p + 8192, tr.mr->rkey);
			ok(rc == 0 && !memcmp(g.p + 8192, h, 4096),
			   "RDMA WRITE through that MR lands (status %d)", rc);
			ok(ibv_dereg_mr(tr.mr) == 0, "ibv_dereg_mr of the thread's MR");
		}
	}
	ok(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr of the GPU MR");
	peer_stats(pm_name, &s1);
	ok(core_all_released(&s1) && s1.alloc_mrs == 3 && s1.free_callbacks == 0,
	   "core counters balanced after deregistration");
	ok(pm_idle() && pm("registrations_released") == 3 && pm("objects_freed") == 3,
	   "peermem: nothing registered, pinned or mapped; both objects freed");
	ok(gs("live_pins") == 0 && gs("live_allocs") == 1, "gpusim: no pin left, the allocation stays");
	ok(gmem_free(fd, &g) == 0 && gs("free_callbacks") == 0,
	   "freeing the unregistered memory calls no free callback");
	gmem_drop(&g);

	/*
	 * Whole-allocation contiguity. rxe's PCI device (QEMU's edu, bound by
	 * rxe_dma) has mlx5's 2 GiB maximum DMA segment, so peermem merges
	 * GPU pages whose bus addresses follow each other. Behind the IOMMU
	 * that depends on the IOVAs gpusim's per-page mappings got, not on
	 * physical contiguity (as for a real GPU's per-page mappings behind an
	 * IOMMU): between 1 and one entry per page, and the data must arrive
	 * right through however many there are. Exact run counts are checked
	 * by the KUnit suite peermem_client.
	 */
	gs_knob("contig_bytes", "0");
	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	u0 = pm("sg_entries_uncoalesced");
	co0 = pm("sg_entries_coalesced");
	fill(g.p, LEN, 0x7777);
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	co1 = pm("sg_entries_coalesced") - co0;
	ok(mr && pm("sg_entries_uncoalesced") - u0 == (long long)NPAGES &&
	   co1 >= 1 && co1 <= (long long)NPAGES,
	   "contig_bytes=0 (chunk %u KiB): %lu GPU pages in %lld entries (bus-contiguous runs merged)",
	   g.chunk / 1024, NPAGES, co1);
	rc = mr ? rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, LEN, (uintptr_t)g.p, mr->rkey) : -1;
	ok(rc == 0 && !memcmp(h, g.p, LEN), "RDMA READ of the physically contiguous MR (status %d)", rc);
	fill(h, LEN, 0x7878);
	rc = mr ? rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h, LEN, (uintptr_t)g.p, mr->rkey) : -1;
	ok(rc == 0 && !memcmp(h, g.p, LEN), "RDMA WRITE of the physically contiguous MR (status %d)", rc);
	/* A sub-range of it: GPU pages 1 to 10, the first and last entries trimmed by the core. */
	smr = ibv_reg_mr(c.pd, g.p + 100000, 600000, MR_ACCESS);
	rc = smr ? rdma_op(&c, IBV_WR_RDMA_READ, hmr, h + LEN, 600000, (uintptr_t)g.p + 100000, smr->rkey) : -1;
	co2 = pm("sg_entries_coalesced") - co0 - co1;
	ok(rc == 0 && !memcmp(h + LEN, g.p + 100000, 600000) && co2 >= 1 && co2 <= 10,
	   "a sub-range of contiguous memory: 10 GPU pages in %lld entries, trimmed at both ends, read right (status %d)",
	   co2, rc);
	if (smr)
		ibv_dereg_mr(smr);
	if (mr)
		ibv_dereg_mr(mr);
	gmem_free(fd, &g);
	gmem_drop(&g);

	/* 256 KiB contiguity: 4 physical runs. */
	gs_knob("contig_bytes", "262144");
	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	co0 = pm("sg_entries_coalesced");
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	co1 = pm("sg_entries_coalesced") - co0;
	ok(mr && co1 >= 1 && co1 <= (long long)NPAGES,
	   "contig_bytes=256 KiB: %lld entries for %lu GPU pages in 4 physical runs", co1, NPAGES);
	fill(h, LEN, 0x2525);
	rc = mr ? rdma_op(&c, IBV_WR_RDMA_WRITE, hmr, h, LEN, (uintptr_t)g.p, mr->rkey) : -1;
	ok(rc == 0 && !memcmp(h, g.p, LEN), "RDMA WRITE across the 4 runs (status %d)", rc);
	if (mr)
		ibv_dereg_mr(mr);
	gs_knob("contig_bytes", "65536");

	/* Memory that is neither pinnable nor the GPU's: declined, nothing held. */
	{
		void *hole = mmap(NULL, LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		munmap(hole, LEN);
		d0 = pm("registrations_declined");
		mr = ibv_reg_mr(c.pd, hole, LEN, MR_ACCESS);
		rc = errno;
		ok(!mr && rc == EFAULT && pm("registrations_declined") == d0 + 1 && pm_idle() &&
		   gs("live_pins") == 0,
		   "ibv_reg_mr on unmapped memory: peermem declines it (nothing held), EFAULT (errno %d)", rc);
		if (mr)
			ibv_dereg_mr(mr);
	}

	/*
	 * Failure injection: nv_mem's pin in acquire fails. The core then asks
	 * the next client, nv_mem_nc, which pins persistently (as with
	 * nvidia-peermem's two clients): the MR works, but is not revoked when
	 * the memory is freed. With its pin failing too, ibv_reg_mr fails.
	 */
	d0 = pm("registrations_declined");
	e0 = pm("errors");
	{
		long long nca0 = pm_nc("registrations_acquired");

		gs_knob("fail/get_pages", "1");
		mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
		rc = mr ? 0 : errno;
		ok(mr && pm("registrations_declined") == d0 + 1 && pm("errors") == e0 + 1 &&
		   pm_nc("registrations_acquired") == nca0 + 1 && gs("live_persistent_pins") == 1,
		   "fail/get_pages: nv_mem declines (counted, an error), nv_mem_nc takes the MR with a persistent pin (%s)",
		   mr ? "ok" : strerror(rc));
		rc = mr ? rdma_op(&c, IBV_WR_RDMA_READ, hmr, h, LEN, (uintptr_t)g.p, mr->rkey) : -1;
		ok(rc == 0 && !memcmp(h, g.p, LEN), "fail/get_pages: RDMA READ through nv_mem_nc's MR (status %d)", rc);
		if (mr)
			ibv_dereg_mr(mr);
		ok(pm_idle() && gs("live_pins") == 0, "fail/get_pages: deregistered, nothing pinned");
	}
	d0 = pm("registrations_declined");
	gs_knob("fail/get_pages", "1");
	gs_knob("fail/get_pages_persistent", "1");
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	rc = errno;
	ok(!mr && rc == EFAULT && pm("registrations_declined") == d0 + 1 && pm_nc("registrations_declined") >= 1,
	   "fail/get_pages and fail/get_pages_persistent: ibv_reg_mr fails cleanly (errno %d: %s), declined by both clients",
	   rc, strerror(rc));
	ok(pm_idle() && gs("live_pins") == 0, "fail/get_pages: nothing pinned or left over");
	if (mr)
		ibv_dereg_mr(mr);

	/* nvidia_p2p_dma_map_pages fails: the registration fails with its errno, nothing held. */
	e0 = pm("errors");
	gs_knob("fail/dma_map_pages", "1");
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	rc = errno;
	ok(!mr && rc == ENOMEM && read_ll(GSDBG "fail/dma_map_pages") == 0 && pm("errors") == e0 + 1,
	   "fail/dma_map_pages: ibv_reg_mr fails with the driver's errno, gpusim's fail_errno ENOMEM (errno %d: %s)",
	   rc, strerror(rc));
	ok(wait_for(pm_idle, 5) && gs("live_pins") == 0 && gs("live_dma_mappings") == 0,
	   "fail/dma_map_pages: nothing pinned or mapped left over");
	if (mr)
		ibv_dereg_mr(mr);
	gs_knob("fail/dma_map_pages", "0");

	/* put_pages refused: the pin stays with the driver until the memory is freed. */
	pins0 = pm("page_tables_pinned");
	mr = ibv_reg_mr(c.pd, g.p, LEN, MR_ACCESS);
	gs_knob("fail/put_pages", "1");
	/* With the watch-pin cache the watch pin is put by the flush. */
	ok(mr && ibv_dereg_mr(mr) == 0 && (pm_flush(), 1), "fail/put_pages: ibv_dereg_mr still succeeds");
	ok(pm_live_regs() == 0 && pm_live_pins() == 0 && pm_live_objects() == 1 && gs("live_pins") == 1,
	   "fail/put_pages: the registration is gone, the GPU driver keeps the refused pin (objects %lld, gpusim pins %lld)",
	   pm_live_objects(), gs("live_pins"));
	e0 = pm("free_callbacks");
	ok(gmem_free(fd, &g) == 0 && pm("free_callbacks") == e0 + 1 && pm_idle() && gs("live_pins") == 0,
	   "fail/put_pages: freeing the memory calls the callback, which lets go of the object");
	ok(pm("page_tables_pinned") == pins0 + 1 && !dmesg_has("peermem: BUG|free callback for a page table peermem no longer holds"),
	   "fail/put_pages: no complaint about the late callback");
	gmem_drop(&g);

	ibv_dereg_mr(hmr);
	conn_close(&c);
	close(fd);
	ok(wait_for(all_idle, 10), "peermem and gpusim idle at the end");
	if (!all_idle()) {
		pm_diag();
		gs_diag();
	}
	peer_stats(pm_name, &s1);
	ok(core_all_released(&s1), "core counters balanced at the end");

	rc = run("rmmod peermem");
	snprintf(buf, sizeof(buf), "/sys/kernel/debug/peer_memory/%s", pm_name);
	ok(rc == 0 && access(buf, F_OK) != 0 && access("/sys/kernel/debug/peermem", F_OK) != 0,
	   "rmmod peermem unregisters it from the core");
	ok(!dmesg_has("peermem: BUG"), "peermem reported no internal error");
	return finish();
}
