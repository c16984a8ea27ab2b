// SPDX-License-Identifier: GPL-2.0
/*
 * peermem's non-invalidating client (nv_mem_nc, persistent pins) with the
 * umems a driver gets with ib_umem_get_peer(..., 0), as mlx5 gets its
 * CQ/QP/SRQ buffers and its 4 KiB doorbell page: the core asks only
 * non-invalidating clients for them. The rig core's umem_test hook gets
 * such a umem of this process's range on rxe0 and reads it back through
 * the bus addresses the client mapped (translated by the IOMMU of rxe's
 * PCI device, as the device's DMA would be).
 *
 * Checked: a queue umem on GPU memory is served by nv_mem_nc, never
 * nv_mem, mapped for the PCI device (nvidia_p2p_dma_map_pages) with every
 * bus address translating, and the device sees the bytes the CPU wrote;
 * a 4 KiB range inside a 64 KiB GPU page (and one straddling two) works,
 * the core trimming the client's 64 KiB pages; close unpins and unmaps;
 * an MR umem goes to nv_mem and is invalidated when its GPU memory is
 * freed; each client's counters move only for its own umems; a GPU free
 * under a persistent pin calls no free callback and the memory stays
 * until the umem is released (docs/gpusim.md, as the 550 driver keeps
 * persistently pinned memory); process exit with the file open releases
 * the umem in both orders of teardown; host memory is pinned normally and
 * unmapped memory fails with EFAULT; enable_nc=0 makes a queue umem on GPU
 * memory fail with EFAULT and leaves nv_mem working, enable_invalidate=0
 * leaves nv_mem_nc serving both kinds.
 */
#include <dirent.h>

#include "peermem_test.h"

#define LEN (256 * 1024UL)	/* 4 GPU pages */
#define NPAGES (LEN / GPU_PAGE)

static int fd;			/* /dev/gpusim */

/* ---- every counter of one client, to show that nothing of it moved ---- */

#define MAXC 64

struct cset {
	int n;
	char name[MAXC][48];
	long long v[MAXC];
};

static void cset_take(const char *dir, struct cset *c)
{
	struct dirent *e;
	DIR *d = opendir(dir);

	c->n = 0;
	if (!d)
		return;
	while ((e = readdir(d)) && c->n < MAXC) {
		if (e->d_type != DT_REG || !strncmp(e->d_name, "inject_", 7))
			continue;
		snprintf(c->name[c->n], sizeof(c->name[0]), "%.47s", e->d_name);
		c->v[c->n] = pmc(dir, e->d_name);
		c->n++;
	}
	closedir(d);
}

/* The first counter that differs (or "none read"), NULL if all are equal. */
static const char *cset_moved(const struct cset *a, const struct cset *b)
{
	if (a->n == 0 || a->n != b->n)
		return "(counters unreadable)";
	for (int i = 0; i < a->n; i++)
		if (strcmp(a->name[i], b->name[i]) || a->v[i] != b->v[i])
			return a->name[i];
	return NULL;
}

/* ---- helpers ---- */

static uint64_t cpu_u64(const void *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static void cpu_set_u64(void *p, uint64_t v)
{
	memcpy(p, &v, sizeof(v));
}

/* nv_mem_nc holds nothing, and gpusim has no pin or DMA mapping. */
static int nc_idle(void)
{
	return pmc_idle(PMDBG_NC) && gs("live_pins") == 0 && gs("live_dma_mappings") == 0;
}

/* Neither client holds anything, and gpusim has no pin or DMA mapping. */
static int settled(void)
{
	return pm_idle() && gs("live_pins") == 0 && gs("live_dma_mappings") == 0;
}

/* A umem of kind on [p, p + len) in a new file: the file, or -errno. */
static int umem_new(const void *p, size_t len, const char *kind)
{
	int f = umem_open(), rc;

	if (f < 0)
		return f;
	rc = umem_get(f, RXE_DEV, p, len, kind);
	if (rc) {
		close(f);
		return rc;
	}
	return f;
}

static int core_balanced(const char *client)
{
	struct peer_stats s;

	return peer_stats(client, &s) == 0 && core_all_released(&s);
}

/* ---- 1. a queue umem on GPU memory ---- */

static void test_queue(void)
{
	struct cset mem0, mem1;
	struct peer_stats nc0, nc1;
	struct umem_info u;
	struct gmem g;
	long long acq0, pins0, pages0, maps0, unmaps0, gmap0, gunmap0, gpers0;
	uint64_t v;
	int f, f2;

	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	fill(g.p, LEN, 0xc0de);
	cset_take(PMDBG, &mem0);
	peer_stats(pm_nc_name, &nc0);
	acq0 = pm_nc("registrations_acquired");
	pins0 = pm_nc("page_tables_pinned");
	pages0 = pm_nc("pages_pinned");
	maps0 = pm_nc("dma_maps");
	unmaps0 = pm_nc("dma_unmaps");
	gmap0 = gs("calls/dma_map_pages");
	gunmap0 = gs("calls/dma_unmap_pages");
	gpers0 = gs("calls/get_pages_persistent");

	f = umem_new(g.p, LEN, "queue");
	ok(f >= 0, "queue umem on 256 KiB of GPU memory (flags 0, as a CQ/QP buffer) succeeds (%s)",
	   f >= 0 ? "ok" : strerror(-f));
	if (f < 0)
		bail("the queue umem failed; nothing else of the nc client can work");
	if (umem_read(f, &u))
		bail("cannot read the umem_test hook");
	umem_diag("queue umem", &u);
	ok(!strcmp(u.client, pm_nc_name) && !strcmp(u.kind, "queue"),
	   "served by %s (got %s)", pm_nc_name, u.client);
	ok(u.page_size == (long long)GPU_PAGE && u.dma_bytes == (long long)LEN &&
	   u.nents >= 1 && u.nents <= (long long)NPAGES,
	   "client page size 64 KiB, %lld DMA bytes in %lld entries", u.dma_bytes, u.nents);
	ok(u.translated == u.dma_bytes,
	   "every bus address in the table translates through the device's IOMMU (%lld of %lld bytes)",
	   u.translated, u.dma_bytes);
	ok(u.first_ok && u.first == cpu_u64(g.p),
	   "the device reads through the bus address the bytes the CPU wrote (%016llx, CPU %016llx)",
	   (unsigned long long)u.first, (unsigned long long)cpu_u64(g.p));
	v = 0x0123456789abcdefULL;
	cpu_set_u64(g.p, v);
	umem_read(f, &u);
	ok(u.first_ok && u.first == v, "a CPU write after the registration is what the device reads (%016llx)",
	   (unsigned long long)u.first);
	ok(pm_nc("registrations_acquired") == acq0 + 1 && pm_nc("page_tables_pinned") == pins0 + 1 &&
	   pm_nc("pages_pinned") == pages0 + (long long)NPAGES && pm_nc("dma_maps") == maps0 + 1 &&
	   pmc_live_regs(PMDBG_NC) == 1 && pmc_live_maps(PMDBG_NC) == 1,
	   "nc counters: one registration, one pin of %lu pages, one mapping", NPAGES);
	ok(gs("calls/get_pages_persistent") == gpers0 + 1 && gs("live_persistent_pins") == 1 &&
	   gs("calls/dma_map_pages") == gmap0 + 1 && gs("live_dma_mappings") == 1,
	   "gpusim: one persistent pin (nvidia_p2p_get_pages_persistent), one nvidia_p2p_dma_map_pages for the PCI device");
	cset_take(PMDBG, &mem1);
	{
		const char *moved = cset_moved(&mem0, &mem1);

		ok(!moved, "nv_mem was never asked: none of its counters moved (%s)", moved ? moved : "none");
	}
	peer_stats(pm_nc_name, &nc1);
	ok(nc1.alloc_mrs == nc0.alloc_mrs + 1, "the core counts the umem for %s (%lld)", pm_nc_name,
	   nc1.alloc_mrs - nc0.alloc_mrs);
	f2 = umem_get(f, RXE_DEV, g.p, LEN, "queue");
	ok(f2 == -EBUSY, "a second umem on the same file: EBUSY (%d)", f2);

	close(f);
	ok(wait_for(nc_idle, 10) && pm_nc("dma_unmaps") == unmaps0 + 1 &&
	   gs("calls/dma_unmap_pages") == gunmap0 + 1 && gs("live_persistent_pins") == 0,
	   "close releases it: unmapped (nvidia_p2p_dma_unmap_pages), unpinned, nothing left in nv_mem_nc or gpusim");
	ok(core_balanced(pm_nc_name), "core counters of %s balanced", pm_nc_name);
	ok(gmem_free(fd, &g) == 0 && gs("live_allocs") == 0, "the GPU memory frees normally afterwards");
	gmem_drop(&g);
}

/* ---- 2. a doorbell page: 4 KiB inside one 64 KiB GPU page ---- */

static void test_doorbell(void)
{
	struct umem_info u;
	struct gmem g;
	long long pages0, bytes0;
	uint8_t *db;
	int f;

	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	fill(g.p, LEN, 0xd00b);
	db = g.p + 2 * GPU_PAGE + 0x3000;
	cpu_set_u64(db, 0xfeedface00c0ffeeULL);
	pages0 = pm_nc("pages_pinned");
	bytes0 = pm_nc("bytes_pinned");
	f = umem_new(db, 4096, "queue");
	ok(f >= 0, "queue umem of 4 KiB at offset 0x3000 of the third GPU page succeeds (%s)",
	   f >= 0 ? "ok" : strerror(-f));
	if (f >= 0) {
		umem_read(f, &u);
		umem_diag("doorbell", &u);
		ok(!strcmp(u.client, pm_nc_name) && u.page_size == (long long)GPU_PAGE &&
		   u.nents == 1 && u.dma_bytes == 4096 && u.translated == 4096,
		   "served by %s with 64 KiB pages, trimmed by the core to one entry of 4096 bytes (%s, %lld entries, %lld bytes)",
		   pm_nc_name, u.client, u.nents, u.dma_bytes);
		ok(pm_nc("pages_pinned") == pages0 + 1 && pm_nc("bytes_pinned") == bytes0 + (long long)GPU_PAGE,
		   "the one 64 KiB GPU page around it is pinned");
		ok(u.first_ok && u.first == cpu_u64(db),
		   "the device reads the doorbell's bytes at its bus address (%016llx)", (unsigned long long)u.first);
		cpu_set_u64(db, 0x1111222233334444ULL);
		umem_read(f, &u);
		ok(u.first_ok && u.first == 0x1111222233334444ULL,
		   "and what the CPU writes to it later (%016llx)", (unsigned long long)u.first);
		close(f);
	}
	ok(wait_for(nc_idle, 10), "closing it releases the pin and the mapping");

	/* 4 KiB straddling the boundary of two GPU pages: two pages, 8 KiB of 4 KiB pages. */
	db = g.p + GPU_PAGE - 2048;
	cpu_set_u64(db, 0xabad1deaabad1deaULL);
	pages0 = pm_nc("pages_pinned");
	f = umem_new(db, 4096, "queue");
	ok(f >= 0, "queue umem of 4 KiB straddling two GPU pages succeeds (%s)", f >= 0 ? "ok" : strerror(-f));
	if (f >= 0) {
		umem_read(f, &u);
		umem_diag("straddling", &u);
		ok(pm_nc("pages_pinned") == pages0 + 2 && u.dma_bytes == 8192 && u.translated == 8192 &&
		   u.nents >= 1 && u.nents <= 2,
		   "both GPU pages pinned, the core keeps the two 4 KiB pages around it (%lld bytes, %lld entries)",
		   u.dma_bytes, u.nents);
		ok(u.first_ok && u.first == cpu_u64(db), "the device reads its first bytes (%016llx)",
		   (unsigned long long)u.first);
		close(f);
	}
	ok(wait_for(nc_idle, 10), "released on close");
	gmem_free(fd, &g);
	gmem_drop(&g);
}

/* ---- 3. MRs go to nv_mem: the nc client's counters do not move ---- */

static void test_mr_is_not_nc(void)
{
	struct cset nc0, nc1;
	struct umem_info u;
	struct gmem g;
	long long acq0, cb0, inv0;
	const char *moved;
	int f;

	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	fill(g.p, LEN, 0x3e3e);
	cset_take(PMDBG_NC, &nc0);
	acq0 = pm("registrations_acquired");
	cb0 = pm("free_callbacks");
	inv0 = pm("invalidations_gpu_free");
	f = umem_new(g.p, LEN, "mr");
	ok(f >= 0, "an MR umem (IB_PEER_MEM_INVAL_SUPP) on GPU memory succeeds (%s)",
	   f >= 0 ? "ok" : strerror(-f));
	if (f < 0) {
		gmem_free(fd, &g);
		gmem_drop(&g);
		return;
	}
	umem_read(f, &u);
	umem_diag("mr umem", &u);
	ok(!strcmp(u.client, "nv_mem") || !strcmp(u.client, pm_name),
	   "served by the invalidating client %s, asked first (got %s)", pm_name, u.client);
	ok(pm("registrations_acquired") == acq0 + 1 && u.translated == u.dma_bytes &&
	   u.dma_bytes == (long long)LEN && u.first_ok && u.first == cpu_u64(g.p),
	   "nv_mem pinned and mapped it for the PCI device: the device reads the CPU's bytes (%016llx)",
	   (unsigned long long)u.first);
	cset_take(PMDBG_NC, &nc1);
	moved = cset_moved(&nc0, &nc1);
	ok(!moved, "none of nv_mem_nc's counters moved (%s)", moved ? moved : "none");

	/* The free callback with a live mapping: the core invalidates the umem. */
	ok(gmem_free(fd, &g) == 0 && pm("free_callbacks") == cb0 + 1,
	   "GPUSIM_IOC_FREE: nv_mem's free callback runs");
	/* The revocation it queued: the core's invalidate, the unmap, the keeper's put. */
	ok(wait_for(pm_no_keepers, 20) && pm("invalidations_gpu_free") == inv0 + 1,
	   "nv_mem's revocation, queued by the callback, invalidated it through the core (invalidations_gpu_free %+lld)",
	   pm("invalidations_gpu_free") - inv0);
	umem_read(f, &u);
	ok(u.invalidated == 1 && pmc_live_maps(PMDBG) == 0 && gs("live_dma_mappings") == 0,
	   "the umem's invalidation notifier ran, the DMA mapping is gone (invalidated=%d)", u.invalidated);
	close(f);
	gmem_drop(&g);
	ok(wait_for(all_idle, 10), "closing it releases the rest");
	cset_take(PMDBG_NC, &nc1);
	moved = cset_moved(&nc0, &nc1);
	ok(!moved, "nv_mem_nc's counters still did not move (%s)", moved ? moved : "none");
}

/* ---- 4. GPU free under a persistent pin ---- */

static void test_free_under_pin(void)
{
	struct umem_info u;
	struct gmem g;
	long long cb0, gcb0;
	uint64_t v;
	int f;

	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	fill(g.p, LEN, 0xf7ee);
	v = cpu_u64(g.p);
	f = umem_new(g.p, LEN, "queue");
	if (f < 0)
		bail("queue umem for the free test: %s", strerror(-f));
	cb0 = pm_nc("free_callbacks") + pm("free_callbacks");
	gcb0 = gs("free_callbacks");
	ok(gmem_free(fd, &g) == 0, "GPUSIM_IOC_FREE of GPU memory a queue umem pins persistently succeeds");
	umem_read(f, &u);
	ok(gs("free_callbacks") == gcb0 && pm_nc("free_callbacks") + pm("free_callbacks") == cb0 &&
	   u.invalidated == 0,
	   "no free callback for a persistent pin, nothing invalidated");
	ok(gs("live_allocs") == 0 && gs("live_persistent_pins") == 1 && gs("live_mem_bytes") >= (long long)LEN &&
	   pmc_live_pins(PMDBG_NC) == 1,
	   "the allocation is gone but its memory stays while the pin holds it (gpusim live_mem_bytes %lld)",
	   gs("live_mem_bytes"));
	ok(u.first_ok && u.first == v && u.translated == u.dma_bytes,
	   "the device still reads the old bytes through the bus address (%016llx)", (unsigned long long)u.first);
	gmem_drop(&g);
	umem_read(f, &u);
	ok(u.first_ok && u.first == v && gs("live_vmas") == 0 && gs("live_mem_bytes") == (long long)LEN,
	   "after munmap too: only the pin holds the memory, the device reads it (%016llx)",
	   (unsigned long long)u.first);
	close(f);
	ok(wait_for(all_idle, 10), "releasing the umem unpins it and the memory goes back (gpusim idle)");
	if (!all_idle()) {
		pm_diag();
		gs_diag();
	}
}

/* ---- 5. process exit with the umem file open ---- */

/* Child: allocate, get a queue umem, check its client, exit holding both. */
static int exit_child_nc(int umem_first)
{
	struct umem_info u;
	struct gmem g;
	int f = -1, gfd;

	if (umem_first)
		f = umem_open();
	gfd = open("/dev/gpusim", O_RDWR);
	if (gfd < 0 || gmem_alloc(gfd, LEN, &g))
		return 21;
	fill(g.p, LEN, 0xe1e1);
	if (!umem_first)
		f = umem_open();
	if (f < 0 || umem_get(f, RXE_DEV, g.p, LEN, "queue"))
		return 22;
	if (umem_read(f, &u) || strcmp(u.client, pm_nc_name) || !u.first_ok || u.first != cpu_u64(g.p))
		return 23;
	return 0;
}

static void test_exit(void)
{
	for (int i = 0; i < 2; i++) {
		const char *first = i ? "umem_test" : "/dev/gpusim";
		long long acq0 = pm_nc("registrations_acquired"), rel0 = pm_nc("registrations_released");
		int st = -1;
		pid_t pid;

		fflush(stdout);
		pid = fork();
		if (pid == 0)
			_exit(exit_child_nc(i));
		if (pid < 0 || waitpid(pid, &st, 0) != pid)
			st = -1;
		st = st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		ok(st == 0, "exit (%s opened first): a child gets a queue umem on its GPU memory and exits holding it (status %d)",
		   first, st);
		ok(wait_for(all_idle, 30) && pm_nc("registrations_acquired") == acq0 + 1 &&
		   pm_nc("registrations_released") == rel0 + 1,
		   "exit (%s opened first): the umem is released, the pin and the memory are gone", first);
		if (!all_idle()) {
			pm_diag();
			gs_diag();
		}
	}
	ok(core_balanced(pm_nc_name), "core counters of %s balanced after the exits", pm_nc_name);
}

/* ---- 6. host memory and unmapped memory ---- */

static void test_not_gpu(void)
{
	long long ncd0, memd0, ncacq0;
	struct umem_info u;
	uint8_t *hbuf;
	void *hole;
	int f;

	hbuf = aligned_alloc(4096, LEN);
	if (!hbuf)
		bail("out of memory");
	memset(hbuf, 0x5a, LEN);
	ncd0 = pm_nc("registrations_declined");
	ncacq0 = pm_nc("registrations_acquired");
	f = umem_new(hbuf, LEN, "queue");
	ok(f >= 0, "queue umem on host memory succeeds (%s)", f >= 0 ? "ok" : strerror(-f));
	if (f >= 0) {
		umem_read(f, &u);
		ok(!strcmp(u.client, "pinned") && pm_nc("registrations_declined") == ncd0 &&
		   pm_nc("registrations_acquired") == ncacq0,
		   "host memory is pinned by the core itself, no peer client is asked (client=%s)", u.client);
		close(f);
	}
	free(hbuf);

	hole = mmap(NULL, LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(hole, LEN);
	memd0 = pm("registrations_declined");
	f = umem_new(hole, LEN, "queue");
	ok(f == -EFAULT && pm_nc("registrations_declined") == ncd0 + 1 && pm("registrations_declined") == memd0,
	   "queue umem on unmapped memory: EFAULT, declined by nv_mem_nc, nv_mem not asked (%s)",
	   f >= 0 ? "succeeded" : strerror(-f));
	if (f >= 0)
		close(f);
	ok(wait_for(all_idle, 10), "nothing held");
}

/* ---- 7. each client turned off ---- */

static void test_params(void)
{
	struct umem_info u;
	struct gmem g;
	long long d0;
	int f, f2;

	load_modules("enable_nc=0");
	ok(pm_nc_name[0] == 0 && !strcmp(pm_name, "nv_mem") &&
	   access("/sys/kernel/debug/peer_memory/nv_mem_nc", F_OK) != 0 &&
	   access("/sys/kernel/debug/peer_memory/nv_mem", F_OK) == 0,
	   "enable_nc=0: only nv_mem is registered with the core");
	if (gmem_alloc(fd, LEN, &g))
		bail("GPUSIM_IOC_ALLOC: %s", strerror(errno));
	fill(g.p, LEN, 0x0ff0);
	d0 = pm("registrations_declined");
	f = umem_new(g.p, LEN, "queue");
	ok(f == -EFAULT && pm("registrations_declined") == d0 && pm_idle() && gs("live_pins") == 0,
	   "enable_nc=0: a queue umem on GPU memory fails with EFAULT (nobody may serve it; nv_mem is not asked) (%s)",
	   f >= 0 ? "succeeded" : strerror(-f));
	if (f >= 0)
		close(f);
	f = umem_new(g.p, LEN, "mr");
	ok(f >= 0, "enable_nc=0: an MR umem still works (%s)", f >= 0 ? "ok" : strerror(-f));
	if (f >= 0) {
		umem_read(f, &u);
		ok(!strcmp(u.client, "nv_mem") && u.first_ok && u.first == cpu_u64(g.p),
		   "enable_nc=0: served by nv_mem, the device reads the right bytes (client=%s)", u.client);
		close(f);
	}
	ok(wait_for(settled, 10), "enable_nc=0: released");

	load_modules("enable_invalidate=0");
	ok(!strcmp(pm_nc_name, "nv_mem_nc") && access("/sys/kernel/debug/peer_memory/nv_mem", F_OK) != 0 &&
	   access("/sys/kernel/debug/peer_memory/nv_mem_nc", F_OK) == 0,
	   "enable_invalidate=0: only nv_mem_nc is registered with the core");
	f = umem_new(g.p, LEN, "queue");
	f2 = umem_new(g.p + GPU_PAGE, GPU_PAGE, "mr");
	ok(f >= 0 && f2 >= 0, "enable_invalidate=0: a queue and an MR umem on GPU memory succeed (%s, %s)",
	   f >= 0 ? "ok" : strerror(-f), f2 >= 0 ? "ok" : strerror(-f2));
	if (f >= 0) {
		umem_read(f, &u);
		ok(!strcmp(u.client, "nv_mem_nc") && u.first_ok && u.first == cpu_u64(g.p),
		   "enable_invalidate=0: the queue umem is nv_mem_nc's, the device reads the right bytes");
	}
	if (f2 >= 0) {
		umem_read(f2, &u);
		ok(!strcmp(u.client, "nv_mem_nc") && u.first_ok && u.first == cpu_u64(g.p + GPU_PAGE),
		   "enable_invalidate=0: the MR umem goes to nv_mem_nc too (client=%s)", u.client);
	}
	ok(gs("live_persistent_pins") == (f >= 0) + (f2 >= 0) && pmc_live_regs(PMDBG_NC) == (f >= 0) + (f2 >= 0),
	   "enable_invalidate=0: both pinned persistently");
	if (f >= 0)
		close(f);
	if (f2 >= 0)
		close(f2);
	ok(wait_for(nc_idle, 10), "enable_invalidate=0: released on close");
	gmem_free(fd, &g);
	gmem_drop(&g);
	load_modules(NULL);
}

int main(void)
{
	char path[160], flags[80];

	rxe_up();
	load_modules(NULL);
	ok(!strcmp(pm_name, "nv_mem") && !strcmp(pm_nc_name, "nv_mem_nc"),
	   "peermem loaded: clients %s and %s", pm_name, pm_nc_name);
	snprintf(path, sizeof(path), "/sys/kernel/debug/peer_memory/%s/flags", pm_nc_name);
	read_line(path, flags, sizeof(flags));
	ok(!strcmp(flags, "invalidate=0 invalidate_unmaps=0"),
	   "the core sees %s as a non-invalidating client (%s)", pm_nc_name, flags);
	snprintf(path, sizeof(path), "/sys/kernel/debug/peer_memory/%s/flags", pm_name);
	read_line(path, flags, sizeof(flags));
	ok(!strcmp(flags, "invalidate=1 invalidate_unmaps=1"),
	   "and %s as an invalidating one with PEER_MEM_INVALIDATE_UNMAPS (%s)", pm_name, flags);
	ok(pm_idle() && pm_nc("registrations_acquired") == 0 && pm_nc("errors") == 0,
	   "nv_mem_nc's counters (debugfs peermem/nc/) start at zero");
	if (access(UMEM_TEST, F_OK) != 0)
		bail("%s is missing: the rig kernel's core has no umem_test hook (rebuild it with scripts/kernel.sh)",
		     UMEM_TEST);
	fd = open("/dev/gpusim", O_RDWR);
	if (fd < 0)
		bail("cannot open /dev/gpusim: %s", strerror(errno));

	test_queue();
	test_doorbell();
	test_mr_is_not_nc();
	test_free_under_pin();
	test_exit();
	test_not_gpu();
	/* Before test_params reloads peermem, which starts new counters. */
	ok(pm_nc("errors") == 0 && pm("errors") == 0, "no client counted an error (nv_mem %lld, nv_mem_nc %lld)",
	   pm("errors"), pm_nc("errors"));
	test_params();

	close(fd);
	ok(wait_for(all_idle, 10), "peermem and gpusim idle at the end");
	if (!all_idle()) {
		pm_diag();
		gs_diag();
	}
	ok(pm_rmmod() == 0 && access("/sys/kernel/debug/peer_memory/nv_mem_nc", F_OK) != 0,
	   "rmmod peermem unregisters both clients");
	ok(!dmesg_has("peermem: BUG"), "peermem reported no internal error");
	return finish();
}
